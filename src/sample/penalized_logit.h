// The arithmetic of one penalized logit, in a header of its own (no library includes) so that
// the host (logits_processors.cpp) and the CUDA sampler (cuda_sampling.cu) compile the same
// formula and round alike.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define DI_HOST_DEVICE __host__ __device__
#else
#define DI_HOST_DEVICE
#endif

namespace deepinfer {

// The arithmetic of one penalized logit, shared by the host and the device so both round alike:
// the repetition penalty on every seen token, then frequency × count + presence on tokens the
// output holds (count > 0). Each operation rounded once (no fused multiply-add).
DI_HOST_DEVICE inline float penalized_logit(float x, float rep, float freq, float pres, int32_t count) {
#ifdef __CUDA_ARCH__
  if (rep != 1.0f) x = x > 0.0f ? __fdiv_rn(x, rep) : __fmul_rn(x, rep);
  if (count > 0) x = __fsub_rn(x, __fadd_rn(__fmul_rn(freq, static_cast<float>(count)), pres));
#else
  if (rep != 1.0f) x = x > 0.0f ? x / rep : x * rep;
  if (count > 0) x -= freq * static_cast<float>(count) + pres;  // di_sample: -ffp-contract=off
#endif
  return x;
}

}  // namespace deepinfer

// The MoE router's fp32 GEMM (C [M, E] = X [M, K] · Wᵀ, fp32 operands and output) at the models'
// shapes: cuBLAS's SGEMM (what the default mode runs, CUBLAS_COMPUTE_32F_PEDANTIC) against
// cuda::router_gemm on split bf16 operands, with one image part (the checkpoints' bf16-valued
// routers) and three (fp32 weights). One JSON line per (shape, rows, kernel) on stdout: µs, and
// X's bytes per second against the device-to-device copy rate measured in the same run (X is
// what must come from memory; W is 0.5–7 MB and stays in L2). X rotates through enough copies to
// exceed twice the L2, so each launch reads it from HBM (in the model X was just written by the
// norm and may be partly in L2: the figures are the conservative side).
// Timing as bench/fp8_gemm_bench (cuda_timing.h): CUDA graph replays, the median of --reps.
// Does not check results (RouterSplit*, RouterGemmCuda* do).
// Usage: router_gemm_bench [--shapes v2lite,v3] [--m 256,1024,4096,16384] [--reps 9]
#include <algorithm>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "backend/cuda/cuda_common.h"
#include "backend/cuda/router_split.h"
#include "cuda_timing.h"

using namespace deepinfer::cuda;
using namespace deepinfer::bench;  // Dev, upload, time_launches, copy_rate, l2_bytes, parse_list

namespace {

struct Shape {
  const char* name;
  int64_t E, K;  // experts (C's columns), hidden size
};
constexpr Shape kShapes[] = {{"v2lite", 64, 2048}, {"v2", 160, 5120}, {"v3", 256, 7168}};

void bench_shape(const Shape& sh, const std::vector<int64_t>& ms, int reps, double copy_bps, cublasHandle_t blas,
                 cudaStream_t s) {
  // W: bf16 values (one part) and fp32 values (three), both as fp32 for cuBLAS.
  std::vector<float> w1(static_cast<size_t>(sh.E * sh.K)), w3(w1.size());
  uint64_t st = 0x9E3779B97F4A7C15ull;
  for (size_t i = 0; i < w1.size(); ++i) {
    st = st * 6364136223846793005ull + 1442695040888963407ull;
    const float v = (static_cast<float>(static_cast<int64_t>(st >> 40) - (int64_t{1} << 23)) / 8388608.0f) * 0.05f;
    w3[i] = v;
    w1[i] = deepinfer::bf16_to_f32(deepinfer::f32_to_bf16(v));
  }
  std::vector<uint16_t> img1(static_cast<size_t>(router_image_elems(sh.E, sh.K, 1))),
      img3(static_cast<size_t>(router_image_elems(sh.E, sh.K, 3)));
  build_router_image(w1.data(), sh.E, sh.K, 1, img1.data());
  build_router_image(w3.data(), sh.E, sh.K, 3, img3.data());
  const Dev dw = upload(w1, s), di1 = upload(img1, s), di3 = upload(img3, s);
  for (const int64_t M : ms) {
    const int64_t x_bytes = M * sh.K * 4;
    const int copies = static_cast<int>(std::clamp<int64_t>((2 * l2_bytes() + x_bytes - 1) / x_bytes, 1, 64));
    Dev x(static_cast<size_t>(x_bytes * copies)), c(static_cast<size_t>(M * sh.E) * 4);
    fill_random(x.p, Elem::kF32, M * sh.K * copies, 5, true, 1.0f, 0.0f, s);
    auto xi = [&](int i) { return static_cast<const float*>(x.p) + static_cast<int64_t>(i % copies) * M * sh.K; };
    for (const char* kernel : {"cublas_sgemm", "split_1part", "split_3parts"}) {
      const std::string k = kernel;
      if (k != "cublas_sgemm" && !router_gemm_ok(xi(0), sh.K, sh.K)) continue;
      const double t = time_launches(
          [&](int i) {
            if (k == "cublas_sgemm")
              gemm_f32(blas, M, sh.E, sh.K, xi(i), sh.K, static_cast<const float*>(dw.p), sh.K, static_cast<float*>(c.p),
                       sh.E);
            else
              router_gemm(xi(i), sh.K, static_cast<const uint16_t*>(k == "split_1part" ? di1.p : di3.p),
                          k == "split_1part" ? 1 : 3, M, sh.E, sh.K, static_cast<float*>(c.p), sh.E, s);
          },
          reps, s);
      std::printf(
          "{\"bench\": \"router_gemm\", \"shape\": \"%s\", \"kernel\": \"%s\", \"M\": %ld, \"E\": %ld, \"K\": %ld, "
          "\"us\": %.2f, \"x_tb_per_s\": %.3f, \"frac_of_copy\": %.3f, \"tflops\": %.2f}\n",
          sh.name, kernel, static_cast<long>(M), static_cast<long>(sh.E), static_cast<long>(sh.K), t * 1e6,
          static_cast<double>(x_bytes) / t * 1e-12, static_cast<double>(x_bytes) / t / copy_bps,
          2.0 * static_cast<double>(M * sh.E * sh.K) / t * 1e-12);
      std::fflush(stdout);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"MoE router fp32 GEMM benchmark: cuBLAS SGEMM against the split-bf16 tensor-core kernel"};
  std::string shapes = "v2lite,v3", rows = "256,1024,4096,16384";
  int reps = 9;
  app.add_option("--shapes", shapes, "v2lite (64 × 2048), v2 (160 × 5120), v3 (256 × 7168); comma-separated");
  app.add_option("--m", rows, "rows (tokens), comma-separated");
  app.add_option("--reps", reps, "timed batches (median)")->check(CLI::Range(1, 1000));
  CLI11_PARSE(app, argc, argv);
  std::vector<const Shape*> picked;
  std::stringstream ss(shapes);
  for (std::string name; std::getline(ss, name, ',');) {
    const Shape* found = nullptr;
    for (const Shape& sh : kShapes)
      if (name == sh.name) found = &sh;
    if (found == nullptr) {
      std::fprintf(stderr, "router_gemm_bench: unknown shape '%s' (want v2lite, v2 or v3)\n", name.c_str());
      return 2;
    }
    picked.push_back(found);
  }
  const std::vector<int64_t> ms = parse_list(rows);
  for (const int64_t m : ms)
    if (m < 1 || m > (int64_t{1} << 20)) {
      std::fprintf(stderr, "router_gemm_bench: bad row count %ld (want 1 .. 2^20)\n", static_cast<long>(m));
      return 2;
    }

  const BenchStream bs;
  const double copy_bps = copy_rate(bs.s);
  std::printf("{\"bench\": \"copy\", \"tb_per_s\": %.3f}\n", copy_bps * 1e-12);
  for (const Shape* sh : picked) bench_shape(*sh, ms, reps, copy_bps, bs.blas, bs.s);
  return 0;
}

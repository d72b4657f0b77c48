#include "model/deepseek/deepseek_rope.h"

#include <algorithm>
#include <cmath>

namespace deepinfer {
namespace {

double get_mscale(double scale, double mscale) {
  if (scale <= 1.0) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

double correction_dim(double n_rotations, int64_t dim, double base, double max_positions) {
  return (static_cast<double>(dim) * std::log(max_positions / (n_rotations * 2.0 * M_PI))) / (2.0 * std::log(base));
}

}  // namespace

RopeParams make_rope_params(const DeepseekConfig& config) {
  const RopeConfig& rc = config.rope;
  const int64_t dim = config.qk_rope_head_dim;
  const int64_t half = dim / 2;
  RopeParams p;
  // transformers' V2 applies the complex (interleaved) form whatever the config says.
  p.interleave = config.family == DeepseekFamily::kV2 ? true : config.rope_interleave;
  p.inv_freq.resize(static_cast<size_t>(half));
  // pos_freqs[i] = base ** (2i / dim), an fp32 tensor in transformers.
  std::vector<float> pos_freqs(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(dim);
    pos_freqs[static_cast<size_t>(i)] = static_cast<float>(std::pow(rc.rope_theta, static_cast<double>(exponent)));
  }
  if (rc.rope_type == RopeType::kDefault) {
    for (int64_t i = 0; i < half; ++i) p.inv_freq[static_cast<size_t>(i)] = 1.0f / pos_freqs[static_cast<size_t>(i)];
    p.attention_factor = 1.0f;
    return p;
  }
  const double factor = rc.factor;
  double low = correction_dim(rc.beta_fast, dim, rc.rope_theta, static_cast<double>(rc.original_max_position_embeddings));
  double high = correction_dim(rc.beta_slow, dim, rc.rope_theta, static_cast<double>(rc.original_max_position_embeddings));
  if (rc.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // transformers: prevent a singular ramp
  const float ffactor = static_cast<float>(factor);
  for (int64_t i = 0; i < half; ++i) {
    const float pf = pos_freqs[static_cast<size_t>(i)];
    const float extrapolation = 1.0f / pf;
    const float interpolation = 1.0f / (ffactor * pf);
    float ramp = (static_cast<float>(i) - static_cast<float>(low)) / (static_cast<float>(high) - static_cast<float>(low));
    ramp = std::clamp(ramp, 0.0f, 1.0f);
    const float extrapolation_factor = 1.0f - ramp;
    p.inv_freq[static_cast<size_t>(i)] =
        interpolation * (1.0f - extrapolation_factor) + extrapolation * extrapolation_factor;
  }
  double af;
  if (rc.attention_factor) {
    af = *rc.attention_factor;
  } else if (rc.mscale != 0.0 && rc.mscale_all_dim != 0.0) {
    af = get_mscale(factor, rc.mscale) / get_mscale(factor, rc.mscale_all_dim);
  } else {
    af = get_mscale(factor, 1.0);
  }
  p.attention_factor = static_cast<float>(af);
  return p;
}

}  // namespace deepinfer

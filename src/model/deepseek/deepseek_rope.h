// RoPE parameters of a DeepSeek config (default or YaRN), computed exactly as transformers'
// `_compute_default_rope_parameters` / `_compute_yarn_parameters` do, in fp32 arithmetic.
#pragma once

#include "backend/op_params.h"
#include "model/deepseek/deepseek_config.h"

namespace deepinfer {

RopeParams make_rope_params(const DeepseekConfig& config);

}  // namespace deepinfer

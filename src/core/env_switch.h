// Lab switches and knobs read from the environment (the CUDA backend's DEEPINFER_CUDA_* variables):
// a well-formed value sets its setting, anything else leaves it as it was with a warning naming
// the variable and what it must be — a knob never stops a run. (The engine's own configuration,
// engine_config.cpp, rejects bad values instead: those change what a user gets, these only how
// fast.)
#pragma once

#include <cstdint>

namespace deepinfer {

// `flag` = (value == "1") where the variable `name` is "0" or "1"; returns whether it was set.
// Unset or empty: nothing, no warning.
bool read_env_switch(const char* name, bool& flag);

// `value` = the variable `name` as a decimal integer where it lies in [lo, hi] and is lo plus a
// multiple of `step` (≥ 1); returns whether it was set. Unset or empty: nothing, no warning.
bool read_env_int(const char* name, int64_t lo, int64_t hi, int64_t step, int64_t& value);

}  // namespace deepinfer

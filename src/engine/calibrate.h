// Chunk cost calibration: times real forward steps of the loaded model over a grid of new-token
// counts q and cached prefixes c, then fits ChunkCostModel (sched/cost_model.h). The engine
// loads the result (DEEPINFER_CHUNK_COST_MODEL) to size prefill chunks against
// DEEPINFER_STEP_TIME_BUDGET_MS. Run by `deepinfer calibrate`.
#pragma once

#include <vector>

#include "backend/backend.h"
#include "model/deepseek/deepseek_model.h"
#include "sched/cost_model.h"

namespace deepinfer {

struct CalibrationOptions {
  int64_t max_tokens = 2048;  // largest q + c measured (capped by the model's context)
  int repeats = 2;            // best of this many runs per point
};

Expected<ChunkCostModel> calibrate_chunk_cost(const DeepseekModel& model, Backend& backend,
                                              const CalibrationOptions& options, std::vector<CostSample>* samples);

}  // namespace deepinfer

// Batch invariance on the GPU (DEEPINFER_BATCH_INVARIANT=1: CudaBackend::set_batch_invariant +
// the mode's MLA policy): one request's logits, for every prompt position and every decode step,
// must be bitwise identical whether it runs alone with its whole prompt in one step, or its
// prompt is chunked, or it shares steps with 1–63 random neighbours (prefilling in random
// chunks or decoding), or its prompt prefix comes from another sequence's cached pages, or its
// decode steps replay from CUDA graphs, or (kByOrigin) its prompt and first outputs are
// recomputed in one step as after a preemption. No tolerance: memcmp of the fp32 rows.
// Both policies: kAbsorbed (every row absorbed) and kByOrigin (prompt rows on the naive form:
// CudaBackend::set_invariant_naive_mla). Models (random weights made on the GPU): a tiny V3
// (MoE, q_lora), and two layers of the V2-Lite shape (hidden 2048, 64 experts top-6, kv_lora
// 512) in bf16 and in FP8. Skipped without a GPU.
#include <gtest/gtest.h>

#include <fmt/core.h>

#include <cstring>
#include <fstream>
#include <random>

#include "kv/paged_kv_cache.h"
#ifdef DEEPINFER_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"  // set_invariant_naive_mla
#endif
#include "model/deepseek/deepseek_model.h"
#include "support/cuda_available.h"
#include "support/tiny_configs.h"

namespace deepinfer {
namespace {

constexpr int64_t kBlock = 16;

nlohmann::json v2_lite_two_layers(bool fp8) {
  std::ifstream f(std::string(DEEPINFER_SOURCE_DIR) + "/bench/configs/deepseek_v2_lite.json");
  nlohmann::json c = nlohmann::json::parse(f);
  c["num_hidden_layers"] = 2;  // one dense layer, one MoE layer
  if (fp8)
    c["quantization_config"] = {{"activation_scheme", "dynamic"}, {"fmt", "e4m3"}, {"quant_method", "fp8"},
                                {"weight_block_size", {128, 128}}};
  return c;
}

// A sequence fed to the model: `tokens` are its whole token list (prompt, then forced
// continuation); `fed` of them are in the cache.
struct Seq {
  std::vector<int32_t> tokens;
  KvSequence kv;
  int64_t fed = 0;
  int64_t prompt = 0;  // tokens fed in prefill chunks; after that, one per step
};

class Harness {
 public:
  Harness(Backend& backend, const DeepseekModel& model, int64_t n_blocks, MlaPolicy policy)
      : backend_(backend),
        model_(model),
        cache_(backend, model.kv_layers(), n_blocks, kBlock, backend.kv_dtype()),
        policy_(policy) {}

  PagedKvCache& cache() { return cache_; }

  // One step: sequence i feeds n[i] tokens. Returns the logits rows of seqs[0] (every new
  // token's row), [n[0], vocab] flattened. Graphs (when given) run decode-only steps. Tokens
  // past a sequence's prompt are generated ones; a chunk crossing the prompt's end becomes two
  // entries, as ModelRunner builds them.
  std::vector<float> step(std::vector<Seq*> seqs, const std::vector<int64_t>& n, DecodeGraphs* graphs = nullptr) {
    ForwardBatch batch;
    bool decode_only = true;
    std::vector<int32_t> last_row(seqs.size());  // each sequence's rows are contiguous
    for (size_t i = 0; i < seqs.size(); ++i) {
      Seq& s = *seqs[i];
      const int64_t need = s.kv.blocks_needed(n[i], kBlock);
      if (need > 0) {
        auto ids = cache_.pool().allocate(need);
        s.kv.block_ids.insert(s.kv.block_ids.end(), ids.begin(), ids.end());
      }
      const int64_t n_first = s.fed < s.prompt && s.fed + n[i] > s.prompt ? s.prompt - s.fed : n[i];
      const int32_t first = batch.add_sequence(s.kv, s.tokens.data() + s.fed, n_first, kBlock, s.fed >= s.prompt);
      if (n_first < n[i]) {
        KvSequence rest = s.kv;
        rest.n_tokens = s.prompt;
        batch.add_sequence(rest, s.tokens.data() + s.prompt, n[i] - n_first, kBlock, /*is_generated=*/true);
      }
      decode_only = decode_only && n[i] == 1;
      last_row[i] = first + static_cast<int32_t>(n[i]) - 1;
      if (i == 0) {
        for (int64_t j = 0; j < n[i]; ++j) batch.logits_rows.push_back(first + static_cast<int32_t>(j));
      }
    }
    for (size_t i = 1; i < seqs.size(); ++i)  // neighbours: their last row, as the engine asks
      batch.logits_rows.push_back(last_row[i]);
    if (decode_only && graphs != nullptr) {  // a graphable step lists one row per sequence in order
      batch.logits_rows.clear();
      for (size_t i = 0; i < seqs.size(); ++i) batch.logits_rows.push_back(static_cast<int32_t>(i));
    }
    const Tensor logits =
        backend_.to_host(model_.forward(backend_, batch, cache_, policy_, decode_only ? graphs : nullptr));
    for (size_t i = 0; i < seqs.size(); ++i) {
      seqs[i]->kv.n_tokens += n[i];
      seqs[i]->fed += n[i];
    }
    const int64_t vocab = model_.config().vocab_size;
    return std::vector<float>(logits.data<float>(), logits.data<float>() + n[0] * vocab);
  }

  void release(Seq& s, size_t keep_blocks = 0) {
    std::vector<int32_t> mine(s.kv.block_ids.begin() + static_cast<std::ptrdiff_t>(keep_blocks), s.kv.block_ids.end());
    cache_.pool().release(mine);
    s.kv = KvSequence{};
  }

 private:
  Backend& backend_;
  const DeepseekModel& model_;
  PagedKvCache cache_;
  MlaPolicy policy_;
};

std::vector<int32_t> random_tokens(std::mt19937& rng, int64_t n, int64_t vocab) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(2 + rng() % static_cast<uint32_t>(vocab - 2));
  return t;
}

// Compares the probe's rows with the reference, position by position; returns how many matched.
int64_t expect_bitwise(const std::vector<float>& ref, const std::vector<float>& got, int64_t vocab,
                       const std::string& what) {
  EXPECT_EQ(ref.size(), got.size()) << what;
  const int64_t rows = static_cast<int64_t>(std::min(ref.size(), got.size())) / vocab;
  for (int64_t r = 0; r < rows; ++r) {
    const float* a = ref.data() + r * vocab;
    const float* b = got.data() + r * vocab;
    if (std::memcmp(a, b, sizeof(float) * static_cast<size_t>(vocab)) != 0) {
      float worst = 0;
      for (int64_t v = 0; v < vocab; ++v) worst = std::max(worst, std::fabs(a[v] - b[v]));
      ADD_FAILURE() << what << ": position " << r << " differs (max |diff| " << worst << ")";
      return r;
    }
  }
  return rows;
}

void run_invariance(const std::string& name, const nlohmann::json& json, DType dtype, MlaPolicy policy) {
  auto backend_ptr = testing::try_cuda_backend();
  DI_REQUIRE_GPU(backend_ptr);
  Backend& backend = *backend_ptr;
  backend.set_batch_invariant(true);
  auto config = parse_deepseek_config(json);
  ASSERT_TRUE(config.has_value()) << config.status().to_string();
#ifdef DEEPINFER_HAVE_CUDA
  dynamic_cast<CudaBackend&>(backend).set_invariant_naive_mla(policy == MlaPolicy::kByOrigin);
#endif
  ASSERT_EQ(mla_policy_for(backend, *config, true), policy) << "the backend does not offer this policy";
  auto model = DeepseekModel::dummy(*config, backend, dtype, 99);
  const int64_t vocab = model->config().vocab_size;
  Harness h(backend, *model, 4096, policy);
  std::mt19937 rng(1234);

  // The probe: a 45-token prompt (not a multiple of the block) and 6 forced decode tokens.
  Seq probe_proto;
  probe_proto.tokens = random_tokens(rng, 51, vocab);
  probe_proto.prompt = 45;

  // Reference: alone, whole prompt in one step, then one token per step, eager.
  std::vector<float> ref;
  {
    Seq p = probe_proto;
    auto a = h.step({&p}, {p.prompt});
    ref.insert(ref.end(), a.begin(), a.end());
    while (p.fed < static_cast<int64_t>(p.tokens.size())) {
      auto b = h.step({&p}, {1});
      ref.insert(ref.end(), b.begin(), b.end());
    }
    h.release(p);
  }
  const int64_t n_rows = static_cast<int64_t>(probe_proto.tokens.size());
  ASSERT_EQ(static_cast<int64_t>(ref.size()), n_rows * vocab);

  // Runs the probe to the end next to `n_neighbours` random sequences; the probe's prompt goes
  // in chunks of up to `probe_chunk` tokens (0: whole), starting after `cached` tokens whose
  // pages `prefix` supplies; `recompute` > 0: its first step feeds the whole prompt and that many
  // generated tokens (a recompute after preemption).
  auto scenario = [&](int n_neighbours, int64_t probe_chunk, DecodeGraphs* graphs, const Seq* prefix,
                      int64_t cached, int64_t recompute) {
    Seq p = probe_proto;
    if (prefix != nullptr) {
      p.kv.block_ids.assign(prefix->kv.block_ids.begin(), prefix->kv.block_ids.begin() + cached / kBlock);
      p.kv.n_tokens = cached;
      p.fed = cached;
    }
    std::vector<Seq> nb(static_cast<size_t>(n_neighbours));
    for (auto& s : nb) {
      s.prompt = 1 + static_cast<int64_t>(rng() % 80);
      s.tokens = random_tokens(rng, s.prompt + 64, vocab);
      s.fed = 0;
    }
    // Some neighbours start mid-way: their prompt is already in the cache (prefilled alone);
    // with graphs all do, so the probe's decode steps are decode-only steps.
    for (auto& s : nb)
      if (graphs != nullptr || rng() % 2 == 0) (void)h.step({&s}, {s.prompt});
    std::vector<float> got(static_cast<size_t>(cached * vocab), 0.0f);
    while (p.fed < static_cast<int64_t>(p.tokens.size())) {
      std::vector<Seq*> seqs{&p};
      std::vector<int64_t> n;
      const int64_t left = p.prompt - p.fed;
      if (recompute > 0 && p.fed == 0) {
        n.push_back(p.prompt + recompute);
      } else if (left > 0) {
        n.push_back(probe_chunk > 0 ? std::min(left, 1 + static_cast<int64_t>(rng() % probe_chunk)) : left);
      } else {
        n.push_back(1);
      }
      for (auto& s : nb) {
        if (s.fed >= static_cast<int64_t>(s.tokens.size())) continue;
        const int64_t sl = s.prompt - s.fed;
        seqs.push_back(&s);
        n.push_back(sl > 0 ? std::min(sl, 1 + static_cast<int64_t>(rng() % 24)) : 1);
      }
      auto rows = h.step(seqs, n, graphs);
      got.insert(got.end(), rows.begin(), rows.end());
    }
    for (auto& s : nb) h.release(s);
    // Positions before `cached` came from the prefix: compare the rest.
    std::vector<float> ref_tail(ref.begin() + cached * vocab, ref.end());
    std::vector<float> got_tail(got.begin() + cached * vocab, got.end());
    const size_t keep = prefix != nullptr ? static_cast<size_t>(cached / kBlock) : 0;
    h.release(p, keep);
    return std::make_pair(ref_tail, got_tail);
  };

  auto check = [&](const std::string& what, int n_nb, int64_t chunk, DecodeGraphs* graphs = nullptr,
                   const Seq* prefix = nullptr, int64_t cached = 0, int64_t recompute = 0) {
    auto [r, g] = scenario(n_nb, chunk, graphs, prefix, cached, recompute);
    expect_bitwise(r, g, vocab, name + " " + what);
  };

  check("alone, chunked prompt", 0, 7);
  check("alone, prompt chunks of one token", 0, 1);
  check("recompute: prompt and 3 outputs in one step, alone", 0, 0, nullptr, nullptr, 0, 3);
  check("recompute: prompt and 4 outputs in one step, with 5 neighbours", 5, 0, nullptr, nullptr, 0, 4);
  for (int n_nb : {1, 4, 16, 63}) {
    check(fmt::format("with {} neighbours, whole prompt", n_nb), n_nb, 0);
    check(fmt::format("with {} neighbours, chunked prompt", n_nb), n_nb, 11);
  }
  {  // Prefix-cache hit: a donor sequence caches the probe's first 32 tokens (two pages).
    Seq donor = probe_proto;
    donor.tokens.resize(32);
    donor.prompt = 32;
    (void)h.step({&donor}, {32});
    check("prefix hit (32 cached tokens), alone", 0, 0, nullptr, &donor, 32);
    check("prefix hit (32 cached tokens), with 9 neighbours, chunked", 9, 5, nullptr, &donor, 32);
    h.release(donor);
  }
  {  // Decode steps from CUDA graphs (captured on a batch size's second decode-only step).
    DecodeGraphs graphs;
    check("CUDA graphs, 7 neighbours", 7, 0, &graphs);
    check("CUDA graphs again (replays), 7 neighbours", 7, 0, &graphs);
    int64_t replays = graphs.n_replays;
    std::printf("[invariance] %s: %lld decode steps replayed from graphs\n", name.c_str(),
                static_cast<long long>(replays));
    if (backend.supports_graphs()) {
      EXPECT_GT(replays, 0);
    }
  }
  EXPECT_EQ(h.cache().pool().n_free(), h.cache().pool().n_blocks());
}

TEST(CudaBatchInvariance, TinyV3Bf16) {
  run_invariance("tiny_v3", testing::tiny_v3_config(), DType::kBF16, MlaPolicy::kAbsorbed);
}
TEST(CudaBatchInvariance, V2LiteShapeBf16) {
  run_invariance("v2_lite_2l", v2_lite_two_layers(false), DType::kBF16, MlaPolicy::kAbsorbed);
}
TEST(CudaBatchInvariance, V2LiteShapeFp8) {
  run_invariance("v2_lite_2l_fp8", v2_lite_two_layers(true), DType::kF8E4M3, MlaPolicy::kAbsorbed);
}
// Prompt rows on the naive form (the kv_b decompression on invariant_gemm, the flash kernel).
TEST(CudaBatchInvariance, TinyV3Bf16ByOrigin) {
  run_invariance("tiny_v3 by origin", testing::tiny_v3_config(), DType::kBF16, MlaPolicy::kByOrigin);
}
TEST(CudaBatchInvariance, V2LiteShapeBf16ByOrigin) {
  run_invariance("v2_lite_2l by origin", v2_lite_two_layers(false), DType::kBF16, MlaPolicy::kByOrigin);
}
TEST(CudaBatchInvariance, V2LiteShapeFp8ByOrigin) {
  run_invariance("v2_lite_2l_fp8 by origin", v2_lite_two_layers(true), DType::kF8E4M3, MlaPolicy::kByOrigin);
}

}  // namespace
}  // namespace deepinfer

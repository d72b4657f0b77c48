// The MoE's counting sort (cuda::moe_sort) against a host stable sort: perm, inv, offsets, tiles
// and the active list, exactly — at sizes just past the one-block sort (R = 516), V2-Lite's
// prefill steps (64 routed + 2 shared experts, k = 6: 4,096 and 16,384 tokens, a whole number of
// chunks and 128 chunks), a V3-like step (256 + 1, k = 8), skewed routing (every token on the
// same 6 experts: long runs, most experts idle) and the expert limit (512 with the shared ones).
// Skipped without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#ifdef DEEPINFER_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_common.h"
#endif
#include "support/cuda_available.h"
#ifdef DEEPINFER_HAVE_CUDA
#include "support/cuda_buffer.h"
#endif

namespace deepinfer {
namespace {

#ifdef DEEPINFER_HAVE_CUDA
using testing::DevBuf;
using testing::download;
using testing::upload;

struct SortCase {
  int64_t T, k, n_shared, e_routed, tile_rows;
  bool skewed;
};

TEST(CudaMoeSort, MatchesHostStableSort) {
  std::unique_ptr<Backend> gpu = testing::try_cuda_backend();
  DI_REQUIRE_GPU(gpu);
  const auto stream = static_cast<cudaStream_t>(static_cast<CudaBackend*>(gpu.get())->stream());
  std::mt19937 rng(7);
  for (const SortCase& c : {SortCase{86, 6, 0, 64, 64, false}, SortCase{4096, 6, 2, 64, 64, false},
                            SortCase{16384, 6, 2, 64, 64, false}, SortCase{3000, 8, 1, 256, 128, false},
                            SortCase{2000, 6, 2, 64, 64, true}, SortCase{4, 1, 256, 256, 64, false}}) {
    const int64_t kt = c.k + c.n_shared, R = c.T * kt, E = c.e_routed + c.n_shared, n_active = std::min(E, R);
    ASSERT_GT(R, 512);
    std::vector<int32_t> ids(static_cast<size_t>(c.T * c.k));
    std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(c.e_routed - 1));
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = c.skewed ? static_cast<int32_t>(10 + i % c.k) : pick(rng);
    // The host reference: entry i's expert, then a stable counting sort.
    std::vector<int32_t> key(static_cast<size_t>(R)), count(static_cast<size_t>(E), 0);
    for (int64_t i = 0; i < R; ++i) {
      const int64_t tok = i / kt, j = i % kt;
      key[static_cast<size_t>(i)] = j < c.k ? ids[static_cast<size_t>(tok * c.k + j)] : static_cast<int32_t>(c.e_routed + j - c.k);
      ++count[static_cast<size_t>(key[static_cast<size_t>(i)])];
    }
    std::vector<int32_t> offsets(static_cast<size_t>(E + 1), 0), tiles(static_cast<size_t>(E + 1), 0), active;
    for (int64_t e = 0; e < E; ++e) {
      offsets[static_cast<size_t>(e + 1)] = offsets[static_cast<size_t>(e)] + count[static_cast<size_t>(e)];
      tiles[static_cast<size_t>(e + 1)] = tiles[static_cast<size_t>(e)] +
                                          static_cast<int32_t>((count[static_cast<size_t>(e)] + c.tile_rows - 1) / c.tile_rows);
      if (count[static_cast<size_t>(e)] > 0) active.push_back(static_cast<int32_t>(e));
    }
    active.resize(static_cast<size_t>(n_active), -1);
    std::vector<int32_t> perm(static_cast<size_t>(R)), inv(static_cast<size_t>(R)), next(offsets.begin(), offsets.end() - 1);
    for (int64_t i = 0; i < R; ++i) {
      const int32_t pos = next[static_cast<size_t>(key[static_cast<size_t>(i)])]++;
      perm[static_cast<size_t>(pos)] = static_cast<int32_t>(i);
      inv[static_cast<size_t>(i)] = pos;
    }

    DevBuf ids_d(sizeof(int32_t) * ids.size()), perm_d(sizeof(int32_t) * static_cast<size_t>(R)),
        inv_d(sizeof(int32_t) * static_cast<size_t>(R)), off_d(sizeof(int32_t) * static_cast<size_t>(E + 1)),
        tiles_d(sizeof(int32_t) * static_cast<size_t>(E + 1)), act_d(sizeof(int32_t) * static_cast<size_t>(n_active)),
        scratch(cuda::moe_sort_scratch_bytes(R, E));
    upload(ids_d, ids);
    cuda::moe_sort(ids_d.as<int32_t>(), c.k, kt, c.e_routed, R, c.tile_rows, perm_d.as<int32_t>(), inv_d.as<int32_t>(),
                   off_d.as<int32_t>(), tiles_d.as<int32_t>(), act_d.as<int32_t>(), n_active, scratch.as<void>(), stream);
    DI_CUDA_CHECK(cudaStreamSynchronize(stream));
    const std::string what = "T " + std::to_string(c.T) + " k " + std::to_string(c.k) + " shared " +
                             std::to_string(c.n_shared) + " E " + std::to_string(E);
    EXPECT_EQ(download<int32_t>(perm_d, static_cast<size_t>(R)), perm) << what;
    EXPECT_EQ(download<int32_t>(inv_d, static_cast<size_t>(R)), inv) << what;
    EXPECT_EQ(download<int32_t>(off_d, static_cast<size_t>(E + 1)), offsets) << what;
    EXPECT_EQ(download<int32_t>(tiles_d, static_cast<size_t>(E + 1)), tiles) << what;
    EXPECT_EQ(download<int32_t>(act_d, static_cast<size_t>(n_active)), active) << what;
  }
}

#else
TEST(CudaMoeSort, SkippedWithoutCuda) { GTEST_SKIP() << "built without the CUDA backend"; }
#endif

}  // namespace
}  // namespace deepinfer

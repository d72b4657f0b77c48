#include "kv/block_pool.h"

#include <algorithm>
#include <functional>

#include "core/check.h"

namespace deepinfer {

BlockPool::BlockPool(int64_t n_blocks) : n_blocks_(n_blocks), allocated_(static_cast<size_t>(n_blocks), 0) {
  DI_CHECK_GE(n_blocks, 0);
  DI_CHECK_LE(n_blocks, int64_t{INT32_MAX});
  free_.reserve(static_cast<size_t>(n_blocks));
  for (int64_t i = 0; i < n_blocks; ++i) free_.push_back(static_cast<int32_t>(i));  // sorted: a valid min-heap
}

std::vector<int32_t> BlockPool::allocate(int64_t n) {
  DI_CHECK(can_allocate(n));
  std::vector<int32_t> out;
  out.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    std::pop_heap(free_.begin(), free_.end(), std::greater<>());
    const int32_t id = free_.back();
    free_.pop_back();
    allocated_[static_cast<size_t>(id)] = 1;
    out.push_back(id);
  }
  return out;
}

void BlockPool::release(const std::vector<int32_t>& blocks) {
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
    const int32_t id = *it;
    DI_CHECK(id >= 0 && id < n_blocks_);
    DI_CHECK_EQ(allocated_[static_cast<size_t>(id)], 1);
    allocated_[static_cast<size_t>(id)] = 0;
    free_.push_back(id);
    std::push_heap(free_.begin(), free_.end(), std::greater<>());
  }
}

}  // namespace deepinfer

// BlockPool: a fixed set of KV pages identified by int32 ids, handed out and returned whole.
// Knows nothing of what a page holds (the model's KV layout lives in PagedKvCache) nor of
// prefix sharing (added by the serving runtime on top of these verbs). Not thread-safe:
// engine thread only.
#pragma once

#include <cstdint>
#include <vector>

namespace deepinfer {

class BlockPool {
 public:
  explicit BlockPool(int64_t n_blocks);

  int64_t n_blocks() const { return n_blocks_; }
  int64_t n_free() const { return static_cast<int64_t>(free_.size()); }
  bool can_allocate(int64_t n) const { return n >= 0 && n <= n_free(); }
  // Precondition: can_allocate(n). Lowest free ids first, so runs are reproducible.
  std::vector<int32_t> allocate(int64_t n);
  // Returns blocks to the pool. Precondition: each id is currently allocated, none repeated.
  void release(const std::vector<int32_t>& blocks);

 private:
  int64_t n_blocks_;
  std::vector<int32_t> free_;         // min-heap of free ids (std::greater): front() is next
  std::vector<uint8_t> allocated_;    // [n_blocks] 1 while handed out (invariant checks)
};

}  // namespace deepinfer

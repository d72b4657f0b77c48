#include "kv/block_manager.h"

#include <algorithm>

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include <xxhash.h>

#include "core/check.h"

namespace deepinfer {

BlockManager::BlockManager(int64_t n_blocks, int64_t block_size, bool enable_prefix_caching)
    : block_size_(block_size), prefix_caching_(enable_prefix_caching), blocks_(static_cast<size_t>(n_blocks)) {
  DI_CHECK_GT(block_size, 0);
  DI_CHECK_LE(n_blocks, int64_t{INT32_MAX});
  free_.reserve(static_cast<size_t>(n_blocks));
  for (int64_t i = n_blocks - 1; i >= 0; --i) free_.push_back(static_cast<int32_t>(i));
}

BlockHash BlockManager::chain(const BlockHash& parent, const int32_t* tokens, uint64_t salt) const {
  XXH3_state_t state;
  XXH3_INITSTATE(&state);
  XXH3_128bits_reset_withSeed(&state, salt);
  XXH3_128bits_update(&state, &parent, sizeof(parent));
  XXH3_128bits_update(&state, tokens, static_cast<size_t>(block_size_) * sizeof(int32_t));
  const XXH128_hash_t h = XXH3_128bits_digest(&state);
  return {h.low64, h.high64};
}

int64_t BlockManager::count_cached_blocks(const std::vector<int32_t>& tokens, uint64_t salt,
                                         int64_t n_shareable) const {
  if (!prefix_caching_ || tokens.empty()) return 0;
  const int64_t n_tokens = static_cast<int64_t>(tokens.size());
  const int64_t max_blocks = std::min(n_tokens - 1, std::max<int64_t>(n_shareable, 0)) / block_size_;
  BlockHash h;
  int64_t n = 0;
  for (; n < max_blocks; ++n) {
    const int32_t* t = tokens.data() + n * block_size_;
    h = chain(h, t, salt);
    auto it = by_hash_.find(h);
    if (it == by_hash_.end()) break;
    const Block& b = blocks_[static_cast<size_t>(it->second)];
    if (!std::equal(b.tokens.begin(), b.tokens.end(), t)) break;
  }
  return n;
}

bool BlockManager::can_allocate(const std::vector<int32_t>& tokens, int64_t n_extra, uint64_t salt,
                                int64_t n_shareable) const {
  const int64_t total = (static_cast<int64_t>(tokens.size()) + n_extra + block_size_ - 1) / block_size_;
  const int64_t hits = count_cached_blocks(tokens, salt, n_shareable);
  // Hit pages sitting in the LRU leave it when shared, so they count against the free supply.
  int64_t hits_in_lru = 0;
  if (hits > 0) {
    BlockHash h;
    for (int64_t i = 0; i < hits; ++i) {
      h = chain(h, tokens.data() + i * block_size_, salt);
      hits_in_lru += blocks_[static_cast<size_t>(by_hash_.at(h))].in_lru ? 1 : 0;
    }
  }
  return total - hits <= n_free() - hits_in_lru;
}

int32_t BlockManager::take_fresh() {
  int32_t id;
  if (!free_.empty()) {
    id = free_.back();
    free_.pop_back();
  } else {
    DI_CHECK(!lru_.empty());
    id = lru_.front();
    lru_.pop_front();
    blocks_[static_cast<size_t>(id)].in_lru = false;
    unhash(id);
  }
  Block& b = blocks_[static_cast<size_t>(id)];
  DI_CHECK_EQ(b.ref, 0);
  b.ref = 1;
  return id;
}

void BlockManager::unhash(int32_t id) {
  Block& b = blocks_[static_cast<size_t>(id)];
  if (!b.hashed) return;
  auto it = by_hash_.find(b.hash);
  if (it != by_hash_.end() && it->second == id) by_hash_.erase(it);
  b.hashed = false;
  b.tokens.clear();
}

KvAllocation BlockManager::allocate(const std::vector<int32_t>& tokens, int64_t n_extra, uint64_t salt,
                                    int64_t n_shareable) {
  DI_CHECK(can_allocate(tokens, n_extra, salt, n_shareable));
  KvAllocation a;
  a.salt = salt;
  a.n_shareable_tokens = n_shareable;
  const int64_t hits = count_cached_blocks(tokens, salt, n_shareable);
  BlockHash h;
  for (int64_t i = 0; i < hits; ++i) {
    h = chain(h, tokens.data() + i * block_size_, salt);
    const int32_t id = by_hash_.at(h);
    Block& b = blocks_[static_cast<size_t>(id)];
    if (b.in_lru) {
      lru_.erase(b.lru_pos);
      b.in_lru = false;
    }
    ++b.ref;
    a.kv.block_ids.push_back(id);
  }
  a.last_hash = h;
  a.n_committed_blocks = hits;
  a.n_cached_tokens = hits * block_size_;
  a.kv.n_tokens = a.n_cached_tokens;
  const int64_t total = (static_cast<int64_t>(tokens.size()) + n_extra + block_size_ - 1) / block_size_;
  for (int64_t i = hits; i < total; ++i) a.kv.block_ids.push_back(take_fresh());
  return a;
}

bool BlockManager::can_append(const KvAllocation& a, int64_t n_new) const {
  return a.kv.blocks_needed(n_new, block_size_) <= n_free();
}

void BlockManager::append(KvAllocation& a, int64_t n_new) {
  const int64_t need = a.kv.blocks_needed(n_new, block_size_);
  DI_CHECK_LE(need, n_free());
  for (int64_t i = 0; i < need; ++i) a.kv.block_ids.push_back(take_fresh());
}

void BlockManager::commit(KvAllocation& a, const std::vector<int32_t>& prompt, const std::vector<int32_t>& output) {
  if (!prefix_caching_) return;
  const int64_t n_known = static_cast<int64_t>(prompt.size() + output.size());
  const int64_t full = std::min({a.kv.n_tokens, n_known, a.n_shareable_tokens}) / block_size_;
  if (full <= a.n_committed_blocks) return;
  std::vector<int32_t> page(static_cast<size_t>(block_size_));
  const int64_t n_prompt = static_cast<int64_t>(prompt.size());
  for (int64_t i = a.n_committed_blocks; i < full; ++i) {
    for (int64_t j = 0; j < block_size_; ++j) {
      const int64_t pos = i * block_size_ + j;
      page[static_cast<size_t>(j)] = pos < n_prompt ? prompt[static_cast<size_t>(pos)] : output[static_cast<size_t>(pos - n_prompt)];
    }
    const int32_t* t = page.data();
    a.last_hash = chain(a.last_hash, t, a.salt);
    const int32_t id = a.kv.block_ids[static_cast<size_t>(i)];
    Block& b = blocks_[static_cast<size_t>(id)];
    // First writer wins: an identical page computed concurrently by another sequence stays
    // private to its holder and is freed unhashed.
    if (!b.hashed && by_hash_.find(a.last_hash) == by_hash_.end()) {
      b.hashed = true;
      b.hash = a.last_hash;
      b.tokens.assign(t, t + block_size_);
      by_hash_.emplace(a.last_hash, id);
    }
  }
  a.n_committed_blocks = full;
}

void BlockManager::release(KvAllocation& a, bool cacheable) {
  const int64_t n_hit_blocks = a.n_cached_tokens / block_size_;
  // Reverse order: a sequence's tail pages become the first evicted.
  for (int64_t i = static_cast<int64_t>(a.kv.block_ids.size()) - 1; i >= 0; --i) {
    const int32_t id = a.kv.block_ids[static_cast<size_t>(i)];
    Block& b = blocks_[static_cast<size_t>(id)];
    DI_CHECK_GT(b.ref, 0);
    if (--b.ref > 0) continue;
    if (!cacheable && i >= n_hit_blocks) unhash(id);
    if (b.hashed) {
      b.lru_pos = lru_.insert(lru_.end(), id);
      b.in_lru = true;
    } else {
      free_.push_back(id);
    }
  }
  a = KvAllocation{};
}

int64_t BlockManager::total_refs() const {
  int64_t refs = 0;
  for (const Block& b : blocks_) refs += b.ref;
  return refs;
}

Status BlockManager::check_invariants(int64_t expected_held_refs) const {
  int64_t held = 0, refs = 0;
  for (size_t i = 0; i < blocks_.size(); ++i) {
    const Block& b = blocks_[i];
    refs += b.ref;
    if (b.ref > 0) ++held;
    if (b.in_lru && (b.ref != 0 || !b.hashed))
      return make_error(StatusCode::kInternal, "page {} in the LRU with ref {} hashed {}", i, b.ref, b.hashed);
    if (b.hashed) {
      auto it = by_hash_.find(b.hash);
      if (it == by_hash_.end() || it->second != static_cast<int32_t>(i))
        return make_error(StatusCode::kInternal, "hashed page {} not findable by its hash", i);
    }
  }
  if (static_cast<int64_t>(free_.size() + lru_.size()) + held != n_blocks())
    return make_error(StatusCode::kInternal, "free {} + cached {} + held {} != total {}", free_.size(), lru_.size(),
                      held, n_blocks());
  if (refs != expected_held_refs)
    return make_error(StatusCode::kInternal, "ref counts sum to {}, holders account for {}", refs, expected_held_refs);
  return Status::ok();
}

}  // namespace deepinfer

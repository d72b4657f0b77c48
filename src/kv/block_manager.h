// BlockManager: KV pages for sequences, with prefix caching. A full page is identified by a
// hash chain over the tokens it holds and every token before it (plus an optional server-side
// salt), so a new sequence whose prompt starts with already-cached full pages shares them
// (ref-counted) instead of recomputing. Pages whose last holder released them stay cached and
// are evicted least-recently-released first when fresh pages run out. Verbs come in pairs
// (can_allocate/allocate, can_append/append) so callers decide before anything changes.
// Owns page bookkeeping only (the bytes live in PagedKvCache). Engine thread only.
#pragma once

#include <cstdint>
#include <list>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "kv/paged_kv_cache.h"

namespace deepinfer {

// 128-bit XXH3 of (parent hash, tokens): collisions are negligible, and a hit is also verified
// against the page's stored tokens, so sharing never happens without equal contents.
struct BlockHash {
  uint64_t lo = 0, hi = 0;
  bool operator==(const BlockHash&) const = default;
};
struct BlockHashHasher {
  size_t operator()(const BlockHash& h) const { return static_cast<size_t>(h.lo ^ (h.hi * 0x9E3779B97F4A7C15ull)); }
};

// One sequence's pages as the manager sees them.
struct KvAllocation {
  KvSequence kv;                      // pages and the number of tokens whose KV is computed
  int64_t n_cached_tokens = 0;        // prefix-cache hit length at allocation (multiple of block_size)
  int64_t n_committed_blocks = 0;     // leading pages whose hash is registered (or were hits)
  BlockHash last_hash;                // chain hash of page n_committed_blocks - 1
  uint64_t salt = 0;
  int64_t n_shareable_tokens = INT64_MAX;  // only pages within the first n may be registered (allocate)
};

class BlockManager {
 public:
  BlockManager(int64_t n_blocks, int64_t block_size, bool enable_prefix_caching);

  int64_t block_size() const { return block_size_; }
  int64_t n_blocks() const { return static_cast<int64_t>(blocks_.size()); }
  // Pages that can be handed out now: never-used or released-unhashed, plus cached ones with
  // no holder (evictable).
  int64_t n_free() const { return static_cast<int64_t>(free_.size() + lru_.size()); }
  int64_t n_cached_free() const { return static_cast<int64_t>(lru_.size()); }
  bool prefix_caching() const { return prefix_caching_; }

  // Leading full pages of `tokens` present in the cache (never the page holding the last
  // token: its logits must be computed), among the pages that lie within the first
  // `n_shareable` tokens. Pure lookup.
  int64_t count_cached_blocks(const std::vector<int32_t>& tokens, uint64_t salt,
                              int64_t n_shareable = INT64_MAX) const;
  // Whether pages for all of `tokens` plus `n_extra` more can be had now.
  bool can_allocate(const std::vector<int32_t>& tokens, int64_t n_extra, uint64_t salt,
                    int64_t n_shareable = INT64_MAX) const;
  // Precondition: can_allocate (same arguments). Shares the cached prefix, takes fresh pages for
  // the rest of tokens (+ n_extra), and marks the shared prefix as computed. Only pages within
  // the first `n_shareable` tokens may be hits, and only those are registered by commit.
  KvAllocation allocate(const std::vector<int32_t>& tokens, int64_t n_extra, uint64_t salt,
                        int64_t n_shareable = INT64_MAX);
  // Pages to hold n_new more tokens beyond those computed.
  bool can_append(const KvAllocation& a, int64_t n_new) const;
  void append(KvAllocation& a, int64_t n_new);
  // Registers the hash of every page that became full now that `a.kv.n_tokens` tokens (the
  // first n of `tokens`) are computed.
  void commit(KvAllocation& a, const std::vector<int32_t>& tokens) { commit(a, tokens, {}); }
  // The same over a sequence held as prompt + output (no concatenated copy). O(1) unless a
  // page became full.
  void commit(KvAllocation& a, const std::vector<int32_t>& prompt, const std::vector<int32_t>& output);
  // Drops the sequence's hold on its pages. `cacheable` false (a failed request) also removes
  // the hashes this sequence registered, so nothing it computed can be hit later.
  void release(KvAllocation& a, bool cacheable = true);

  // free + held = total; ref counts equal the holders counted by the caller; LRU entries have
  // no holder; every hashed page is findable by its hash. For tests and debug builds.
  Status check_invariants(int64_t expected_held_refs) const;
  int64_t total_refs() const;

 private:
  struct Block {
    int32_t ref = 0;
    bool hashed = false;
    BlockHash hash;
    std::vector<int32_t> tokens;      // [block_size] contents, to verify hits
    std::list<int32_t>::iterator lru_pos;
    bool in_lru = false;
  };
  BlockHash chain(const BlockHash& parent, const int32_t* tokens, uint64_t salt) const;
  int32_t take_fresh();
  void unhash(int32_t id);

  int64_t block_size_;
  bool prefix_caching_;
  std::vector<Block> blocks_;
  std::vector<int32_t> free_;          // ref 0, unhashed; back() is next
  std::list<int32_t> lru_;             // ref 0, hashed; front() is evicted first
  std::unordered_map<BlockHash, int32_t, BlockHashHasher> by_hash_;
};

}  // namespace deepinfer

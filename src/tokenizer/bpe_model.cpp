#include "tokenizer/bpe_model.h"

#include <algorithm>
#include <cstring>
#include <functional>

#include "core/check.h"

namespace deepinfer {

namespace {

constexpr uint32_t kNoRank = UINT32_MAX;
constexpr size_t kCacheSlots = size_t{1} << 14;        // 16384 slots, at most half of them used
constexpr size_t kCacheMaxEntries = kCacheSlots / 2;
constexpr size_t kCacheMaxTextBytes = size_t{1} << 20;  // arenas are bounded: ~1 MiB text + ids

uint64_t hash_bytes(std::string_view s) {
  uint64_t h = (s.size() + 1) * 0x9E3779B97F4A7C15ull;
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
    h ^= h >> 31;
  }
  if (i < s.size()) {
    uint64_t w = 0;
    std::memcpy(&w, s.data() + i, s.size() - i);
    h = (h ^ w) * 0x94D049BB133111EBull;
    h ^= h >> 29;
  }
  return h;
}


}  // namespace

BpeScratch::BpeScratch() : cache_slots_(kCacheSlots) {}

void BpeScratch::clear_cache() {
  if (cache_used_ == 0) return;
  std::fill(cache_slots_.begin(), cache_slots_.end(), CacheSlot{});
  cache_text_.clear();
  cache_ids_.clear();
  cache_used_ = 0;
}

BpeModel::BpeModel(const std::array<int32_t, 256>& byte_ids, const std::vector<BpeMerge>& merges,
                   bool ignore_merges, std::unordered_map<std::string, int32_t> whole_tokens)
    : byte_ids_(byte_ids), n_merges_(merges.size()), ignore_merges_(ignore_merges), whole_tokens_(std::move(whole_tokens)) {
  DI_CHECK(merges.size() < kNoRank);
  // Load factor ≤ 0.5 keeps linear probes short.
  size_t capacity = 16;
  int bits = 4;
  while (capacity < merges.size() * 2) {
    capacity <<= 1;
    ++bits;
  }
  pairs_.assign(capacity, PairSlot{kEmptyKey, 0, 0});
  pair_mask_ = capacity - 1;
  pair_shift_ = 64 - bits;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const BpeMerge& m = merges[rank];
    DI_CHECK(m.left >= 0 && m.right >= 0 && m.result >= 0);
    const uint64_t key = (static_cast<uint64_t>(m.left) << 32) | static_cast<uint32_t>(m.right);
    size_t i = static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> pair_shift_);
    while (pairs_[i].key != kEmptyKey && pairs_[i].key != key) i = (i + 1) & pair_mask_;
    pairs_[i] = PairSlot{key, static_cast<uint32_t>(rank), m.result};  // a later duplicate wins
  }
  byte_pairs_.assign(256 * 256, PairSlot{kEmptyKey, kNoRank, -1});
  for (int a = 0; a < 256; ++a) {
    for (int b = 0; b < 256; ++b) {
      if (const PairSlot* p = find_pair(byte_ids_[a], byte_ids_[b])) byte_pairs_[a * 256 + b] = *p;
    }
  }
}

void BpeModel::encode_piece(std::string_view piece, std::vector<int32_t>& out, BpeScratch& s) const {
  const size_t n = piece.size();
  if (n == 1) {
    out.push_back(byte_ids_[static_cast<uint8_t>(piece[0])]);
    return;
  }
  if (ignore_merges_) {
    if (auto it = whole_tokens_.find(std::string(piece)); it != whole_tokens_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  const bool cacheable = n <= kCacheMaxPieceBytes;
  uint64_t hash = 0;
  if (cacheable) {
    hash = hash_bytes(piece);
    if (cache_lookup(piece, hash, out, s)) return;
  }
  const size_t first = out.size();
  if (n <= kLinearMergeMaxBytes) {
    merge_linear(piece, s);
    out.insert(out.end(), s.ids_.begin(), s.ids_.end());
  } else {
    merge_heap(piece, s);
    for (int32_t i = 0; i >= 0; i = s.next_[i]) out.push_back(s.ids_[i]);
  }
  if (cacheable) cache_store(piece, hash, out.data() + first, out.size() - first, s);
}

// Repeatedly merges the lowest-ranked (then leftmost) adjacent pair; ranks of untouched pairs
// are kept, so each merge costs one scan plus two lookups. Leaves the result in s.ids_.
void BpeModel::merge_linear(std::string_view piece, BpeScratch& s) const {
  const size_t n = piece.size();
  auto& ids = s.ids_;
  auto& ranks = s.ranks_;
  auto& results = s.results_;
  ids.resize(n);
  ranks.resize(n - 1);
  results.resize(n - 1);
  for (size_t i = 0; i < n; ++i) ids[i] = byte_ids_[static_cast<uint8_t>(piece[i])];
  for (size_t i = 0; i + 1 < n; ++i) {
    const PairSlot& p = byte_pair(static_cast<uint8_t>(piece[i]), static_cast<uint8_t>(piece[i + 1]));
    ranks[i] = p.rank;
    results[i] = p.result;
  }
  const auto set_pair = [&](size_t i) {
    const PairSlot* p = find_pair(ids[i], ids[i + 1]);
    ranks[i] = p ? p->rank : kNoRank;
    results[i] = p ? p->result : -1;
  };
  size_t count = n;
  while (count > 1) {
    size_t best = 0;
    uint32_t best_rank = ranks[0];
    for (size_t i = 1; i + 1 < count; ++i) {
      if (ranks[i] < best_rank) {
        best_rank = ranks[i];
        best = i;
      }
    }
    if (best_rank == kNoRank) break;
    ids[best] = results[best];
    // Remove symbol best + 1 and pair best (its old pair with the removed symbol).
    std::copy(ids.begin() + best + 2, ids.begin() + count, ids.begin() + best + 1);
    std::copy(ranks.begin() + best + 1, ranks.begin() + count - 1, ranks.begin() + best);
    std::copy(results.begin() + best + 1, results.begin() + count - 1, results.begin() + best);
    --count;
    if (best > 0) set_pair(best - 1);
    if (best + 1 < count) set_pair(best);
  }
  ids.resize(count);
}

// HF's algorithm: a min-heap of candidate merges keyed by (rank, position) over a doubly linked
// list of symbols; an entry is stale when its left symbol was merged away or the pair at its
// position no longer has its rank (ranks identify pairs). O(n log n); heap entries are one
// 64-bit key so the heap of a megabyte-long piece stays cache-friendly. Leaves the symbols in
// s.ids_ linked from index 0 by s.next_ (-1 ends).
void BpeModel::merge_heap(std::string_view piece, BpeScratch& s) const {
  const size_t n = piece.size();
  auto& ids = s.ids_;
  auto& next = s.next_;
  auto& prev = s.prev_;
  auto& heap = s.heap_;
  ids.resize(n);
  next.resize(n);
  prev.resize(n);
  heap.clear();
  const auto cmp = std::greater<uint64_t>();
  const auto key = [](uint32_t rank, size_t pos) { return (static_cast<uint64_t>(rank) << 32) | pos; };
  for (size_t i = 0; i < n; ++i) {
    ids[i] = byte_ids_[static_cast<uint8_t>(piece[i])];
    next[i] = i + 1 < n ? static_cast<int32_t>(i + 1) : -1;
    prev[i] = static_cast<int32_t>(i) - 1;
  }
  for (size_t i = 0; i + 1 < n; ++i) {
    const uint32_t rank = byte_pair(static_cast<uint8_t>(piece[i]), static_cast<uint8_t>(piece[i + 1])).rank;
    if (rank != kNoRank) heap.push_back(key(rank, i));
  }
  std::make_heap(heap.begin(), heap.end(), cmp);
  const auto push = [&](int32_t pos) {
    if (const PairSlot* p = find_pair(ids[pos], ids[next[pos]])) {
      heap.push_back(key(p->rank, static_cast<size_t>(pos)));
      std::push_heap(heap.begin(), heap.end(), cmp);
    }
  };
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), cmp);
    const uint64_t top = heap.back();
    heap.pop_back();
    const auto pos = static_cast<int32_t>(top & 0xFFFFFFFFu);
    const auto rank = static_cast<uint32_t>(top >> 32);
    const int32_t right = next[pos];
    if (ids[pos] < 0 || right < 0) continue;
    const PairSlot* p = find_pair(ids[pos], ids[right]);
    if (p == nullptr || p->rank != rank) continue;  // stale
    ids[pos] = p->result;
    ids[right] = -1;
    next[pos] = next[right];
    if (next[right] >= 0) prev[next[right]] = pos;
    if (prev[pos] >= 0) push(prev[pos]);
    if (next[pos] >= 0) push(pos);
  }
}

bool BpeModel::cache_lookup(std::string_view piece, uint64_t hash, std::vector<int32_t>& out, BpeScratch& s) const {
  const size_t mask = s.cache_slots_.size() - 1;
  for (size_t i = hash & mask;; i = (i + 1) & mask) {
    const BpeScratch::CacheSlot& slot = s.cache_slots_[i];
    if (slot.text_length == 0) return false;
    if (slot.hash == hash && slot.text_length == piece.size() &&
        std::memcmp(s.cache_text_.data() + slot.text_offset, piece.data(), piece.size()) == 0) {
      out.insert(out.end(), s.cache_ids_.begin() + slot.ids_offset, s.cache_ids_.begin() + slot.ids_offset + slot.n_ids);
      return true;
    }
  }
}

void BpeModel::cache_store(std::string_view piece, uint64_t hash, const int32_t* ids, size_t n_ids,
                           BpeScratch& s) const {
  if (s.cache_used_ >= kCacheMaxEntries || s.cache_text_.size() + piece.size() > kCacheMaxTextBytes) s.clear_cache();
  const size_t mask = s.cache_slots_.size() - 1;
  size_t i = hash & mask;
  while (s.cache_slots_[i].text_length != 0) i = (i + 1) & mask;
  BpeScratch::CacheSlot& slot = s.cache_slots_[i];
  slot.hash = hash;
  slot.text_offset = static_cast<uint32_t>(s.cache_text_.size());
  slot.text_length = static_cast<uint32_t>(piece.size());
  slot.ids_offset = static_cast<uint32_t>(s.cache_ids_.size());
  slot.n_ids = static_cast<uint32_t>(n_ids);
  s.cache_text_.append(piece);
  s.cache_ids_.insert(s.cache_ids_.end(), ids, ids + n_ids);
  ++s.cache_used_;
}

}  // namespace deepinfer

// BpeModel: byte-level BPE over a validated vocabulary — the 256 single-byte token ids, a
// ranked merge table in an open-addressing hash map, and per-thread scratch with a bounded cache
// of recent pieces. Encodes one pre-tokenized piece at a time; does not split text, know about
// added tokens, or own id → string tables (the Tokenizer does).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace deepinfer {

// One merge rule: `left` followed by `right` becomes `result`; lower ranks apply first.
struct BpeMerge {
  int32_t left = 0;
  int32_t right = 0;
  int32_t result = 0;
};

// Reusable buffers for BpeModel::encode_piece. One per thread (not thread-safe); reused across
// calls so encoding allocates only while buffers grow.
class BpeScratch {
 public:
  BpeScratch();
  // Forgets cached pieces (they belong to one model).
  void clear_cache();

 private:
  friend class BpeModel;
  struct CacheSlot {
    uint64_t hash = 0;
    uint32_t text_offset = 0;
    uint32_t text_length = 0;  // 0: empty slot
    uint32_t ids_offset = 0;
    uint32_t n_ids = 0;
  };

  std::vector<int32_t> ids_;        // [n_symbols] current symbol ids (-1: merged away)
  std::vector<uint32_t> ranks_;     // [n_symbols - 1] rank of the pair starting at i (linear path)
  std::vector<int32_t> results_;    // [n_symbols - 1] id that pair merges into (linear path)
  std::vector<int32_t> next_;       // [n_symbols] linked list (heap path)
  std::vector<int32_t> prev_;       // [n_symbols]
  std::vector<uint64_t> heap_;      // (rank << 32 | position) of candidate merges (heap path)

  std::vector<CacheSlot> cache_slots_;  // power-of-two open-addressing table
  std::string cache_text_;              // arena of cached piece bytes
  std::vector<int32_t> cache_ids_;      // arena of cached ids
  uint32_t cache_used_ = 0;
};

class BpeModel {
 public:
  // Pieces longer than this (bytes) use the O(n log n) heap merge; shorter ones a linear scan
  // per merge (fewer constant costs on typical words).
  static constexpr size_t kLinearMergeMaxBytes = 48;
  // Pieces up to this many bytes are cached.
  static constexpr size_t kCacheMaxPieceBytes = 64;

  BpeModel() = default;
  // Preconditions (checked by the loader): byte_ids are valid ids; merges are in rank order and
  // name valid ids. A later duplicate (left, right) overrides an earlier one, as HF does.
  // `whole_tokens` (bytes → id) is consulted only when ignore_merges.
  BpeModel(const std::array<int32_t, 256>& byte_ids, const std::vector<BpeMerge>& merges, bool ignore_merges,
           std::unordered_map<std::string, int32_t> whole_tokens);

  // Appends the ids of `piece` (any bytes, non-empty) to `out`. Thread-safe given one scratch
  // per thread; O(n log n) in the piece length.
  void encode_piece(std::string_view piece, std::vector<int32_t>& out, BpeScratch& scratch) const;

  int32_t byte_id(uint8_t b) const { return byte_ids_[b]; }
  size_t n_merges() const { return n_merges_; }

 private:
  struct PairSlot {
    uint64_t key;  // (left << 32) | right; kEmptyKey when unused
    uint32_t rank;
    int32_t result;
  };
  static constexpr uint64_t kEmptyKey = ~uint64_t{0};

  // Rank and result of the pair of two single-byte tokens (the first round of every piece),
  // from a dense 256x256 table instead of the hash map.
  const PairSlot& byte_pair(uint8_t a, uint8_t b) const { return byte_pairs_[a * 256 + b]; }
  const PairSlot* find_pair(int32_t left, int32_t right) const {
    const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
    size_t i = static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> pair_shift_);
    for (;;) {
      const PairSlot& s = pairs_[i];
      if (s.key == key) return &s;
      if (s.key == kEmptyKey) return nullptr;
      i = (i + 1) & pair_mask_;
    }
  }
  void merge_linear(std::string_view piece, BpeScratch& s) const;
  void merge_heap(std::string_view piece, BpeScratch& s) const;
  bool cache_lookup(std::string_view piece, uint64_t hash, std::vector<int32_t>& out, BpeScratch& s) const;
  void cache_store(std::string_view piece, uint64_t hash, const int32_t* ids, size_t n_ids, BpeScratch& s) const;

  std::array<int32_t, 256> byte_ids_{};
  std::vector<PairSlot> byte_pairs_;  // [256 * 256]; rank kNoRank where there is no merge
  std::vector<PairSlot> pairs_;
  size_t pair_mask_ = 0;
  int pair_shift_ = 64;
  size_t n_merges_ = 0;
  bool ignore_merges_ = false;
  std::unordered_map<std::string, int32_t> whole_tokens_;
};

}  // namespace deepinfer

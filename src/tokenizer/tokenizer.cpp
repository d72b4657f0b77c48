#include "tokenizer/tokenizer.h"

#include <atomic>

#include "io/text.h"
#include "tokenizer/utf8.h"

namespace deepinfer {

namespace {

std::atomic<uint64_t> g_next_serial{1};

// Inputs shorter than this are not worth waking the pool for.
constexpr size_t kParallelMinBytes = size_t{64} << 10;

// Everything one thread needs to encode: PCRE2 match state, pre-tokenizer and BPE buffers,
// and the BPE piece cache, which belongs to one Tokenizer (keyed by its serial, never reused).
struct EncodeScratch {
  uint64_t owner = 0;
  BpeScratch bpe;
  PreTokenizerScratch pre;
  std::vector<TextSegment> segments;
  std::vector<TextPiece> pieces;
};

EncodeScratch& scratch_for(uint64_t serial) {
  thread_local EncodeScratch scratch;
  if (scratch.owner != serial) {
    scratch.bpe.clear_cache();
    scratch.owner = serial;
  }
  return scratch;
}

}  // namespace

Tokenizer::Tokenizer() : serial_(g_next_serial.fetch_add(1)) {}
Tokenizer::~Tokenizer() = default;

Status Tokenizer::check_input(std::string_view text, size_t max_bytes) const {
  if (text.size() > max_bytes) {
    return make_error(StatusCode::kOutOfRange, "input of {} bytes exceeds the tokenizer's limit of {} bytes",
                      text.size(), max_bytes);
  }
  if (!utf8::is_valid(text)) {
    return make_error(StatusCode::kInvalidArgument, "input is not valid UTF-8 (byte offset {})",
                      find_invalid_utf8(text).value_or(0));
  }
  return Status::ok();
}

Status Tokenizer::encode_segment(std::string_view text, TextPiece range, std::vector<int32_t>& out) const {
  EncodeScratch& s = scratch_for(serial_);
  s.pieces.clear();
  DI_RETURN_IF_ERROR(pre_tokenizer_.split(text, range, s.pieces, s.pre));
  for (const TextPiece& p : s.pieces) bpe_.encode_piece(text.substr(p.begin, p.end - p.begin), out, s.bpe);
  return Status::ok();
}

Status Tokenizer::encode_append(std::string_view text, bool split_special_tokens, std::vector<int32_t>& out,
                                size_t max_bytes) const {
  DI_RETURN_IF_ERROR(check_input(text, max_bytes));
  const TextPiece whole{0, text.size()};
  if (!split_special_tokens || added_.empty()) return encode_segment(text, whole, out);
  std::vector<TextSegment>& segments = scratch_for(serial_).segments;
  segments.clear();
  added_.split(text, whole, segments);
  // encode_segment does not touch scratch.segments, so iterating it here is safe.
  for (const TextSegment& seg : segments) {
    if (seg.id >= 0) {
      out.push_back(seg.id);
    } else {
      DI_RETURN_IF_ERROR(encode_segment(text, TextPiece{seg.begin, seg.end}, out));
    }
  }
  return Status::ok();
}

Expected<std::vector<int32_t>> Tokenizer::encode(std::string_view text, const EncodeOptions& options) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  if (options.add_special_tokens) ids = prefix_ids_;
  DI_RETURN_IF_ERROR(encode_append(text, options.split_special_tokens, ids, options.max_bytes));
  if (options.add_special_tokens) ids.insert(ids.end(), suffix_ids_.begin(), suffix_ids_.end());
  return ids;
}

Expected<std::vector<int32_t>> Tokenizer::encode_parallel(std::string_view text, ThreadPool& pool,
                                                          const EncodeOptions& options) const {
  if (pool.n_threads() == 1 || text.size() < kParallelMinBytes) return encode(text, options);
  DI_RETURN_IF_ERROR(check_input(text, options.max_bytes));
  std::vector<TextSegment> segments;
  if (options.split_special_tokens && !added_.empty()) {
    added_.split(text, TextPiece{0, text.size()}, segments);
  } else {
    segments.push_back(TextSegment{0, text.size(), -1});
  }

  // 1. Pre-tokenize the plain segments, one task per segment.
  const auto n_segments = static_cast<int64_t>(segments.size());
  std::vector<std::vector<TextPiece>> pieces(segments.size());
  std::vector<Status> statuses(segments.size());
  pool.parallel_for(n_segments, 1, [&](int64_t begin, int64_t end) {
    EncodeScratch& s = scratch_for(serial_);
    for (int64_t i = begin; i < end; ++i) {
      const TextSegment& seg = segments[i];
      if (seg.id < 0) statuses[i] = pre_tokenizer_.split(text, TextPiece{seg.begin, seg.end}, pieces[i], s.pre);
    }
  });
  for (const Status& st : statuses) DI_RETURN_IF_ERROR(st);

  // 2. Merge pieces in chunks of about equal bytes, in parallel; chunks keep text order.
  struct Chunk {
    size_t segment;
    size_t piece_begin, piece_end;  // pieces of a plain segment; unused for an added token
  };
  const size_t target_bytes = std::max<size_t>(16 << 10, text.size() / (4 * static_cast<size_t>(pool.n_threads())));
  std::vector<Chunk> chunks;
  for (size_t i = 0; i < segments.size(); ++i) {
    if (segments[i].id >= 0) {
      chunks.push_back(Chunk{i, 0, 0});
      continue;
    }
    size_t first = 0, bytes = 0;
    for (size_t k = 0; k < pieces[i].size(); ++k) {
      bytes += pieces[i][k].end - pieces[i][k].begin;
      if (bytes >= target_bytes) {
        chunks.push_back(Chunk{i, first, k + 1});
        first = k + 1;
        bytes = 0;
      }
    }
    if (first < pieces[i].size()) chunks.push_back(Chunk{i, first, pieces[i].size()});
  }
  std::vector<std::vector<int32_t>> chunk_ids(chunks.size());
  pool.parallel_for(static_cast<int64_t>(chunks.size()), 1, [&](int64_t begin, int64_t end) {
    EncodeScratch& s = scratch_for(serial_);
    for (int64_t c = begin; c < end; ++c) {
      const Chunk& chunk = chunks[c];
      const TextSegment& seg = segments[chunk.segment];
      if (seg.id >= 0) {
        chunk_ids[c].push_back(seg.id);
        continue;
      }
      for (size_t k = chunk.piece_begin; k < chunk.piece_end; ++k) {
        const TextPiece& p = pieces[chunk.segment][k];
        bpe_.encode_piece(text.substr(p.begin, p.end - p.begin), chunk_ids[c], s.bpe);
      }
    }
  });
  std::vector<int32_t> ids;
  size_t total = prefix_ids_.size() + suffix_ids_.size();
  for (const auto& v : chunk_ids) total += v.size();
  ids.reserve(total);
  if (options.add_special_tokens) ids = prefix_ids_;
  for (const auto& v : chunk_ids) ids.insert(ids.end(), v.begin(), v.end());
  if (options.add_special_tokens) ids.insert(ids.end(), suffix_ids_.begin(), suffix_ids_.end());
  return ids;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  // HF: runs of model tokens are joined as bytes and converted lossily; added tokens are copied
  // verbatim between runs; skipped ids do not end a run.
  std::string out;
  std::string run;
  for (int32_t id : ids) {
    if (!in_range(id)) continue;
    const Kind kind = kinds_[id];
    if (kind == Kind::kModel) {
      run.append(token_bytes(id));
      continue;
    }
    if (skip_special_tokens && kind == Kind::kSpecial) continue;
    utf8::append_lossy(out, run);
    run.clear();
    out.append(strings_[id]);
  }
  utf8::append_lossy(out, run);
  return out;
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  auto it = ids_by_string_.find(token);
  if (it == ids_by_string_.end()) return std::nullopt;
  return it->second;
}

std::string_view Tokenizer::id_to_token(int32_t id) const { return in_range(id) ? std::string_view(strings_[id]) : ""; }

std::string_view Tokenizer::token_bytes(int32_t id) const {
  if (!in_range(id)) return {};
  return std::string_view(bytes_arena_).substr(bytes_offsets_[id], bytes_offsets_[id + 1] - bytes_offsets_[id]);
}

}  // namespace deepinfer

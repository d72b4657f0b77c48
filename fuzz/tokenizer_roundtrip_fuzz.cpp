// libFuzzer target for the text round trip on DeepSeek-V3's real tokenizer (from
// $DEEPINFER_TOKENIZER_DIR, else third_party/deepseek_v3_tokenizer as scripts/setup.sh fetches it):
//   valid UTF-8 x:  decode(encode(x)) == x with and without added-token recognition, plain mode
//                   never yields an added id, streamed detokenizer deltas equal decode, stop
//                   strings found across deltas match a whole-text search;
//   any bytes:      invalid UTF-8 is rejected as kInvalidArgument, decode of ids made from the
//                   bytes is valid UTF-8 and equals the streamed deltas, and the tool-call parser
//                   gives the same result however the bytes are chunked.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "tokenizer/detokenizer.h"
#include "tokenizer/stop_string_matcher.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tool_call_parser.h"
#include "tokenizer/utf8.h"

namespace {

using namespace deepinfer;

void require(bool condition) {
  if (!condition) std::abort();
}

const Tokenizer& tokenizer() {
  static std::unique_ptr<Tokenizer> t = [] {
    const char* env = std::getenv("DEEPINFER_TOKENIZER_DIR");
    const std::string dir = env ? env : std::string(DEEPINFER_SOURCE_DIR) + "/third_party/deepseek_v3_tokenizer";
    auto loaded = Tokenizer::load(dir);
    if (!loaded) {
      std::fprintf(stderr, "tokenizer_roundtrip_fuzz: %s (run scripts/setup.sh)\n", loaded.status().to_string().c_str());
      std::exit(2);
    }
    return std::move(*loaded);
  }();
  return *t;
}

std::string stream_decode(const Tokenizer& t, const std::vector<int32_t>& ids, bool skip) {
  IncrementalDetokenizer d(t, skip);
  std::string all;
  for (int32_t id : ids) {
    const std::string delta = d.push(id);
    require(utf8::is_valid(delta));
    all += delta;
  }
  all += d.finish();
  return all;
}

struct Parsed {
  std::string content, calls;
  std::vector<std::string> errors;
  bool operator==(const Parsed&) const = default;
};

Parsed parse_tool_calls(std::string_view text, const uint8_t* cuts, size_t n_cuts) {
  ToolCallParser p;
  Parsed out;
  const auto absorb = [&](const ToolCallParseResult& r) {
    out.content += r.content;
    for (const ToolCallDelta& d : r.tool_calls) out.calls += std::to_string(d.index) + d.id + d.type + d.name + "|" + d.arguments;
    out.errors.insert(out.errors.end(), r.errors.begin(), r.errors.end());
  };
  size_t pos = 0;
  for (size_t k = 0; k < n_cuts && pos < text.size(); ++k) {
    const size_t len = cuts[k] % 16;
    absorb(p.push(text.substr(pos, len)));
    pos += std::min(len, text.size() - pos);
  }
  absorb(p.push(text.substr(pos)));
  absorb(p.finish());
  // Deltas concatenate per call, so compare the completed calls, not how deltas were grouped.
  out.calls.clear();
  for (const ParsedToolCall& c : p.tool_calls()) out.calls += c.id + "|" + c.type + "|" + c.name + "|" + c.arguments + ";";
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  (void)tokenizer();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Tokenizer& t = tokenizer();
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  if (utf8::is_valid(text)) {
    for (bool split : {true, false}) {
      EncodeOptions options;
      options.split_special_tokens = split;
      auto ids = t.encode(text, options);
      require(ids.has_value());
      for (int32_t id : *ids) {
        require(id >= 0 && id < t.vocab_size());
        if (!split) require(!t.is_added(id));
      }
      require(t.decode(*ids) == text);
      require(stream_decode(t, *ids, false) == text);
    }
    // Stop strings across deltas of 1..4 characters equal a whole-text search (earliest end).
    auto stops = StopStringMatcher::create({"\n\n", "<｜", "ab"});
    require(stops.has_value());
    std::string out;
    size_t pos = 0, k = 0;
    while (pos < text.size() && !stops->stopped()) {
      size_t end = pos;
      for (size_t c = 0; c <= data[k++ % size] % 4 && end < text.size(); ++c) end += utf8::sequence_length(text, end);
      stops->push(text.substr(pos, end - pos), out);
      require(utf8::is_valid(out));
      pos = end;
    }
    stops->finish(out);
    size_t best_end = std::string_view::npos, best_len = 0;
    for (std::string_view s : {std::string_view("\n\n"), std::string_view("<｜"), std::string_view("ab")}) {
      const size_t at = text.find(s);
      if (at == std::string_view::npos) continue;
      const size_t e = at + s.size();
      if (e < best_end || (e == best_end && s.size() > best_len)) {
        best_end = e;
        best_len = s.size();
      }
    }
    require(out == (best_end == std::string_view::npos ? text : text.substr(0, best_end - best_len)));
  } else {
    auto ids = t.encode(text);
    require(!ids.has_value() && ids.status().code() == StatusCode::kInvalidArgument);
  }
  // Ids from the bytes (some past the vocabulary): decode is valid UTF-8 and streams the same.
  std::vector<int32_t> ids;
  for (size_t i = 0; i + 2 < size && ids.size() < 256; i += 3) ids.push_back((data[i] << 16 | data[i + 1] << 8 | data[i + 2]) % 129300);
  for (bool skip : {false, true}) {
    const std::string decoded = t.decode(ids, skip);
    require(utf8::is_valid(decoded));
    require(stream_decode(t, ids, skip) == decoded);
  }
  // Tool-call parsing is independent of chunk boundaries.
  require(parse_tool_calls(text, data, size) == parse_tool_calls(text, nullptr, 0));
  return 0;
}

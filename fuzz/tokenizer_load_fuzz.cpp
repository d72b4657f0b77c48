// libFuzzer target for tokenizer loading: any bytes, read as tokenizer.json (and, after a NUL
// byte, tokenizer_config.json), must either load or fail with a usable message; a tokenizer that
// loads must encode sample texts to ids inside its vocabulary and decode any ids to valid UTF-8.
// Never a crash, leak, hang or undefined behaviour (built with ASan + UBSan).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "io/text.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace {

void require(bool condition) {
  if (!condition) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const std::string_view tokenizer_json = input.substr(0, nul);
  const std::string_view config_json = nul == std::string_view::npos ? std::string_view() : input.substr(nul + 1);
  auto t = deepinfer::Tokenizer::from_json_text(tokenizer_json, config_json);
  if (!t) {
    const std::string message = t.status().message();
    require(!message.empty());
    require(!deepinfer::find_invalid_utf8(message).has_value());
    require(message.size() < 4096);
    return 0;
  }
  const deepinfer::Tokenizer& tok = **t;
  require(tok.vocab_size() > 0);
  for (int32_t id : tok.prefix_ids()) require(id >= 0 && id < tok.vocab_size());
  for (int32_t id : tok.suffix_ids()) require(id >= 0 && id < tok.vocab_size());
  for (std::string_view text : {std::string_view("Hello, world! 12345\n\n  x"), std::string_view("中文 🙂 \xC2\x85\t\r\n"),
                                std::string_view("<｜User｜>a<｜Assistant｜>"), std::string_view("")}) {
    for (bool special : {false, true}) {
      deepinfer::EncodeOptions options;
      options.add_special_tokens = special;
      options.split_special_tokens = special;
      auto ids = tok.encode(text, options);
      if (!ids) {
        // Only a regex that gives up may fail on valid UTF-8.
        require(ids.status().code() == deepinfer::StatusCode::kResourceExhausted);
        continue;
      }
      for (int32_t id : *ids) require(id >= 0 && id < tok.vocab_size());
      require(deepinfer::utf8::is_valid(tok.decode(*ids)));
    }
  }
  std::vector<int32_t> raw;
  for (size_t i = 0; i + 1 < size && raw.size() < 64; i += 2) raw.push_back((data[i] << 8 | data[i + 1]) - 256);
  require(deepinfer::utf8::is_valid(tok.decode(raw)));
  require(deepinfer::utf8::is_valid(tok.decode(raw, true)));
  return 0;
}

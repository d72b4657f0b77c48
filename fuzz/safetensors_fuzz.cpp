// libFuzzer target for parse_safetensors_header: any byte string must yield either a header that
// satisfies every invariant the readers rely on, or an error Status with a usable message; never
// a crash, leak, hang or undefined behaviour (built with ASan + UBSan).
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "core/dtype.h"
#include "io/safetensors.h"
#include "io/text.h"

namespace {

// Aborts (a libFuzzer crash) when a parser post-condition does not hold.
void require(bool condition) {
  if (!condition) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto header = deepinfer::parse_safetensors_header(data, size);
  if (!header) {
    const std::string message = header.status().message();
    require(!message.empty());
    require(!deepinfer::find_invalid_utf8(message).has_value());  // safe to embed in JSON errors
    require(message.size() < 4096);                               // hostile names are capped
    return 0;
  }
  require(header->data_offset >= 8 && header->data_offset <= size);
  require(header->data_offset + header->data_bytes == size);
  uint64_t total = 0;
  for (const deepinfer::SafetensorsEntry& entry : header->entries) {
    require(entry.begin <= entry.end && entry.end <= header->data_bytes);
    uint64_t n = 1;
    for (int64_t dim : entry.shape) {
      require(dim >= 0);
      n *= static_cast<uint64_t>(dim);  // cannot wrap: the parser checked every prefix product
    }
    require(n * deepinfer::dtype_size(entry.dtype) == entry.n_bytes());
    total += entry.n_bytes();
  }
  require(total == header->data_bytes);  // exact tiling: no gaps, no overlaps
  return 0;
}

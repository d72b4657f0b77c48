#include "kv/paged_kv_cache.h"

namespace deepinfer {

PagedKvCache::PagedKvCache(Backend& backend, const std::vector<KvLayerSpec>& layers, int64_t n_blocks,
                           int64_t block_size, DType dtype)
    : block_size_(block_size), pool_(n_blocks) {
  DI_CHECK_GT(block_size, 0);
  for (const KvLayerSpec& spec : layers) {
    DI_CHECK(spec.kind == KvKind::kMlaLatent);
    pages_.push_back(backend.allocate(dtype, {n_blocks, block_size, spec.width}));
    bytes_per_token_ += spec.width * static_cast<int64_t>(dtype_size(dtype));
  }
}

int64_t PagedKvCache::bytes_per_block(const std::vector<KvLayerSpec>& layers, int64_t block_size, DType dtype) {
  int64_t n = 0;
  for (const KvLayerSpec& spec : layers) n += spec.width * static_cast<int64_t>(dtype_size(dtype));
  return n * block_size;
}

}  // namespace deepinfer

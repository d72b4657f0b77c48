#include "kv/paged_kv_cache.h"

namespace deepinfer {

PagedKvCache::PagedKvCache(const std::vector<KvLayerSpec>& layers, int64_t n_blocks, int64_t block_size)
    : block_size_(block_size), pool_(n_blocks) {
  DI_CHECK_GT(block_size, 0);
  for (const KvLayerSpec& spec : layers) {
    DI_CHECK(spec.kind == KvKind::kMlaLatent);
    pages_.push_back(Tensor::empty_host(DType::kF32, {n_blocks, block_size, spec.width}));
    bytes_per_token_ += spec.width * static_cast<int64_t>(sizeof(float));
  }
}

}  // namespace deepinfer

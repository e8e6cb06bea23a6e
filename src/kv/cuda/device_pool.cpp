// The device K/V pool (kv_device.h): cudaMalloc'ed pools per storage layer, apply() replayed with
// async copies, writes through the kernel of kv_write.cu. Compiled only in CUDA builds.
#if ESCALA_HAVE_CUDA
#include "escala/kv_device.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <vector>

#include "kv/cuda/kv_write.h"

namespace escala::kv {

namespace {

Status cuda_fail(const char* what, cudaError_t e) {
  return Status::error(std::string("kv device pool: ") + what + ": " + cudaGetErrorString(e));
}

}  // namespace

struct DevicePool::Impl {
  CacheConfig cfg;
  int64_t num_blocks = 0;
  int32_t slots = 0;                // storage layers
  std::vector<int32_t> slot_of;     // model layer -> storage layer
  int64_t bytes = 0, scale_count = 0;
  std::vector<void*> k, v;
  std::vector<float*> ks, vs;

  ~Impl() {
    for (auto* p : k) cudaFree(p);
    for (auto* p : v) cudaFree(p);
    for (auto* p : ks) cudaFree(p);
    for (auto* p : vs) cudaFree(p);
  }
};

DevicePool::DevicePool(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DevicePool::~DevicePool() = default;

Result<std::unique_ptr<DevicePool>> DevicePool::create(const CacheConfig& c, int64_t num_blocks) {
  if (c.num_layers < 1 || c.num_kv_heads < 1 || num_blocks < 1 || c.block_size < 1)
    return Status::error("kv device pool: bad cache shape");
  if (c.head_dim < 1 || c.head_dim > 256) return Status::error("kv device pool: head_dim must be in [1, 256]");
  auto impl = std::make_unique<Impl>();
  impl->cfg = c;
  impl->num_blocks = num_blocks;
  impl->slot_of.assign(size_t(c.num_layers), 0);
  if (c.groups.empty()) {
    for (int32_t l = 0; l < c.num_layers; ++l) impl->slot_of[size_t(l)] = l;
    impl->slots = c.num_layers;
  } else {
    for (const auto& g : c.groups) {
      for (size_t j = 0; j < g.layers.size(); ++j) {
        if (g.layers[j] < 0 || g.layers[j] >= c.num_layers) return Status::error("kv device pool: bad layer group");
        impl->slot_of[size_t(g.layers[j])] = int32_t(j);
      }
      impl->slots = std::max<int32_t>(impl->slots, int32_t(g.layers.size()));
    }
  }
  impl->bytes = num_blocks * c.block_size * int64_t(c.num_kv_heads) * c.head_dim * int64_t(dtype_size(c.dtype));
  if (c.dtype == DType::kI8) impl->scale_count = num_blocks * c.block_size * int64_t(c.num_kv_heads);
  if (c.dtype == DType::kFp8E4M3) impl->scale_count = num_blocks * int64_t(c.num_kv_heads);
  for (int32_t j = 0; j < impl->slots; ++j) {
    void* kp = nullptr;
    void* vp = nullptr;
    cudaError_t e = cudaMalloc(&kp, size_t(impl->bytes));
    if (e == cudaSuccess) impl->k.push_back(kp), e = cudaMalloc(&vp, size_t(impl->bytes));
    if (e == cudaSuccess) impl->v.push_back(vp);
    if (e == cudaSuccess && impl->scale_count > 0) {
      float* a = nullptr;
      float* b = nullptr;
      e = cudaMalloc(&a, size_t(impl->scale_count) * 4);
      if (e == cudaSuccess) impl->ks.push_back(a), e = cudaMalloc(&b, size_t(impl->scale_count) * 4);
      if (e == cudaSuccess) impl->vs.push_back(b), e = cudaMemset(a, 0, size_t(impl->scale_count) * 4);
      if (e == cudaSuccess) e = cudaMemset(b, 0, size_t(impl->scale_count) * 4);
    }
    if (e != cudaSuccess) return cuda_fail("allocating the pools", e);
  }
  return std::unique_ptr<DevicePool>(new DevicePool(std::move(impl)));
}

Status DevicePool::apply(const ApplyLog& log, void* stream_ptr) {
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  const Impl& m = *impl_;
  const int64_t row_bytes = int64_t(m.cfg.num_kv_heads) * m.cfg.head_dim * int64_t(dtype_size(m.cfg.dtype));
  const int64_t page_bytes = row_bytes * m.cfg.block_size;
  for (const BlockCopy& c : log.copies) {
    if (c.src < 0 || c.dst < 0 || c.src >= m.num_blocks || c.dst >= m.num_blocks || c.tokens < 0 ||
        c.tokens > m.cfg.block_size)
      return Status::error("kv device pool: bad block copy");
    for (int32_t j = 0; j < m.slots; ++j) {
      for (int side = 0; side < 2; ++side) {
        auto* base = static_cast<uint8_t*>(side ? m.v[size_t(j)] : m.k[size_t(j)]);
        cudaError_t e = cudaMemcpyAsync(base + c.dst * page_bytes, base + c.src * page_bytes, size_t(c.tokens * row_bytes),
                                        cudaMemcpyDeviceToDevice, stream);
        if (e == cudaSuccess && m.scale_count > 0) {
          float* s = side ? m.vs[size_t(j)] : m.ks[size_t(j)];
          const int64_t per = m.cfg.dtype == DType::kI8 ? int64_t(m.cfg.block_size) * m.cfg.num_kv_heads : m.cfg.num_kv_heads;
          const int64_t n = m.cfg.dtype == DType::kI8 ? int64_t(c.tokens) * m.cfg.num_kv_heads : m.cfg.num_kv_heads;
          e = cudaMemcpyAsync(s + c.dst * per, s + c.src * per, size_t(n) * 4, cudaMemcpyDeviceToDevice, stream);
        }
        if (e != cudaSuccess) return cuda_fail("copy-on-write", e);
      }
    }
  }
  if (m.cfg.dtype == DType::kFp8E4M3) {
    for (int32_t b : log.fresh_blocks) {
      if (b < 0 || b >= m.num_blocks) return Status::error("kv device pool: bad fresh block");
      for (int32_t j = 0; j < m.slots; ++j) {
        cudaError_t e = cudaMemsetAsync(m.ks[size_t(j)] + int64_t(b) * m.cfg.num_kv_heads, 0, size_t(m.cfg.num_kv_heads) * 4, stream);
        if (e == cudaSuccess)
          e = cudaMemsetAsync(m.vs[size_t(j)] + int64_t(b) * m.cfg.num_kv_heads, 0, size_t(m.cfg.num_kv_heads) * 4, stream);
        if (e != cudaSuccess) return cuda_fail("resetting fp8 scales", e);
      }
    }
  }
  return {};
}

Status DevicePool::write(int32_t layer, const float* k, const float* v, const int32_t* slots, int32_t n, void* stream) {
  const Impl& m = *impl_;
  if (layer < 0 || layer >= m.cfg.num_layers) return Status::error("kv device pool: layer out of range");
  if (n < 0) return Status::error("kv device pool: negative token count");
  if (n == 0) return {};
  if (!k || !v || !slots) return Status::error("kv device pool: null input");
  const int32_t j = m.slot_of[size_t(layer)];
  KvWriteArgs a;
  a.k = static_cast<uint8_t*>(m.k[size_t(j)]), a.v = static_cast<uint8_t*>(m.v[size_t(j)]);
  a.k_scale = m.scale_count ? m.ks[size_t(j)] : nullptr, a.v_scale = m.scale_count ? m.vs[size_t(j)] : nullptr;
  a.k_in = k, a.v_in = v, a.slots = slots, a.n = n;
  a.h_kv = m.cfg.num_kv_heads, a.d = m.cfg.head_dim, a.block_size = m.cfg.block_size;
  a.dtype = m.cfg.dtype, a.hadamard = m.cfg.hadamard_keys;
  const cudaError_t e = launch_kv_write(a, static_cast<cudaStream_t>(stream));
  return e == cudaSuccess ? Status{} : cuda_fail("write kernel launch", e);
}

Status DevicePool::bind(int32_t layer, attn::AttentionParams& p) const {
  const Impl& m = *impl_;
  if (layer < 0 || layer >= m.cfg.num_layers) return Status::error("kv device pool: layer out of range");
  const int32_t j = m.slot_of[size_t(layer)];
  p.k = m.k[size_t(j)], p.v = m.v[size_t(j)];
  p.kv_dtype = m.cfg.dtype;
  p.num_kv_heads = m.cfg.num_kv_heads;
  p.page_size = m.cfg.block_size;
  p.k_row_stride = p.v_row_stride = int64_t(m.cfg.num_kv_heads) * m.cfg.head_dim;
  p.k_head_stride = p.v_head_stride = m.cfg.head_dim;
  p.k_page_stride = p.v_page_stride = int64_t(m.cfg.block_size) * p.k_row_stride;
  p.k_scale = m.scale_count ? m.ks[size_t(j)] : nullptr;
  p.v_scale = m.scale_count ? m.vs[size_t(j)] : nullptr;
  return {};
}

const void* DevicePool::data(int32_t layer, bool is_v) const {
  const int32_t j = impl_->slot_of[size_t(layer)];
  return is_v ? impl_->v[size_t(j)] : impl_->k[size_t(j)];
}
const float* DevicePool::scales(int32_t layer, bool is_v) const {
  if (impl_->scale_count == 0) return nullptr;
  const int32_t j = impl_->slot_of[size_t(layer)];
  return is_v ? impl_->vs[size_t(j)] : impl_->ks[size_t(j)];
}
int64_t DevicePool::pool_bytes() const { return impl_->bytes; }
int64_t DevicePool::scale_count() const { return impl_->scale_count; }

}  // namespace escala::kv
#endif  // ESCALA_HAVE_CUDA

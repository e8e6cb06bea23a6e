// CUDA backend entry point: checks what the CUDA kernels support, builds the kernel params and
// dispatches on kernel, head dim and dtype. Asynchronous on the caller's stream; the only
// synchronisation is the fallback read of cu_seqlens when the caller gives neither host copies nor
// bounds (to size the grid), and growing the cached decode workspace.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "attention/cuda/decode/decode.h"
#include "attention/cuda/decode/split_rule.h"
#include "attention/cuda/device_scratch.h"
#include "attention/cuda/fwd_params.h"
#include "attention/cuda/dispatch.h"
#include "attention/cuda/sm80/fwd_sm80.h"
#include "attention/cuda/sm90/fwd_sm90.h"
#include "escala/attention_cuda.h"

namespace escala::attn {

namespace {

Status cuda_error(const char* what, cudaError_t e) {
  return Status::error(std::string("attention_cuda: ") + what + ": " + cudaGetErrorString(e));
}

bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; }

Status fail(const std::string& m) { return Status::error("attention_cuda: " + m); }

// What both kernels require.
Status check_common(const AttentionParams& p) {
  if (!p.q || !p.k || !p.v || !p.o) return fail("q, k, v and o must all be given");
  if (p.batch < 1 || p.batch > 65535) return fail("batch must be in [1, 65535]");
  if (!p.cu_seqlens_q || !p.cu_seqlens_k) return fail("cu_seqlens_q and cu_seqlens_k are required");
  if (p.num_heads < 1 || p.num_kv_heads < 1 || p.num_heads > 65535) return fail("bad head counts");
  if (p.num_heads % p.num_kv_heads != 0) return fail("num_heads must be divisible by num_kv_heads");
  const int dv = p.head_dim_v ? p.head_dim_v : p.head_dim;
  // The prefill kernels zero-pad a head dim to their tile width (64, 128, 192 or 256 on sm_90).
  for (int d : {p.head_dim, dv})
    if (d < 8 || d > 256 || d % 8 != 0)
      return fail("head dims must be multiples of 8 in [8, 256], got " + std::to_string(d));
  const bool half = p.q_dtype == DType::kBF16 || p.q_dtype == DType::kF16;
  if (!half || p.o_dtype != p.q_dtype) return fail("CUDA attention needs q and o both bf16 or both f16");
  if (p.rope_inv_freq) return fail("rope at read time not supported on CUDA yet");
  if (p.window_left < -1 || p.window_right < -1 || p.num_sinks < 0) return fail("bad window or sink counts");
  if (!(std::isfinite(p.softcap) && p.softcap >= 0.0f)) return fail("softcap must be finite and >= 0");
  if (!(effective_scale(p) > 0.0f) || !std::isfinite(effective_scale(p)))
    return fail("softmax_scale must be positive and finite on CUDA");
  if (!aligned16(p.q) || !aligned16(p.k) || !aligned16(p.v) || !aligned16(p.o))
    return fail("q, k, v and o must be 16-byte aligned");
  const int64_t strides[] = {p.q_row_stride, p.q_head_stride, p.o_row_stride, p.o_head_stride};
  for (int64_t s : strides)
    if (s <= 0 || s % 8 != 0) return fail("strides must be positive multiples of 8 elements");
  return {};
}

// The decode kernel's head dims (one instantiation each, d_v == d_qk).
bool decode_supports(const AttentionParams& p) {
  const int dv = p.head_dim_v ? p.head_dim_v : p.head_dim;
  return dv == p.head_dim && (p.head_dim == 64 || p.head_dim == 128 || p.head_dim == 256);
}

int tile_width(int d) { return d <= 64 ? 64 : d <= 128 ? 128 : d <= 192 ? 192 : 256; }

// Whether the sm_90 prefill kernel can read these paged K/V: pages stacked row after row in the
// pool, read as TMA boxes of min(page_size, key tile) rows (a multiple of 16 that divides both).
int sm90_paged_box_rows(const AttentionParams& p) {
  if (p.page_size <= 0 || p.kv_dtype != p.q_dtype || !p.page_indptr || !p.page_indices) return 0;
  if (!decode_supports(p)) return 0;  // the paged variant exists for head dims 64, 128, 256
  if (p.k_page_stride != p.page_size * p.k_row_stride || p.v_page_stride != p.page_size * p.v_row_stride) return 0;
  const int dv = p.head_dim_v ? p.head_dim_v : p.head_dim;
  const int bn = cuda::sm90_block_n(tile_width(p.head_dim), tile_width(dv));
  // The widest box of a multiple of 16 rows that divides both the key tile and the page.
  for (int box = std::min(p.page_size, bn) / 16 * 16; box >= 16; box -= 16)
    if (bn % box == 0 && p.page_size % box == 0) return box;
  return 0;
}

Status check_prefill(const AttentionParams& p) {
  if (p.kv_dtype != p.q_dtype) return fail("the CUDA prefill kernel needs K/V in the query dtype");
  const int64_t strides[] = {p.k_row_stride, p.k_head_stride, p.v_row_stride, p.v_head_stride};
  for (int64_t s : strides)
    if (s <= 0 || s % 8 != 0) return fail("strides must be positive multiples of 8 elements");
  return {};
}

Status check_decode(const AttentionParams& p) {
  if (!decode_supports(p))
    return fail("the decode kernel (paged, quantized or forced K/V) needs head_dim 64, 128 or 256 and head_dim_v == "
                "head_dim, got " + std::to_string(p.head_dim) + "/" + std::to_string(p.head_dim_v ? p.head_dim_v : p.head_dim));
  const bool quant = p.kv_dtype == DType::kI8 || p.kv_dtype == DType::kFp8E4M3;
  if (p.kv_dtype != p.q_dtype && !quant) return fail("K/V must be in the query dtype, int8 or fp8");
  if (quant && (!p.k_scale || !p.v_scale)) return fail("quantized K/V need k_scale and v_scale");
  if (p.kv_dtype == DType::kFp8E4M3 && p.page_size == 0) return fail("fp8 K/V (a scale per page) must be paged");
  if (p.page_size < 0) return fail("page_size must be >= 0");
  if (p.page_size > 0 && (!p.page_indptr || !p.page_indices)) return fail("paged K/V need page_indptr and page_indices");
  // Rows are read in 16-byte chunks.
  const int64_t per16 = quant ? 16 : 8;
  const int64_t strides[] = {p.k_row_stride, p.k_head_stride, p.v_row_stride, p.v_head_stride,
                             p.k_page_stride, p.v_page_stride};
  const int checked = p.page_size > 0 ? 6 : 4;  // page strides only matter when paged
  for (int i = 0; i < checked; ++i)
    if (strides[i] <= 0 || strides[i] % per16 != 0)
      return fail("K/V strides must be positive multiples of " + std::to_string(per16) + " elements");
  return {};
}

cuda::KvFormat kv_format(DType t) {
  if (t == DType::kI8) return cuda::KvFormat::kInt8;
  if (t == DType::kFp8E4M3) return cuda::KvFormat::kFp8;
  return cuda::KvFormat::kHalf;
}

int sm_count() {
  static const int n = [] {
    int dev = 0, sms = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
      return 1;
    return sms > 0 ? sms : 1;
  }();
  return n;
}

int row_tiles(const AttentionParams& p, int max_q_len) {
  const int group = p.num_heads / p.num_kv_heads, per = cuda::decode_rows_per_cta(max_q_len, group);
  return (max_q_len * group + per - 1) / per;
}

// The decode workspace's first bytes: one int32 per (sequence, kv head, row tile), the in-place
// merge's counters, rounded up to 256 bytes so that the partials stay aligned.
size_t decode_counter_bytes(const AttentionParams& p, int max_q_len) {
  if (p.num_kv_heads < 1 || p.num_heads < 1 || max_q_len < 1) return 0;
  const size_t units = size_t(std::max(p.batch, 0)) * p.num_kv_heads * row_tiles(p, max_q_len);
  return (units * sizeof(int32_t) + 255) / 256 * 256;
}

bool is_hopper() {
  static const bool h = [] {
    int dev = 0, major = 0, minor = 0;
    return cudaGetDevice(&dev) == cudaSuccess &&
           cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
           cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess && major == 9 &&
           minor == 0;
  }();
  return h;
}

// Tensor maps for the decode kernel's TMA path, cached by everything they encode (a stale entry
// for a freed and reused address is still the right map for the same shape).
bool kv_maps(const AttentionParams& p, int64_t rows, cuda::KvMaps& out) {
  using Key = std::tuple<const void*, const void*, int, int, int, int64_t, int64_t, int64_t, int64_t, int64_t>;
  static std::mutex mu;
  static std::map<Key, cuda::KvMaps> cache;
  const int eb = static_cast<int>(dtype_size(p.kv_dtype));
  const Key key{p.k, p.v, eb, p.head_dim, p.num_kv_heads, rows, p.k_head_stride, p.k_row_stride, p.v_head_stride,
                p.v_row_stride};
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(key);
  if (it == cache.end()) {
    cuda::KvMaps m{};
    if (cuda::make_kv_box_map(&m.k, p.k, eb, p.head_dim, p.num_kv_heads, rows, p.k_head_stride, p.k_row_stride, 16) !=
            cudaSuccess ||
        cuda::make_kv_box_map(&m.v, p.v, eb, p.head_dim, p.num_kv_heads, rows, p.v_head_stride, p.v_row_stride, 16) !=
            cudaSuccess)
      return false;
    if (cache.size() > 4096) cache.clear();
    it = cache.emplace(key, m).first;
  }
  out = it->second;
  return true;
}

// Split-KV for the sm_90 prefill kernel: only when its items fill less than one wave (few long
// query tiles: chunked prefill, the cascade's prefix pass) and the merge has a kernel for d_v. The
// count minimises the makespan in key tiles, waves x (tiles per split + what an item costs besides
// its tiles: the Q load and pipeline ramp, the partial O written and merged, ~2 tiles), the fewest
// on a tie. (Without that term, 32 query tiles over 256 key tiles chose 37 splits, 9 waves of 7
// tiles, over 4 splits, 1 wave of 64: the cascade's paged prefix pass took 231 us against 220,
// and merging 37 partials 23 us against 6.5.)
int prefill_num_splits(const AttentionParams& p, const CudaOptions& options, int max_q_len, int max_kv_len,
                       int block_n) {
  const int dv = p.head_dim_v ? p.head_dim_v : p.head_dim;
  // The split variant: square tile widths other than 192, and a merge kernel for d_v.
  const int wq = tile_width(p.head_dim), wv = tile_width(dv);
  if ((dv != 64 && dv != 128 && dv != 256) || wq != wv || wq == 192) return 1;
  if (options.num_splits > 0) return std::min(options.num_splits, 1024);
  const int64_t items = int64_t((max_q_len + 127) / 128) * p.batch * p.num_heads;
  const int64_t tiles = (int64_t(max_kv_len) + block_n - 1) / block_n;
  const int64_t sms = sm_count();
  if (items >= sms || tiles < 8) return 1;
  constexpr int64_t kItemOverheadTiles = 2;
  int64_t best = 1, best_cost = tiles + kItemOverheadTiles;  // one split: one wave of `tiles`
  for (int64_t s = 2; s <= std::min<int64_t>(64, tiles / 4); ++s) {
    const int64_t cost = (items * s + sms - 1) / sms * ((tiles + s - 1) / s + kItemOverheadTiles);
    if (cost < best_cost) best = s, best_cost = cost;
  }
  return static_cast<int>(best);
}

size_t prefill_partial_bytes(const AttentionParams& p, int max_q_len, int num_splits) {
  if (num_splits <= 1) return 0;
  const int dv = p.head_dim_v ? p.head_dim_v : p.head_dim;
  const size_t parts = size_t(p.batch) * max_q_len * p.num_heads * num_splits;
  return parts * (size_t(dv) + 1) * sizeof(float);
}

Status run_decode(const AttentionParams& p, const CudaOptions& options, int max_q_len, int max_kv_len,
                  int64_t total_kv, cudaStream_t stream) {
  ESCALA_RETURN_IF_ERROR(check_decode(p));
  cuda::DecodeParams k;
  k.q = p.q, k.k = p.k, k.v = p.v, k.o = p.o, k.lse = p.lse, k.sink_logits = p.sink_logits;
  k.q_row_stride = p.q_row_stride, k.q_head_stride = p.q_head_stride;
  k.k_row_stride = p.k_row_stride, k.k_head_stride = p.k_head_stride, k.k_page_stride = p.k_page_stride;
  k.v_row_stride = p.v_row_stride, k.v_head_stride = p.v_head_stride, k.v_page_stride = p.v_page_stride;
  k.o_row_stride = p.o_row_stride, k.o_head_stride = p.o_head_stride;
  k.cu_seqlens_q = p.cu_seqlens_q, k.cu_seqlens_k = p.cu_seqlens_k;
  k.page_size = p.page_size, k.page_indptr = p.page_indptr, k.page_indices = p.page_indices;
  k.page_div = cuda::page_divisor(p.page_size);
  k.k_scale = p.k_scale, k.v_scale = p.v_scale;
  k.batch = p.batch, k.num_heads = p.num_heads, k.num_kv_heads = p.num_kv_heads;
  k.group = p.num_heads / p.num_kv_heads;
  k.rows_per_cta = cuda::decode_rows_per_cta(max_q_len, k.group);
  k.row_tiles = row_tiles(p, max_q_len);
  k.max_q_len = max_q_len;
  k.scale = effective_scale(p);
  k.scale_log2 = k.scale * 1.4426950408889634f;
  k.softcap = p.softcap;
  k.mask = Mask{p.causal, p.window_left, p.window_right, p.num_sinks};
  if (int64_t(k.num_kv_heads) * k.row_tiles > 65535) return fail("too many query rows per sequence for the decode kernel");
  k.num_splits = options.num_splits > 0 ? options.num_splits : decode_num_splits(p, max_q_len, max_kv_len);
  if (k.num_splits > 65535) return fail("num_splits must be <= 65535");
  if (k.num_splits > 1) {
    // Workspace: the in-place merge's counters (decode_counter_bytes), then the split partials.
    // 8- and 16-row CTAs merge in place (a few rows per CTA); 64-row ones leave it to the merge kernel,
    // which spreads their rows over the whole GPU.
    const bool in_place = k.rows_per_cta != 64;
    const size_t bytes = decode_workspace_bytes(p, max_q_len, k.num_splits);
    const size_t counter_bytes = decode_counter_bytes(p, max_q_len);
    uint8_t* ws = static_cast<uint8_t*>(options.workspace);
    cudaError_t e = cudaSuccess;
    if (ws != nullptr) {
      if (options.workspace_bytes < bytes)
        return fail("workspace too small: " + std::to_string(options.workspace_bytes) + " < " + std::to_string(bytes) +
                    " bytes");
      // The caller's buffer may hold anything: zero the counters on the stream (capturable).
      if (in_place) {
        k.merge_counters = reinterpret_cast<int32_t*>(ws);
        e = cudaMemsetAsync(k.merge_counters, 0, counter_bytes, stream);
        if (e != cudaSuccess) return cuda_error("zeroing the decode workspace's counters", e);
      }
    } else {
      // The library's own, per stream: counters kept zero between launches, so no memset per call.
      static cuda::StreamScratch scratch;
      static cuda::StreamScratch counters(/*zeroed=*/true);
      ws = static_cast<uint8_t*>(scratch.get(stream, bytes, e));
      if (ws == nullptr) return cuda_error("allocating the decode workspace", e);
      if (in_place) {
        k.merge_counters = static_cast<int32_t*>(counters.get(stream, counter_bytes, e));
        if (k.merge_counters == nullptr) return cuda_error("allocating the decode merge counters", e);
      }
    }
    const size_t parts = size_t(p.batch) * max_q_len * p.num_heads * k.num_splits;
    k.part_o = reinterpret_cast<float*>(ws + counter_bytes);
    k.part_lse = k.part_o + parts * p.head_dim;
  }
  const bool bf16 = p.q_dtype == DType::kBF16;
  const cuda::KvFormat f = kv_format(p.kv_dtype);
  // TMA boxes of 16 rows of one head: Hopper, 128-byte rows, the per-warp form, and rows that a
  // 2-D view {row, element} covers: pages of a multiple of 16 tokens stacked row after row, or a
  // contiguous buffer of known length. (256-byte rows as two swizzled 128-byte boxes measured 5-8%
  // slower than cp.async at 64 x 4k and 128 x 32k on the H200, 2026-11-29.)
  cuda::KvMaps maps{};
  const int64_t eb = int64_t(dtype_size(p.kv_dtype));
  const bool paged_rows = p.page_size > 0 && p.page_size % 16 == 0 && p.k_page_stride == p.page_size * p.k_row_stride &&
                          p.v_page_stride == p.page_size * p.v_row_stride;
  const int64_t view_rows = p.page_size > 0 ? (paged_rows ? int64_t(INT32_MAX) : 0) : total_kv;
  const int64_t row_bytes = p.head_dim * eb;
  if (is_hopper() && row_bytes == 128 && k.rows_per_cta != 64 && view_rows > 0 && kv_maps(p, view_rows, maps))
    k.use_tma = 1;
  k.dependent_merge = is_hopper() ? 1 : 0;
  cudaError_t e = cudaSuccess;
  switch (p.head_dim) {
    case 64: e = cuda::run_decode_hd64(k, maps, bf16, f, stream); break;
    case 128: e = cuda::run_decode_hd128(k, maps, bf16, f, stream); break;
    default: e = cuda::run_decode_hd256(k, maps, bf16, f, stream); break;
  }
  if (e != cudaSuccess) return cuda_error("decode kernel launch", e);
  return {};
}

}  // namespace

int decode_num_splits(const AttentionParams& p, int max_q_len, int max_kv_len) {
  if (p.num_kv_heads < 1 || p.num_heads < p.num_kv_heads || max_q_len < 1) return 1;
  const cuda::KvFormat f = kv_format(p.kv_dtype);
  const int rows_per_cta = cuda::decode_rows_per_cta(max_q_len, p.num_heads / p.num_kv_heads);
  const bool wide = rows_per_cta == 64;
  const int occupancy = p.head_dim <= 64    ? cuda::decode_ctas_per_sm_hd64(f, rows_per_cta)
                        : p.head_dim <= 128 ? cuda::decode_ctas_per_sm_hd128(f, rows_per_cta)
                                            : cuda::decode_ctas_per_sm_hd256(f, rows_per_cta);
  const int64_t slots = int64_t(sm_count()) * occupancy;
  const int64_t units = int64_t(p.batch) * p.num_kv_heads * row_tiles(p, max_q_len);
  const int64_t tile_keys = cuda::decode_tile_keys(p.head_dim * (f == cuda::KvFormat::kHalf ? 2 : 1));
  const int64_t n_tiles = (int64_t(max_kv_len) + tile_keys - 1) / tile_keys;
  // Two waves or more: no split. A partial last wave then costs less than a split's merge, because
  // the CTAs of a bandwidth-bound tail each get more of the bandwidth (H200: fp8 128 x 32k ran
  // 2.25 ms with one split against 2.34 ms with three; under two waves, fp8 64 x 4k ran 0.173 ms
  // with three splits against 0.186 ms with one).
  if (units >= 2 * slots) return 1;
  // One partial wave that still gives every SM a CTA: split only while the CTAs fit in that wave
  // and each warp keeps enough tiles (split_rule.h).
  if (units >= sm_count() && units <= slots)
    return cuda::partial_wave_splits(units, slots, n_tiles / (wide ? 1 : 4), f == cuda::KvFormat::kHalf ? 32 : 16);
  // Otherwise the fewest splits whose CTAs use 90% of their waves (split_rule.h: 192 CTAs on 264
  // slots leave 27% of the machine idle; 4 splits make 768 = 97% of three waves), keeping every warp
  // at least two 16-key tiles and the split count <= 1024.
  const int64_t max_splits = std::clamp<int64_t>((int64_t(max_kv_len) + 15) / 16 / 8, 1, 1024);
  return cuda::wave_fill_splits(units, slots, n_tiles, wide ? 1 : 4, max_splits);
}

size_t decode_workspace_bytes(const AttentionParams& p, int max_q_len, int num_splits) {
  if (num_splits <= 1) return 0;
  const size_t parts = size_t(p.batch) * max_q_len * p.num_heads * num_splits;
  return decode_counter_bytes(p, max_q_len) + parts * (size_t(p.head_dim) + 1) * sizeof(float);
}

bool cuda_available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

Status attention_cuda(const AttentionParams& p, void* stream, const CudaOptions& options) {
  return cuda::attention_cuda_arch(p, stream, options, cuda::KernelArch::kAuto);
}

Status cuda::attention_cuda_arch(const AttentionParams& p, void* stream_ptr, const CudaOptions& options,
                                 KernelArch arch, const Sm90Tuning& tuning) {
  if (options.impl == Impl::kReference) return fail("there is no reference kernel on CUDA");
  if (tuning.tile_rows != 0 && tuning.tile_rows != 128 && tuning.tile_rows != 192)
    return fail("sm90 tile rows must be 0, 128 or 192");
  if (tuning.tail_pairs < -1) return fail("sm90 tail pairs must be -1 (automatic) or >= 0");
  ESCALA_RETURN_IF_ERROR(check_common(p));
  auto stream = static_cast<cudaStream_t>(stream_ptr);

  // Sequence extents on the host: the longest query run sizes the grid, the totals size the TMA
  // tensor maps. Without host copies or bounds they are read back (a synchronisation).
  int max_q_len = 0, max_kv_len = 0;
  int64_t total_q = 0, total_kv = 0;
  const bool bounds_given = options.max_q_len > 0 && options.max_kv_len > 0;
  {
    const int32_t* hq = options.host_cu_seqlens_q;
    const int32_t* hk = options.host_cu_seqlens_k;
    std::vector<int32_t> cq, ck;
    if (!bounds_given && (hq == nullptr || hk == nullptr)) {
      cq.resize(static_cast<size_t>(p.batch) + 1), ck.resize(static_cast<size_t>(p.batch) + 1);
      cudaError_t e = cudaMemcpyAsync(cq.data(), p.cu_seqlens_q, cq.size() * 4, cudaMemcpyDeviceToHost, stream);
      if (e == cudaSuccess)
        e = cudaMemcpyAsync(ck.data(), p.cu_seqlens_k, ck.size() * 4, cudaMemcpyDeviceToHost, stream);
      if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
      if (e != cudaSuccess) return cuda_error("reading cu_seqlens", e);
      hq = cq.data(), hk = ck.data();
    }
    if (bounds_given) {
      max_q_len = options.max_q_len, max_kv_len = options.max_kv_len;
      total_q = int64_t(p.batch) * max_q_len, total_kv = int64_t(p.batch) * max_kv_len;
    } else {
      for (int b = 0; b < p.batch; ++b) {
        max_q_len = std::max(max_q_len, hq[b + 1] - hq[b]);
        max_kv_len = std::max(max_kv_len, hk[b + 1] - hk[b]);
      }
      total_q = hq[p.batch], total_kv = hk[p.batch];
    }
  }
  if (max_q_len <= 0) return {};

  // A forced prefill arch (tests, benchmarks) keeps short runs on that kernel. Paged K/V go to the
  // sm_90 prefill kernel where it can read them (Hopper, pages of 16 x n rows), else to decode.
  const int paged_box_rows = sm90_paged_box_rows(p);  // 0: the sm_90 kernel cannot read these pages
  const bool paged_prefill = p.page_size > 0 && is_hopper() && arch != KernelArch::kSm80 && paged_box_rows > 0 &&
                             (!bounds_given || options.host_cu_seqlens_k != nullptr);
  const bool needs_decode = (p.page_size != 0 && !paged_prefill) || p.kv_dtype != p.q_dtype;
  const bool short_runs =
      max_q_len <= 16 && arch == KernelArch::kAuto && options.impl == Impl::kAuto && decode_supports(p);
  const bool decode = options.impl == Impl::kDecode || needs_decode || short_runs;
  // Without host lengths (bounds only) the contiguous total is unknown: 0 turns the TMA path off.
  const int64_t known_total_kv = options.host_cu_seqlens_k ? int64_t(options.host_cu_seqlens_k[p.batch])
                                                           : (bounds_given ? 0 : total_kv);
  if (decode) return run_decode(p, options, max_q_len, max_kv_len, known_total_kv, stream);
  ESCALA_RETURN_IF_ERROR(check_prefill(p));

  // Pick the prefill kernel: the sm_90a one needs a Hopper device.
  const bool auto_arch = arch == KernelArch::kAuto;
  if (arch == KernelArch::kAuto) {
    int dev = 0, major = 0, minor = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    if (e != cudaSuccess) return cuda_error("querying the device", e);
    arch = (major == 9 && minor == 0) ? KernelArch::kSm90 : KernelArch::kSm80;
  }
  // The sm_90 kernel's TMA maps span the real totals, which bounds alone do not give.
  if (bounds_given && arch == KernelArch::kSm90 && options.host_cu_seqlens_k == nullptr) {
    if (!auto_arch) return fail("the sm_90 prefill kernel needs host cu_seqlens, not just bounds");
    arch = KernelArch::kSm80;
  }
  if (bounds_given && options.host_cu_seqlens_q && options.host_cu_seqlens_k)
    total_q = options.host_cu_seqlens_q[p.batch], total_kv = options.host_cu_seqlens_k[p.batch];

  cuda::FwdParams k;
  k.q = p.q, k.k = p.k, k.v = p.v, k.o = p.o, k.lse = p.lse, k.sink_logits = p.sink_logits;
  k.q_row_stride = p.q_row_stride, k.q_head_stride = p.q_head_stride;
  k.k_row_stride = p.k_row_stride, k.k_head_stride = p.k_head_stride;
  k.v_row_stride = p.v_row_stride, k.v_head_stride = p.v_head_stride;
  k.o_row_stride = p.o_row_stride, k.o_head_stride = p.o_head_stride;
  k.cu_seqlens_q = p.cu_seqlens_q, k.cu_seqlens_k = p.cu_seqlens_k;
  k.batch = p.batch, k.num_heads = p.num_heads, k.group = p.num_heads / p.num_kv_heads;
  k.scale = effective_scale(p);
  k.scale_log2 = k.scale * 1.4426950408889634f;
  k.softcap = p.softcap;
  k.mask = Mask{p.causal, p.window_left, p.window_right, p.num_sinks};
  k.d_qk = p.head_dim;
  k.d_v = p.head_dim_v ? p.head_dim_v : p.head_dim;
  if (p.page_size > 0) {
    if (arch != KernelArch::kSm90 || paged_box_rows == 0)
      return fail("paged K/V in the prefill kernel need the sm_90 kernel and pages of 16 x n stacked rows");
    k.page_size = p.page_size, k.kv_box_rows = paged_box_rows;
    k.page_div = cuda::page_divisor(p.page_size);
    k.page_indptr = p.page_indptr, k.page_indices = p.page_indices;
  }

  const bool bf16 = p.q_dtype == DType::kBF16;
  cudaError_t e = cudaSuccess;
  if (arch == KernelArch::kSm90) {
    // Tile widths: each head dim rounded up to 64, 128, 192 or 256; (192, 128) has its own kernel,
    // any other unequal pair runs in the wider square one.
    const int wq = tile_width(k.d_qk), wv = tile_width(k.d_v), w = std::max(wq, wv);
    k.max_q_len = max_q_len;
    k.num_splits = prefill_num_splits(p, options, max_q_len, max_kv_len, cuda::sm90_block_n(wq, wv));
    // Workspace: the work counter, then the split partials.
    const size_t part_bytes = prefill_partial_bytes(p, max_q_len, k.num_splits);
    uint8_t* ws = nullptr;
    if (options.workspace != nullptr) {
      if (options.workspace_bytes < 256 + part_bytes)
        return fail("workspace too small: " + std::to_string(options.workspace_bytes) + " < " +
                    std::to_string(256 + part_bytes) + " bytes");
      ws = static_cast<uint8_t*>(options.workspace);
      k.tile_counter = reinterpret_cast<int32_t*>(ws);
      // The caller's buffer may hold anything: zero the counters on the stream (capturable).
      e = cudaMemsetAsync(k.tile_counter, 0, 2 * sizeof(int32_t), stream);
      if (e != cudaSuccess) return cuda_error("zeroing the prefill workspace's counters", e);
    } else {
      // The work counters, one pair per stream, zeroed once: the kernel leaves them zero, so no
      // memset per call (a graph of calls was one memset node per call).
      static cuda::StreamScratch counters(/*zeroed=*/true);
      k.tile_counter = static_cast<int32_t*>(counters.get(stream, 2 * sizeof(int32_t), e));
      if (k.tile_counter == nullptr) return cuda_error("allocating the prefill work counter", e);
      if (part_bytes > 0) {
        static cuda::StreamScratch scratch;
        ws = static_cast<uint8_t*>(scratch.get(stream, 256 + part_bytes, e));
        if (ws == nullptr) return cuda_error("allocating the split workspace", e);
      }
    }
    if (k.num_splits > 1) {
      const size_t parts = size_t(p.batch) * max_q_len * p.num_heads * k.num_splits;
      k.part_o = reinterpret_cast<float*>(ws + 256);
      k.part_lse = k.part_o + parts * k.d_v;
    }
    const cuda::Sm90Extents ext{max_q_len, max_kv_len, total_q, total_kv, p.num_kv_heads,
                                tuning.tile_rows, tuning.tail_pairs, sm_count()};
    if (wq == 192 && wv == 128) e = cuda::run_fwd_sm90_hd192_128(k, bf16, ext, stream);
    else if (w == 64) e = cuda::run_fwd_sm90_hd64(k, bf16, ext, stream);
    else if (w == 128) e = cuda::run_fwd_sm90_hd128(k, bf16, ext, stream);
    else if (w == 192) e = cuda::run_fwd_sm90_hd192(k, bf16, ext, stream);
    else e = cuda::run_fwd_sm90_hd256(k, bf16, ext, stream);
    if (e == cudaSuccess && k.num_splits > 1) {
      // The decode path's merge kernel joins the splits (and the sink logit) into O and LSE.
      cuda::DecodeParams m;
      m.o = p.o, m.lse = p.lse, m.sink_logits = p.sink_logits;
      m.o_row_stride = p.o_row_stride, m.o_head_stride = p.o_head_stride;
      m.cu_seqlens_q = p.cu_seqlens_q, m.batch = p.batch, m.num_heads = p.num_heads;
      m.num_splits = k.num_splits, m.max_q_len = max_q_len, m.part_o = k.part_o, m.part_lse = k.part_lse;
      m.dependent_merge = 1;
      e = k.d_v == 64 ? cuda::run_merge_hd64(m, bf16, stream)
                      : (k.d_v == 128 ? cuda::run_merge_hd128(m, bf16, stream) : cuda::run_merge_hd256(m, bf16, stream));
    }
    // No sm_90a code in this build, or no TMA encoder in the driver: the portable kernel.
    if (e == cudaErrorNotSupported && auto_arch && p.page_size == 0) arch = KernelArch::kSm80;
  }
  if (arch == KernelArch::kSm80) {
    // Tile width 64, 128 or 256 for the wider of the two head dims.
    const int w = std::max(k.d_qk, k.d_v);
    if (w <= 64) e = cuda::run_fwd_sm80_hd64(k, bf16, max_q_len, stream);
    else if (w <= 128) e = cuda::run_fwd_sm80_hd128(k, bf16, max_q_len, stream);
    else e = cuda::run_fwd_sm80_hd256(k, bf16, max_q_len, stream);
  }
  if (e != cudaSuccess) return cuda_error("prefill kernel launch", e);
  return {};
}

}  // namespace escala::attn

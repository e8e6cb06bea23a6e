// The device pool's write kernel (kv_write.h).
#include "kv/cuda/kv_write.h"
#include "kv/row_codec.h"

namespace escala::kv {

namespace {

// One thread per (run of consecutive slots in one block, kv head, K or V): a run is written in slot
// order, as the host writes it, so an fp8 block's scale grows and re-encodes exactly as on the host.
__global__ void write_kernel(KvWriteArgs a) {
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t per_token = int64_t(a.h_kv) * 2;
  if (tid >= a.n * per_token) return;
  const int t0 = static_cast<int>(tid / per_token);
  const int head = static_cast<int>((tid / 2) % a.h_kv);
  const bool is_v = tid % 2;
  const int32_t s0 = a.slots[t0];
  if (t0 > 0 && a.slots[t0 - 1] + 1 == s0 && a.slots[t0 - 1] / a.block_size == s0 / a.block_size) return;  // not a run start
  uint8_t* base = is_v ? a.v : a.k;
  float* scales = is_v ? a.v_scale : a.k_scale;
  const size_t eb = dtype_size(a.dtype);
  float row[256];
  for (int t = t0; t < a.n; ++t) {
    const int32_t slot = a.slots[t];
    if (t > t0 && !(a.slots[t - 1] + 1 == slot && a.slots[t - 1] / a.block_size == slot / a.block_size)) break;
    const float* x = (is_v ? a.v_in : a.k_in) + (int64_t(t) * a.h_kv + head) * a.d;
    for (int c = 0; c < a.d; ++c) row[c] = x[c];
    if (a.hadamard && !is_v) hadamard_row(row, a.d);
    const int64_t r = (int64_t(slot) * a.h_kv + head) * a.d;
    const int32_t block = slot / a.block_size, in_block = slot % a.block_size;
    if (a.dtype == DType::kI8) {
      scales[int64_t(slot) * a.h_kv + head] = encode_i8_row(reinterpret_cast<int8_t*>(base) + r, row, a.d);
    } else if (a.dtype == DType::kFp8E4M3) {
      encode_fp8_row(base + r, &scales[int64_t(block) * a.h_kv + head], row, a.d, in_block, [&](int32_t s) {
        return base + ((int64_t(block) * a.block_size + s) * a.h_kv + head) * a.d;
      });
    } else {
      encode_float_row(base + r * int64_t(eb), a.dtype, row, a.d);
    }
  }
}

}  // namespace

cudaError_t launch_kv_write(const KvWriteArgs& a, cudaStream_t stream) {
  const int64_t threads = int64_t(a.n) * a.h_kv * 2;
  write_kernel<<<unsigned((threads + 127) / 128), 128, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace escala::kv

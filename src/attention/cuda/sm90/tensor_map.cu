// TMA tensor maps for the sm_90a kernel, encoded through the driver entry point fetched by the
// runtime (no link against libcuda).
#include <cudaTypedefs.h>

#include <mutex>

#include "attention/cuda/decode/decode.h"
#include "attention/cuda/sm90/fwd_sm90.h"

namespace escala::attn::cuda {

namespace {
PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      return static_cast<PFN_cuTensorMapEncodeTiled_v12000>(nullptr);
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(ptr);
  }();
  return fn;
}

// A 3-D map {d, head, row} (strides in bytes) with boxes of box_d x 1 x box_rows, 128-byte swizzle;
// `promotion`: how much L2 fetches from memory per miss.
cudaError_t encode_3d(CUtensorMap* map, const void* base, CUtensorMapDataType type, int elem_bytes, int d, int heads,
                      int64_t rows, int64_t head_stride, int64_t row_stride, int box_d, int box_rows,
                      CUtensorMapL2promotion promotion) {
  PFN_cuTensorMapEncodeTiled_v12000 fn = encode_fn();
  if (fn == nullptr) return cudaErrorNotSupported;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(d), static_cast<cuuint64_t>(heads),
                              static_cast<cuuint64_t>(rows > 0 ? rows : 1)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(head_stride) * elem_bytes,
                                 static_cast<cuuint64_t>(row_stride) * elem_bytes};
  const cuuint32_t box[3] = {static_cast<cuuint32_t>(box_d), 1, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  const CUresult r = fn(map, type, 3, const_cast<void*>(base), dims, strides, box, elem_strides,
                        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, promotion,
                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}
}  // namespace

cudaError_t make_tensor_map(CUtensorMap* map, const void* base, bool bf16, int d, int heads, int64_t rows,
                            int64_t head_stride, int64_t row_stride, int box_rows) {
  return encode_3d(map, base, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, d, heads,
                   rows, head_stride, row_stride, 64, box_rows, CU_TENSOR_MAP_L2_PROMOTION_L2_256B);
}

cudaError_t make_kv_box_map(CUtensorMap* map, const void* base, int elem_bytes, int d, int heads, int64_t rows,
                            int64_t head_stride, int64_t row_stride, int box_rows) {
  return encode_3d(map, base, elem_bytes == 1 ? CU_TENSOR_MAP_DATA_TYPE_UINT8 : CU_TENSOR_MAP_DATA_TYPE_UINT16,
                   elem_bytes, d, heads, rows, head_stride, row_stride, 128 / elem_bytes, box_rows,
                   // The decode kernel streams each row once, and a 128-byte row of one head sits
                   // between other heads' rows: promoting a miss to 256 bytes fetched a row no CTA
                   // was about to read (H200, fp8 128 x 32k: 9.42 GB from DRAM for 8.64 GB of K/V,
                   // 8.64 with 128-byte promotion, 2.26 -> 2.18 ms; bf16 d = 64 -6%).
                   CU_TENSOR_MAP_L2_PROMOTION_L2_128B);
}

}  // namespace escala::attn::cuda

// The device pool's write kernel (C++17, for nvcc): runs the host's row encoders on the device.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "escala/dtype.h"

namespace escala::kv {

struct KvWriteArgs {
  uint8_t* k;
  uint8_t* v;
  float* k_scale;
  float* v_scale;
  const float* k_in;
  const float* v_in;
  const int32_t* slots;
  int32_t n, h_kv, d, block_size;
  DType dtype;
  bool hadamard;
};

cudaError_t launch_kv_write(const KvWriteArgs& args, cudaStream_t stream);

}  // namespace escala::kv

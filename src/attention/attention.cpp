// The CPU entry point of the attention API: validate, then pick a kernel.
#include <fmt/format.h>

#include "attention/cpu/kernels.h"
#include "attention/reference.h"
#include "escala/attention.h"

namespace escala::attn {

namespace {
// Decode kernel when every sequence has a short query run (decode, speculative verification).
constexpr int kDecodeMaxQueries = 16;

bool short_queries(const AttentionParams& p) {
  for (int b = 0; b < p.batch; ++b)
    if (p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b] > kDecodeMaxQueries) return false;
  return true;
}

}  // namespace

Status attention(const AttentionParams& p, const CpuOptions& options) {
  ESCALA_RETURN_IF_ERROR(validate(p));
  ESCALA_CHECK_ARG(options.num_threads >= 0 && options.num_threads <= 4096, "attention: bad thread count {}",
                   options.num_threads);
  ESCALA_CHECK_ARG(options.num_splits >= 0 && options.num_splits <= 4096, "attention: bad split count {}",
                   options.num_splits);
  Impl impl = options.impl;
  if (impl == Impl::kAuto) {
    // Per sequence: short query runs go to the decode kernel, the rest to the flash kernel, so a
    // sequence's result never depends on what else is in the batch.
    const cpu::SeqRange short_range{0, kDecodeMaxQueries}, long_range{kDecodeMaxQueries + 1};
    if (short_queries(p)) {
      cpu::decode_attention(p, options.num_threads, options.num_splits);
    } else {
      cpu::flash_attention(p, options.num_threads, long_range);
      if (p.batch > 1) cpu::decode_attention(p, options.num_threads, options.num_splits, short_range);
    }
    return {};
  }
  switch (impl) {
    case Impl::kReference: attention_reference(p); break;
    case Impl::kDecode:
      ESCALA_CHECK_ARG(short_queries(p), "attention: the decode kernel takes at most {} queries per sequence",
                       kDecodeMaxQueries);
      cpu::decode_attention(p, options.num_threads, options.num_splits);
      break;
    default: cpu::flash_attention(p, options.num_threads); break;
  }
  return {};
}

}  // namespace escala::attn

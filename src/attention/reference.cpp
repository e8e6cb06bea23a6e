// The reference: materialises every score and accumulates in double. Exists to test the kernels.
#include "attention/reference.h"

#include <cmath>
#include <limits>
#include <vector>

#include "attention/kv_layout.h"
#include "attention/variant.h"

namespace escala::attn {

void attention_reference(const AttentionParams& p) {
  const int dv = p.head_dim_v ? p.head_dim_v : p.head_dim;
  const int group = p.num_heads / p.num_kv_heads;
  const double scale = effective_scale(p);
  const Mask mask{p.causal, p.window_left, p.window_right, p.num_sinks};
  const int64_t qb = dtype_size(p.q_dtype), ob = dtype_size(p.o_dtype);
  std::vector<double> s, acc(dv), key(p.head_dim);
  for (int b = 0; b < p.batch; ++b) {
    const int64_t q0 = p.cu_seqlens_q[b], q_len = p.cu_seqlens_q[b + 1] - q0;
    const int64_t kv_len = p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b];
    const KvSeq K = make_kv_seq(p, b, false), V = make_kv_seq(p, b, true);
    s.resize(kv_len);
    for (int h = 0; h < p.num_heads; ++h) {
      const int hk = h / group;
      for (int64_t i = 0; i < q_len; ++i) {
        const auto* qrow = static_cast<const uint8_t*>(p.q) + ((q0 + i) * p.q_row_stride + h * p.q_head_stride) * qb;
        const int64_t q_pos = i + kv_len - q_len;
        double m = -std::numeric_limits<double>::infinity();
        bool nan_score = false;  // std::max skips NaN: remembered here so that it reaches the output
        for (int64_t j = 0; j < kv_len; ++j) {
          if (!mask.visible(q_pos, j)) {
            s[j] = -std::numeric_limits<double>::infinity();
            continue;
          }
          for (int c = 0; c < p.head_dim; ++c) key[c] = K.load(j, hk, c);
          if (p.rope_inv_freq) apply_rope(key.data(), p.head_dim, j, p.rope_inv_freq, p.rope_neox);
          double dot = 0;
          for (int c = 0; c < p.head_dim; ++c) dot += double(load_float(qrow, p.q_dtype, c)) * key[c];
          double x = dot * scale;
          if (p.softcap > 0) x = p.softcap * std::tanh(x / p.softcap);
          s[j] = x;
          nan_score = nan_score || std::isnan(x);
          m = std::max(m, x);
        }
        const bool has_sink = p.sink_logits != nullptr;
        const double sink = has_sink ? double(p.sink_logits[h]) : -std::numeric_limits<double>::infinity();
        if (has_sink) m = std::max(m, sink);
        double denom = 0;
        std::fill(acc.begin(), acc.end(), 0.0);
        if (m != -std::numeric_limits<double>::infinity()) {
          for (int64_t j = 0; j < kv_len; ++j) {
            if (s[j] == -std::numeric_limits<double>::infinity()) continue;
            const double w = std::exp(s[j] - m);
            denom += w;
            for (int c = 0; c < dv; ++c) acc[c] += w * V.load(j, hk, c);
          }
          if (has_sink) denom += std::exp(sink - m);
        }
        // Non-finite inputs propagate: a NaN score, an infinite one (exp(inf - inf)) or a
        // non-finite value of a visible key makes the row NaN. denom is 0 only with nothing visible.
        if (nan_score) denom = std::numeric_limits<double>::quiet_NaN();
        auto* orow = static_cast<uint8_t*>(p.o) + ((q0 + i) * p.o_row_stride + h * p.o_head_stride) * ob;
        for (int c = 0; c < dv; ++c) store_float(orow, p.o_dtype, c, denom != 0 ? float(acc[c] / denom) : 0.0f);
        if (p.lse) {
          p.lse[(q0 + i) * p.num_heads + h] =
              denom != 0 ? float(m + std::log(denom)) : -std::numeric_limits<float>::infinity();
        }
      }
    }
  }
}

}  // namespace escala::attn

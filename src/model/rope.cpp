#include "model/rope.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numbers>

namespace escala::model {

namespace {
// YaRN: interpolate low frequencies, keep high ones, ramp in between (by wavelength vs context).
float yarn_ramp(float low, float high, int i) {
  const float y = (float(i) - low) / std::max(0.001f, high - low);
  return 1.0f - std::clamp(y, 0.0f, 1.0f);
}
float yarn_corr_dim(int dims, float orig_ctx, float rotations, float base) {
  return float(dims) * std::log(orig_ctx / (rotations * 2.0f * std::numbers::pi_v<float>)) / (2.0f * std::log(base));
}
}  // namespace

Result<RopeConfig> read_rope_config(const GgufFile& f, const ArchParams& a, bool neox) {
  RopeConfig r;
  r.dims = int32_t(a.rope_dimension_count);
  r.neox = neox;
  float base = a.rope_freq_base;
  const auto key = [&](std::string_view s) { return fmt::format("{}.{}", a.arch, s); };
  std::string type = "none";
  if (f.has(key("rope.scaling.type"))) type = std::string(*f.get_string(key("rope.scaling.type")));
  auto factor_r = f.get_f32_or(key("rope.scaling.factor"), 1.0f);
  if (!factor_r.ok()) return factor_r.status();
  const float factor = *factor_r;
  if (!(factor > 0.0f) || !std::isfinite(factor))
    return Status::error(fmt::format("model: rope.scaling.factor {} must be positive", factor));
  const int half = r.dims / 2;
  if (type == "ntk") base *= std::pow(factor, float(r.dims) / float(r.dims - 2));  // NTK-aware
  r.inv_freq.resize(half);
  for (int i = 0; i < half; ++i) r.inv_freq[i] = std::pow(base, -2.0f * float(i) / float(r.dims));
  if (type == "linear") {
    for (auto& x : r.inv_freq) x /= factor;
  } else if (type == "yarn") {
    auto orig = f.get_u32_or(key("rope.scaling.original_context_length"), a.context_length);
    if (!orig.ok()) return orig.status();
    // The correction range, clamped to the dimensions that exist (a short original context puts
    // its start below 0), as llama.cpp's ggml_rope_yarn_corr_dims does.
    const float lo = std::max(0.0f, std::floor(yarn_corr_dim(r.dims, float(*orig), 32.0f, base)));
    const float hi = std::min(float(r.dims - 1), std::ceil(yarn_corr_dim(r.dims, float(*orig), 1.0f, base)));
    for (int i = 0; i < half; ++i) {
      const float keep = yarn_ramp(lo, hi, i);  // 1: extrapolate (high frequency), 0: interpolate
      r.inv_freq[i] = r.inv_freq[i] / factor * (1.0f - keep) + r.inv_freq[i] * keep;
    }
    r.attn_factor = 0.1f * std::log(factor) + 1.0f;
  } else if (type != "none" && type != "ntk") {
    return Status::error(fmt::format("model: unknown rope.scaling.type '{}'", type));
  }
  // Llama 3 stores its per-frequency factors as a tensor.
  if (const GgufTensor* t = f.find_tensor("rope_freqs.weight")) {
    if (t->type != TensorType::kF32 || t->elements() != half)
      return Status::error(fmt::format("model: rope_freqs.weight must be f32 [{}]", half));
    const float* ff = reinterpret_cast<const float*>(t->data);
    for (int i = 0; i < half; ++i) {
      if (!(ff[i] > 0.0f)) return Status::error("model: rope_freqs.weight has a non-positive factor");
      r.inv_freq[i] /= ff[i];
    }
  }
  return r;
}

void build_rope_table(const RopeConfig& rope, std::span<const int64_t> positions, RopeTable& t) {
  const int half = rope.dims / 2;
  t.half = half;
  t.cs.resize(positions.size() * size_t(half));
  t.sn.resize(positions.size() * size_t(half));
  for (size_t r = 0; r < positions.size(); ++r) {
    float* cs = t.cs.data() + r * size_t(half);
    float* sn = t.sn.data() + r * size_t(half);
    for (int i = 0; i < half; ++i) {
      const double ang = double(positions[r]) * double(rope.inv_freq[i]);
      cs[i] = float(std::cos(ang)) * rope.attn_factor;
      sn[i] = float(std::sin(ang)) * rope.attn_factor;
    }
  }
}

void apply_rope(const RopeTable& t, bool neox, float* x, int64_t rows, int32_t heads, int32_t head_dim) {
  const int half = t.half;
  for (int64_t r = 0; r < rows; ++r) {
    const float* cs = t.cs.data() + r * half;
    const float* sn = t.sn.data() + r * half;
    for (int h = 0; h < heads; ++h) {
      float* v = x + (r * heads + h) * head_dim;
      if (neox) {
        float* v1 = v + half;
        for (int i = 0; i < half; ++i) {
          const float x0 = v[i], x1 = v1[i];
          v[i] = x0 * cs[i] - x1 * sn[i];
          v1[i] = x0 * sn[i] + x1 * cs[i];
        }
      } else {
        for (int i = 0; i < half; ++i) {
          const float x0 = v[2 * i], x1 = v[2 * i + 1];
          v[2 * i] = x0 * cs[i] - x1 * sn[i];
          v[2 * i + 1] = x0 * sn[i] + x1 * cs[i];
        }
      }
    }
  }
}

void apply_rope(const RopeConfig& rope, float* x, int64_t rows, int32_t heads, int32_t head_dim,
                std::span<const int64_t> positions) {
  RopeTable t;
  build_rope_table(rope, positions.first(size_t(rows)), t);
  apply_rope(t, rope.neox, x, rows, heads, head_dim);
}

}  // namespace escala::model

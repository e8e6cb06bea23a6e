// The RoPE frequency table under each scaling that GGUF metadata names, against the definitions
// computed here in double precision (as llama.cpp's ggml_rope_yarn computes them): none, linear,
// NTK-aware (a larger base; not one of llama.cpp's types), YaRN with an original context long
// enough that its correction range lies inside the dimensions and one so short that the range must
// be clamped to them, and Llama 3's rope_freqs factors. (scripts/compare_random_archs.py runs
// linear, YaRN and rope_freqs against llama.cpp itself.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>
#include <vector>

#include "escala/gguf.h"
#include "model/rope.h"

namespace escala::model {
namespace {

struct Scaling {
  std::string type = "none";
  float factor = 1.0f;
  uint32_t orig_ctx = 0;
  std::vector<float> freq_factors;  // rope_freqs.weight, when not empty
};

// inv_freq and attn_factor from the definitions.
std::pair<std::vector<double>, double> reference(int dims, double base, const Scaling& s) {
  const int half = dims / 2;
  // NTK-aware: a larger base instead of scaled positions.
  if (s.type == "ntk") base *= std::pow(double(s.factor), double(dims) / (dims - 2));
  std::vector<double> f(half);
  for (int i = 0; i < half; ++i) f[i] = std::pow(base, -2.0 * i / dims);
  double attn = 1.0;
  if (s.type == "linear") {
    for (double& x : f) x /= s.factor;
  } else if (s.type == "yarn") {
    auto corr = [&](double rotations) {
      return dims * std::log(s.orig_ctx / (rotations * 2 * std::numbers::pi)) / (2 * std::log(base));
    };
    const double lo = std::max(0.0, std::floor(corr(32))), hi = std::min(dims - 1.0, std::ceil(corr(1)));
    for (int i = 0; i < half; ++i) {
      const double keep = 1 - std::clamp((i - lo) / std::max(0.001, hi - lo), 0.0, 1.0);
      f[i] = f[i] / s.factor * (1 - keep) + f[i] * keep;
    }
    attn = 1 + 0.1 * std::log(s.factor);
  }
  for (int i = 0; i < int(s.freq_factors.size()); ++i) f[i] /= s.freq_factors[i];
  return {f, attn};
}

TEST(Rope, FrequenciesMatchTheDefinitions) {
  const int dims = 64;
  const double base = 500000.0;
  std::vector<float> llama3(dims / 2);
  for (int i = 0; i < dims / 2; ++i) llama3[i] = 1.0f + 7.0f * float(i) / float(dims / 2);
  const Scaling cases[] = {
      {},
      {"linear", 4.0f, 0, {}},
      {"ntk", 4.0f, 0, {}},
      {"yarn", 4.0f, 8192, {}},  // correction range inside [0, dims - 1]
      {"yarn", 8.0f, 16, {}},    // starts below 0: clamped
      {"none", 1.0f, 0, llama3},
  };
  for (const Scaling& s : cases) {
    GgufWriter w;
    w.set("general.architecture", GgufWriteValue::string("llama"));
    if (s.type != "none") {
      w.set("llama.rope.scaling.type", GgufWriteValue::string(s.type));
      w.set("llama.rope.scaling.factor", GgufWriteValue::f32(s.factor));
    }
    if (s.orig_ctx) w.set("llama.rope.scaling.original_context_length", GgufWriteValue::u32(s.orig_ctx));
    if (!s.freq_factors.empty()) {
      ASSERT_TRUE(w.add_tensor("rope_freqs.weight", TensorType::kF32, {int64_t(s.freq_factors.size())}, s.freq_factors).ok());
    }
    auto bytes = w.to_bytes();
    ASSERT_TRUE(bytes.ok()) << bytes.message();
    auto file = GgufFile::parse(*bytes);
    ASSERT_TRUE(file.ok()) << file.message();
    ArchParams a;
    a.arch = "llama";
    a.head_dim = a.rope_dimension_count = dims;
    a.rope_freq_base = float(base);
    a.context_length = 4096;
    auto r = read_rope_config(*file, a, false);
    ASSERT_TRUE(r.ok()) << r.message();
    const auto [want, attn] = reference(dims, base, s);
    ASSERT_EQ(r->inv_freq.size(), want.size());
    const std::string what = s.type + (s.orig_ctx ? " orig " + std::to_string(s.orig_ctx) : "") +
                             (s.freq_factors.empty() ? "" : " with rope_freqs");
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_NEAR(r->inv_freq[i], want[i], 2e-6 * want[i]) << what << ", pair " << i;
    EXPECT_NEAR(r->attn_factor, attn, 1e-6) << what;
  }
}

}  // namespace
}  // namespace escala::model

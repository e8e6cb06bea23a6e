// The KV-cache formula: the exact Llama-3-70B figure, every preset against a hand computation,
// Gemma 2's local-layer cap, the scales of the quantized formats, block/pool sizing and overflow.
#include <gtest/gtest.h>

#include "kv/planner.h"

namespace escala::kv {
namespace {

int64_t total(const ModelConfig& m, int64_t t, int64_t b, KvFormat f, int64_t block = 16) {
  auto r = kv_cache_bytes(m, t, b, f, block);
  EXPECT_TRUE(r.ok()) << r.message();
  return r.ok() ? r->total : -1;
}

ModelConfig preset(const char* name) {
  auto m = find_preset(name);
  EXPECT_TRUE(m.has_value()) << name;
  return m.value_or(ModelConfig{});
}

TEST(KvPlannerTest, Llama3_70B_At128kIsExactly40GiB) {
  ModelConfig m = preset("llama-3-70b");
  EXPECT_EQ(total(m, 131072, 1, KvFormat::kF16), 42949672960);
  EXPECT_EQ(total(m, 131072, 1, KvFormat::kF16), int64_t{40} << 30);
  ModelConfig mha = m;
  mha.num_kv_heads = m.num_heads;
  EXPECT_EQ(total(mha, 131072, 1, KvFormat::kF16), 343597383680);
  EXPECT_EQ(total(mha, 131072, 1, KvFormat::kF16), 8 * 42949672960);
  ModelConfig mqa = m;
  mqa.num_kv_heads = 1;
  EXPECT_EQ(total(mqa, 131072, 1, KvFormat::kF16), 42949672960 / 8);
}

// Each preset at its published context, fp16: 2 · L · T · h_kv · d · 2 written out by hand.
TEST(KvPlannerTest, EveryPresetMatchesAHandComputation) {
  struct Case {
    const char* name;
    int64_t layers, heads, kv_heads, dim, context, expected;
  };
  const Case cases[] = {
      {"llama-3-8b", 32, 32, 8, 128, 8192, 2LL * 32 * 8192 * 8 * 128 * 2},
      {"llama-3-70b", 80, 64, 8, 128, 8192, 2LL * 80 * 8192 * 8 * 128 * 2},
      {"llama-3.1-405b", 126, 128, 8, 128, 131072, 2LL * 126 * 131072 * 8 * 128 * 2},
      // every layer stores only its 4096-token window
      {"mistral-7b", 32, 32, 8, 128, 32768, 2LL * 32 * 4096 * 8 * 128 * 2},
      {"qwen2-7b", 28, 28, 4, 128, 32768, 2LL * 28 * 32768 * 4 * 128 * 2},
      // 21 global layers hold 8192 tokens, 21 local layers their 4096-token window
      {"gemma-2-9b", 42, 16, 8, 256, 8192, 2LL * (21 * 8192 + 21 * 4096) * 8 * 256 * 2},
      {"smollm2-135m", 30, 9, 3, 64, 8192, 2LL * 30 * 8192 * 3 * 64 * 2},
  };
  EXPECT_EQ(presets().size(), std::size(cases));
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const ModelConfig m = preset(c.name);
    EXPECT_EQ(m.num_layers, c.layers);
    EXPECT_EQ(m.num_heads, c.heads);
    EXPECT_EQ(m.num_kv_heads, c.kv_heads);
    EXPECT_EQ(m.head_dim, c.dim);
    EXPECT_EQ(m.max_context, c.context);
    EXPECT_TRUE(validate_config(m).ok());
    EXPECT_EQ(total(m, c.context, 1, KvFormat::kF16), c.expected);
    EXPECT_EQ(total(m, c.context, 3, KvFormat::kF16), 3 * c.expected) << "linear in the batch";
    EXPECT_EQ(total(m, c.context, 1, KvFormat::kF32), 2 * c.expected);
    EXPECT_EQ(total(m, c.context, 1, KvFormat::kBF16), c.expected);
  }
  EXPECT_EQ(total(preset("llama-3-8b"), 8192, 1, KvFormat::kF16), int64_t{1} << 30);  // the well-known 1 GiB
}

TEST(KvPlannerTest, GemmaLocalLayersAreCappedAtTheWindow) {
  const ModelConfig m = preset("gemma-2-9b");
  EXPECT_EQ(m.num_local_layers(), 21);
  EXPECT_EQ(m.num_global_layers(), 21);
  const int64_t per_token_layer = 2 * 8 * 256 * 2;  // K and V, 8 kv heads, d 256, fp16
  // Below the window every layer holds every token.
  EXPECT_EQ(total(m, 2048, 1, KvFormat::kF16), 42 * 2048 * per_token_layer);
  EXPECT_EQ(total(m, 4096, 1, KvFormat::kF16), 42 * 4096 * per_token_layer);
  // Past it, local layers stay at 4096 while global layers grow.
  EXPECT_EQ(total(m, 4097, 1, KvFormat::kF16), (21 * 4097 + 21 * 4096) * per_token_layer);
  EXPECT_EQ(total(m, 100000, 1, KvFormat::kF16), (21 * 100000LL + 21 * 4096) * per_token_layer);
  const auto groups = layer_groups(m);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].window, 0);
  EXPECT_EQ(groups[1].window, 4096);
  EXPECT_EQ(groups[1].resident_tokens(100000), 4096);
  EXPECT_EQ(groups[1].resident_tokens(100), 100);
  // With an odd layer count the local layers are 0, 2, ..., so one more than the global ones.
  ModelConfig odd = m;
  odd.num_layers = 5;
  EXPECT_EQ(odd.num_local_layers(), 3);
  // Mistral: every layer local; no global group.
  EXPECT_EQ(layer_groups(preset("mistral-7b")).size(), 1u);
  EXPECT_EQ(total(preset("mistral-7b"), 1000, 1, KvFormat::kF16), 2LL * 32 * 1000 * 8 * 128 * 2);
}

TEST(KvPlannerTest, QuantizedFormatsCountTheirScales) {
  const ModelConfig m = preset("llama-3-8b");  // 32 layers, 8 kv heads, d 128
  const int64_t T = 8192;
  auto int8 = *kv_cache_bytes(m, T, 1, KvFormat::kInt8);
  EXPECT_EQ(int8.data, 2LL * 32 * T * 8 * 128);
  EXPECT_EQ(int8.scales, 2LL * 32 * T * 8 * 4);  // f32 per (token, head), K and V
  EXPECT_EQ(int8.total, int8.data + int8.scales);
  auto fp8 = *kv_cache_bytes(m, T, 1, KvFormat::kFp8);
  EXPECT_EQ(fp8.data, 2LL * 32 * T * 8 * 128);
  EXPECT_EQ(fp8.scales, 2LL * 32 * (T / 16) * 8 * 4);  // f32 per (block, head), K and V
  auto fp8_b32 = *kv_cache_bytes(m, T, 1, KvFormat::kFp8, 32);
  EXPECT_EQ(fp8_b32.scales, fp8.scales / 2);
  // A partial block still has its scales.
  EXPECT_EQ(kv_cache_bytes(m, 17, 1, KvFormat::kFp8)->scales, 2LL * 32 * 2 * 8 * 4);
  auto int4 = *kv_cache_bytes(m, T, 1, KvFormat::kInt4);
  EXPECT_EQ(int4.data, 2LL * 32 * T * 8 * 64);                // two elements per byte
  EXPECT_EQ(int4.scales, 2LL * 32 * T * 8 * (128 / 32) * 2);  // f16 per 32 elements
  // A head dim that is not a multiple of the group rounds the groups up.
  EXPECT_EQ(*token_bytes_per_layer(1, 40, KvFormat::kInt4), 2 * (20 + 2 * 2));
  for (KvFormat f : {KvFormat::kF32, KvFormat::kF16, KvFormat::kBF16}) EXPECT_EQ(kv_cache_bytes(m, T, 1, f)->scales, 0);
}

TEST(KvPlannerTest, BlocksAndPoolSizing) {
  const ModelConfig m = preset("llama-3-8b");
  EXPECT_EQ(*token_bytes_per_layer(8, 128, KvFormat::kF16), 4096);
  EXPECT_EQ(*token_bytes_per_layer(8, 128, KvFormat::kInt8), 2 * 8 * (128 + 4));
  EXPECT_EQ(*block_scale_bytes_per_layer(8, KvFormat::kFp8), 2 * 8 * 4);
  EXPECT_EQ(*block_scale_bytes_per_layer(8, KvFormat::kInt8), 0);
  const int64_t block = *block_bytes(32, 8, 128, KvFormat::kF16, 16);
  EXPECT_EQ(block, 16 * 4096 * 32);
  EXPECT_EQ(*block_bytes(32, 8, 128, KvFormat::kFp8, 16), 32 * (16 * 2 * 8 * 128 + 2 * 8 * 4));
  EXPECT_EQ(*blocks_in_budget(int64_t{10} << 30, block), 5120);
  EXPECT_EQ(*blocks_in_budget(block - 1, block), 0);
  EXPECT_EQ(*blocks_in_budget(0, block), 0);
  // The paged cache and the formula agree whenever the block size divides the length ...
  for (KvFormat f : kAllFormats)
    for (const char* name : {"llama-3-8b", "gemma-2-9b", "mistral-7b", "smollm2-135m"}) {
      const ModelConfig p = preset(name);
      EXPECT_EQ(*paged_sequence_bytes(p, 8192, f, 16), total(p, 8192, 1, f, 16)) << name << " " << format_name(f);
    }
  // ... and otherwise the pool rounds up to whole blocks.
  EXPECT_EQ(*paged_sequence_bytes(m, 17, KvFormat::kF16, 16), 2 * block);
  EXPECT_GT(*paged_sequence_bytes(m, 17, KvFormat::kF16, 16), total(m, 17, 1, KvFormat::kF16));
}

TEST(KvPlannerTest, SequencesThatFit) {
  const int64_t per_seq = *paged_sequence_bytes(preset("llama-3-70b"), 131072, KvFormat::kF16, 16);
  EXPECT_EQ(per_seq, 42949672960);
  auto two = *sequences_that_fit(int64_t{80} << 30, 0, per_seq);
  EXPECT_EQ(two.sequences, 2);
  EXPECT_TRUE(two.message.empty());
  auto one = *sequences_that_fit(int64_t{80} << 30, int64_t{1} << 30, per_seq);
  EXPECT_EQ(one.sequences, 1);
  auto none = *sequences_that_fit(int64_t{80} << 30, int64_t{140} << 30, per_seq);
  EXPECT_EQ(none.sequences, 0);
  EXPECT_NE(none.message.find("do not fit"), std::string::npos) << none.message;
  auto tight = *sequences_that_fit(int64_t{80} << 30, int64_t{60} << 30, per_seq);
  EXPECT_EQ(tight.sequences, 0);
  EXPECT_NE(tight.message.find("one sequence needs"), std::string::npos) << tight.message;
  EXPECT_FALSE(sequences_that_fit(0, 0, per_seq).ok());
  EXPECT_FALSE(sequences_that_fit(100, -1, per_seq).ok());
}

TEST(KvPlannerTest, AbsurdInputsAreErrorsNotWrappedNumbers) {
  ModelConfig m = preset("llama-3-8b");
  EXPECT_FALSE(kv_cache_bytes(m, 0, 1, KvFormat::kF16).ok());
  EXPECT_FALSE(kv_cache_bytes(m, -5, 1, KvFormat::kF16).ok());
  EXPECT_FALSE(kv_cache_bytes(m, 8192, 0, KvFormat::kF16).ok());
  EXPECT_FALSE(kv_cache_bytes(m, 8192, 1, KvFormat::kF16, 0).ok());
  auto overflow = kv_cache_bytes(m, int64_t{1} << 40, int64_t{1} << 20, KvFormat::kF32);
  ASSERT_FALSE(overflow.ok());
  EXPECT_NE(overflow.message().find("overflows 2^63"), std::string::npos) << overflow.message();
  EXPECT_FALSE(kv_cache_bytes(m, INT64_MAX, 1, KvFormat::kInt4).ok());
  EXPECT_FALSE(block_bytes(32, 8, 128, KvFormat::kF16, INT64_MAX).ok());
  ModelConfig bad = m;
  bad.num_layers = 0;
  EXPECT_FALSE(validate_config(bad).ok());
  bad = m;
  bad.num_kv_heads = 3;  // 32 % 3 != 0
  EXPECT_FALSE(validate_config(bad).ok());
  bad = m;
  bad.num_kv_heads = 64;
  EXPECT_FALSE(validate_config(bad).ok());
  bad = m;
  bad.head_dim = -128;
  EXPECT_FALSE(validate_config(bad).ok());
  bad = m;
  bad.local = LocalLayers::kAll;  // local layers without a window
  EXPECT_FALSE(validate_config(bad).ok());
}

TEST(KvPlannerTest, ByteSizes) {
  EXPECT_EQ(*parse_byte_size("123"), 123);
  EXPECT_EQ(*parse_byte_size("0"), 0);
  EXPECT_EQ(*parse_byte_size("80GB"), 80'000'000'000);
  EXPECT_EQ(*parse_byte_size("80gb"), 80'000'000'000);
  EXPECT_EQ(*parse_byte_size("24GiB"), int64_t{24} << 30);
  EXPECT_EQ(*parse_byte_size("1.5GiB"), int64_t{3} << 29);
  EXPECT_EQ(*parse_byte_size("512MiB"), int64_t{512} << 20);
  EXPECT_EQ(*parse_byte_size("2MB"), 2'000'000);
  EXPECT_EQ(*parse_byte_size("1KiB"), 1024);
  EXPECT_EQ(*parse_byte_size("7B"), 7);
  EXPECT_EQ(*parse_byte_size("2TiB"), int64_t{2} << 40);
  EXPECT_EQ(*parse_byte_size("0.1B"), 0);  // rounded down to whole bytes
  EXPECT_EQ(*parse_byte_size("9223372036854775807"), INT64_MAX);
  for (const char* bad : {"", "GB", "-1", "+5", "80 GB", " 80GB", "80GB ", "1e9", "80XB", "80GBs", "1.GB", ".5GB",
                          "1..5GB", "0x10", "9223372036854775808", "8388608TiB", "99999999999999999999999999"}) {
    auto r = parse_byte_size(bad);
    EXPECT_FALSE(r.ok()) << "'" << bad << "' parsed as " << (r.ok() ? *r : 0);
  }
}

TEST(KvPlannerTest, FormatNames) {
  for (KvFormat f : kAllFormats) EXPECT_EQ(parse_format(format_name(f)), f);
  EXPECT_EQ(parse_format("f16"), KvFormat::kF16);
  EXPECT_FALSE(parse_format("fp4").has_value());
  EXPECT_EQ(format_of(DType::kI8), KvFormat::kInt8);
  EXPECT_EQ(format_of(DType::kFp8E4M3), KvFormat::kFp8);
  EXPECT_EQ(format_gib(int64_t{40} << 30), "40");
  EXPECT_EQ(format_gb(42949672960), "42.95");
}

}  // namespace
}  // namespace escala::kv

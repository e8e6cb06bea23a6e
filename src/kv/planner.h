// The KV-cache formula, written once. `escala kv-plan`, the paged block pool's capacity and the
// cache metrics all size memory through these functions, so they can never disagree.
//
//   bytes = 2 · L · B · T · h_kv · d_h · bytes_per_elem   (+ the quantization scales)
//
// 2 for K and V; L layers; B sequences of T tokens; h_kv key/value heads of d_h elements. A layer
// with a sliding window (Mistral v0.1, Gemma 2's local layers) stores only min(T, window) tokens.
//
// Storage formats and their scales, exactly as the cache stores them:
//   fp32, fp16, bf16  no scales.
//   int8              one f32 scale per (token, kv head), for K and for V.
//   fp8 (e4m3)        one f32 scale per (block, kv head), for K and for V; a sequence of T tokens
//                     has ceil(T / block_size) blocks of scales per layer.
//   int4              two elements per byte (a row of d elements takes ceil(d / 2) bytes), with one
//                     f16 scale per group of kInt4GroupSize = 32 consecutive elements of a
//                     (token, kv head) row (symmetric, no zero point), for K and for V. This is an
//                     assumption of the planner; the cache has no int4 storage yet.
// All arithmetic is checked: a result past 2^63 - 1 is an error, never a wrapped number.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "escala/dtype.h"
#include "escala/status.h"

namespace escala::kv {

enum class KvFormat : uint8_t { kF32, kF16, kBF16, kFp8, kInt8, kInt4 };

inline constexpr KvFormat kAllFormats[] = {KvFormat::kF32, KvFormat::kF16,  KvFormat::kBF16,
                                           KvFormat::kFp8, KvFormat::kInt8, KvFormat::kInt4};
inline constexpr int64_t kInt4GroupSize = 32;
inline constexpr int64_t kDefaultBlockSize = 16;

std::string_view format_name(KvFormat f);  // fp32, fp16, bf16, fp8, int8, int4
std::optional<KvFormat> parse_format(std::string_view name);
// The planner format of a cache storage dtype (every DType has one).
KvFormat format_of(DType t);
int64_t format_bits(KvFormat f);  // bits per stored element

// Which layers attend through a sliding window (and so store at most `window` tokens).
enum class LocalLayers : uint8_t {
  kNone,       // every layer global
  kAll,        // every layer local (Mistral v0.1)
  kAlternate,  // layers 0, 2, 4, ... local, the others global (Gemma 2)
};

struct ModelConfig {
  std::string name;  // preset name, or "custom"
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t max_context = 0;  // the published context length; kv-plan's default T
  int64_t window = 0;       // sliding window in tokens; 0 = none
  LocalLayers local = LocalLayers::kNone;

  int64_t num_local_layers() const;
  int64_t num_global_layers() const { return num_layers - num_local_layers(); }
};

// Published configurations (Hugging Face config.json of each model).
std::span<const ModelConfig> presets();
std::optional<ModelConfig> find_preset(std::string_view name);

// Every field in range: layers, heads, kv heads, head dim >= 1, heads divisible by kv heads,
// local layers need a window > 0.
Status validate_config(const ModelConfig& m);

// A set of layers that store the same number of tokens per sequence; the paged cache keeps one
// block table per group.
struct LayerGroup {
  int64_t num_layers = 0;
  int64_t window = 0;  // 0: global (stores every token)
  int64_t resident_tokens(int64_t context) const { return window > 0 && window < context ? window : context; }
};
// Global layers first, then local ones; groups with no layers are left out.
std::vector<LayerGroup> layer_groups(const ModelConfig& m);

// Bytes of one token's K and V in one layer: data plus per-token scales (int8, int4).
Result<int64_t> token_bytes_per_layer(int64_t num_kv_heads, int64_t head_dim, KvFormat f);
// Scales kept once per block in one layer: fp8's f32 per (block, kv head) for K and V; else 0.
Result<int64_t> block_scale_bytes_per_layer(int64_t num_kv_heads, KvFormat f);
// One block: block_size token slots in each of num_layers layers (a layer group), with its scales.
Result<int64_t> block_bytes(int64_t num_layers, int64_t num_kv_heads, int64_t head_dim, KvFormat f, int64_t block_size);
// How many whole blocks of `bytes_per_block` fit in `budget_bytes` (budget >= 0).
Result<int64_t> blocks_in_budget(int64_t budget_bytes, int64_t bytes_per_block);

struct KvBytes {
  int64_t data = 0;    // the formula proper: 2 · L · B · T · h_kv · d_h · bytes_per_elem
  int64_t scales = 0;  // quantization scales, as stored
  int64_t total = 0;   // data + scales
};
// The cache of `batch` sequences of `context` tokens each (local layers capped at the window).
Result<KvBytes> kv_cache_bytes(const ModelConfig& m, int64_t context, int64_t batch, KvFormat f,
                               int64_t block_size = kDefaultBlockSize);
// What the paged cache allocates for one sequence of `context` tokens: whole blocks, per group.
// Equals kv_cache_bytes(m, context, 1, ...).total when block_size divides the resident lengths.
Result<int64_t> paged_sequence_bytes(const ModelConfig& m, int64_t context, KvFormat f,
                                     int64_t block_size = kDefaultBlockSize);

struct Fit {
  int64_t sequences = 0;   // concurrent sequences that fit
  int64_t free_bytes = 0;  // device memory left after the weights (0 if they do not fit)
  std::string message;     // why it is 0, when it is
};
Result<Fit> sequences_that_fit(int64_t device_memory, int64_t weights, int64_t bytes_per_sequence);

// A byte count: digits, an optional fraction, an optional unit with no space between ("123",
// "80GB", "1.5GiB", "512mib"). Units, any case: B, KB, KiB, MB, MiB, GB, GiB, TB, TiB. Anything
// else ("80 GB", "7e9", "-1", "12GBs") is an error. A fraction is rounded down to whole bytes.
Result<int64_t> parse_byte_size(std::string_view text);

// Decimal units for display: value / 2^30 and value / 10^9 with trailing zeros trimmed.
std::string format_gib(int64_t bytes);
std::string format_gb(int64_t bytes);

}  // namespace escala::kv

// Rotary position embeddings: the inverse-frequency table (with the scaling schemes GGUF metadata
// names: linear, NTK-aware, YaRN, and Llama 3's per-frequency factors) and the rotation itself.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "escala/gguf.h"
#include "escala/status.h"

namespace escala::model {

struct RopeConfig {
  int32_t dims = 0;  // rotated dimensions (<= head_dim), even
  bool neox = false;
  std::vector<float> inv_freq;  // [dims / 2], scaling folded in
  float attn_factor = 1.0f;     // YaRN's magnitude correction, applied to cos/sin
};

// Reads rope.freq_base, rope.scaling.* and the rope_freqs tensor (Llama 3) of `arch`.
Result<RopeConfig> read_rope_config(const GgufFile& file, const ArchParams& arch, bool neox);

// cos and sin (YaRN's attn_factor folded in) of every rotated pair at each position: computed once
// per forward step and shared by the queries and keys of every layer.
struct RopeTable {
  int32_t half = 0;        // rope.dims / 2
  std::vector<float> cs;   // [positions, half]
  std::vector<float> sn;   // [positions, half]
};
void build_rope_table(const RopeConfig& rope, std::span<const int64_t> positions, RopeTable& table);

// Rotates `rows` rows of `heads` heads of width `head_dim` (row stride heads * head_dim); row r
// uses the table's row r.
void apply_rope(const RopeTable& table, bool neox, float* x, int64_t rows, int32_t heads, int32_t head_dim);

// The same at the given positions (builds a table for this call).
void apply_rope(const RopeConfig& rope, float* x, int64_t rows, int32_t heads, int32_t head_dim,
                std::span<const int64_t> positions);

}  // namespace escala::model

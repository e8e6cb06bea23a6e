// A Llama-family model (llama, qwen2, gemma2) loaded from GGUF, running its attention and KV cache
// through Escala's own kernels and paged cache.
//
// One step: the caller (generate, the engine) has the cache prepare and apply the new tokens of a
// batch of sequences (so admission and preemption stay the caller's decision), then calls forward(),
// which writes every layer's K/V for those tokens and returns logits where asked.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "escala/dtype.h"
#include "escala/gguf.h"
#include "escala/kv_cache.h"
#include "escala/status.h"

namespace escala::model {

struct ModelOptions {
  int threads = 0;                 // 0: OpenMP default
  DType kv_dtype = DType::kF16;    // f16, bf16, f32, int8, fp8
  int64_t kv_budget_bytes = 0;     // 0: enough for max_sequences x context
  int32_t max_sequences = 1;       // for the default budget
  int32_t context = 0;             // 0: the model's trained context (capped at 8192 for the budget)
  int32_t block_size = 16;
  kv::StreamingPolicy streaming;   // StreamingLLM for every sequence (keys stored before RoPE)
  bool prefix_caching = true;
};

// Per-layer attention: the hybrid local/global layout of Gemma 2, Mistral's window, soft-caps.
struct LayerAttention {
  int32_t window = 0;  // tokens a query sees (itself included); 0: global
  float softcap = 0.0f;
};

struct ModelInfo {
  ArchParams arch;
  int32_t vocab_size = 0;
  bool rope_neox = false;
  std::vector<LayerAttention> layers;
  uint64_t weight_bytes = 0;
};

// New tokens of one sequence in a forward step (already appended to the cache by apply()).
struct StepSequence {
  kv::SeqId seq = 0;
  std::span<const int32_t> tokens;
  bool want_logits = true;  // logits of the last token
};

class Model {
 public:
  static Result<std::unique_ptr<Model>> load(const std::string& path, const ModelOptions& options);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelInfo& info() const;
  const GgufFile& gguf() const;
  kv::KvCache& cache();

  // Runs the new tokens of every sequence through the model. logits: [sequences wanting logits,
  // vocab] in batch order.
  Status forward(std::span<const StepSequence> batch, std::vector<float>& logits);

  // Convenience for a single stream: appends `tokens` to `seq` (creating it if needed, with prefix
  // reuse) and returns the last token's logits. Out of blocks is an error here.
  Status append(kv::SeqId seq, std::span<const int32_t> tokens, std::vector<float>& logits);

 private:
  struct Impl;
  explicit Model(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace escala::model

// The Llama-family forward pass on the CPU: weights straight from the GGUF mapping (quantized
// matmuls), attention and KV through Escala's kernels and paged cache.
#include "escala/model.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <numbers>

#include "common/numeric.h"
#include "escala/attention.h"
#include "kv/planner.h"
#include "model/quant_matmul_internal.h"
#include "model/rope.h"

namespace escala::model {

namespace {

// Tokens per forward step when append() runs a long prompt.
constexpr int64_t kPrefillChunk = 512;

struct LayerWeights {
  const GgufTensor *attn_norm = nullptr, *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr;
  const GgufTensor *q_bias = nullptr, *k_bias = nullptr, *v_bias = nullptr;          // qwen2
  const GgufTensor *post_attn_norm = nullptr, *post_ffn_norm = nullptr;             // gemma2
  const GgufTensor *ffn_norm = nullptr, *gate = nullptr, *up = nullptr, *down = nullptr;
};

enum class Arch { kLlama, kQwen2, kGemma2 };

// Reads a norm or bias vector (f32) of `n` elements.
Result<const GgufTensor*> vector_tensor(const GgufFile& f, const std::string& name, int64_t n, bool required) {
  const GgufTensor* t = f.find_tensor(name);
  if (!t) {
    if (required) return Status::error(fmt::format("model: tensor '{}' is missing", name));
    return static_cast<const GgufTensor*>(nullptr);
  }
  if (t->type != TensorType::kF32 || t->elements() != n)
    return Status::error(fmt::format("model: tensor '{}' must be f32 [{}]", name, n));
  return t;
}

// A weight matrix with `cols` inputs and `rows` outputs.
Result<const GgufTensor*> matrix_tensor(const GgufFile& f, const std::string& name, int64_t cols, int64_t rows) {
  const GgufTensor* t = f.find_tensor(name);
  if (!t) return Status::error(fmt::format("model: tensor '{}' is missing", name));
  if (t->n_dims != 2 || t->ne[0] != cols || t->ne[1] != rows)
    return Status::error(fmt::format("model: tensor '{}' has shape [{}, {}], expected [{}, {}]", name, t->ne[0],
                                     t->ne[1], cols, rows));
  return t;
}

void rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t n, float eps, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (rows > 4)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += double(xr[i]) * xr[i];
    const float inv = float(1.0 / std::sqrt(ss / double(n) + eps));
    for (int64_t i = 0; i < n; ++i) y[r * n + i] = xr[i] * inv * w[i];
  }
}

float gelu_tanh(float x) {
  constexpr float k = 0.7978845608028654f;  // sqrt(2/pi)
  return 0.5f * x * (1.0f + std::tanh(k * (x + 0.044715f * x * x * x)));
}

}  // namespace

struct Model::Impl {
  GgufFile file;
  ModelOptions options;
  ModelInfo info;
  Arch arch = Arch::kLlama;
  RopeConfig rope;
  const GgufTensor *embed = nullptr, *out_norm = nullptr, *output = nullptr;
  std::vector<LayerWeights> layers;
  StoredWeights stored;  // the matrices in the VNNI kernels' layout (quant_matmul_internal.h)
  std::unique_ptr<kv::KvCache> cache;
  bool keys_pre_rope = false;
  // Activations, grown on demand (never per token).
  std::vector<float> x, xn, q, k, v, att, tmp, gate, up, last;
  std::vector<int64_t> pos_true, pos_q;
  RopeTable rope_q;  // cos/sin at pos_q, built once per step

  int threads() const { return options.threads > 0 ? options.threads : omp_get_max_threads(); }

  Status matmul_into(const GgufTensor* t, const float* in, int64_t m, float* out) const {
    return model::matmul(t->as_matrix(), in, m, out, threads());
  }

  Status load_weights();
  Status forward(std::span<const StepSequence> batch, std::vector<float>& logits);
};

Status Model::Impl::load_weights() {
  const ArchParams& a = info.arch;
  const int64_t n = a.embedding_length, hd = a.head_dim, h = a.head_count, hk = a.head_count_kv;
  const int64_t ff = a.feed_forward_length;
  const GgufTensor* te = file.find_tensor("token_embd.weight");
  if (!te || te->n_dims != 2 || te->ne[0] != n)
    return Status::error(fmt::format("model: token_embd.weight missing or not [{}, vocab]", n));
  embed = te;
  info.vocab_size = int32_t(te->ne[1]);
  auto on = vector_tensor(file, "output_norm.weight", n, true);
  if (!on.ok()) return on.status();
  out_norm = *on;
  output = file.find_tensor("output.weight");
  if (!output) output = embed;  // tied embeddings
  else if (output->n_dims != 2 || output->ne[0] != n || output->ne[1] != info.vocab_size)
    return Status::error("model: output.weight does not match the embedding");
  // Each layer has at least nine tensors: a corrupt count fails here, before any allocation.
  if (uint64_t(a.block_count) * 9 > file.tensors().size())
    return Status::error(fmt::format("model: {}.block_count = {} but the file has only {} tensors", a.arch,
                                     a.block_count, file.tensors().size()));
  layers.resize(a.block_count);
  for (uint32_t i = 0; i < a.block_count; ++i) {
    LayerWeights& L = layers[i];
    const auto name = [i](std::string_view s) { return fmt::format("blk.{}.{}", i, s); };
#define ESCALA_LOAD(field, expr)            \
  do {                                      \
    auto r_ = (expr);                       \
    if (!r_.ok()) return r_.status();       \
    L.field = *r_;                          \
  } while (0)
    ESCALA_LOAD(attn_norm, vector_tensor(file, name("attn_norm.weight"), n, true));
    ESCALA_LOAD(q, matrix_tensor(file, name("attn_q.weight"), n, h * hd));
    ESCALA_LOAD(k, matrix_tensor(file, name("attn_k.weight"), n, hk * hd));
    ESCALA_LOAD(v, matrix_tensor(file, name("attn_v.weight"), n, hk * hd));
    ESCALA_LOAD(o, matrix_tensor(file, name("attn_output.weight"), h * hd, n));
    ESCALA_LOAD(ffn_norm, vector_tensor(file, name("ffn_norm.weight"), n, true));
    ESCALA_LOAD(gate, matrix_tensor(file, name("ffn_gate.weight"), n, ff));
    ESCALA_LOAD(up, matrix_tensor(file, name("ffn_up.weight"), n, ff));
    ESCALA_LOAD(down, matrix_tensor(file, name("ffn_down.weight"), ff, n));
    if (arch == Arch::kQwen2) {
      ESCALA_LOAD(q_bias, vector_tensor(file, name("attn_q.bias"), h * hd, true));
      ESCALA_LOAD(k_bias, vector_tensor(file, name("attn_k.bias"), hk * hd, true));
      ESCALA_LOAD(v_bias, vector_tensor(file, name("attn_v.bias"), hk * hd, true));
    }
    if (arch == Arch::kGemma2) {
      ESCALA_LOAD(post_attn_norm, vector_tensor(file, name("post_attention_norm.weight"), n, true));
      ESCALA_LOAD(post_ffn_norm, vector_tensor(file, name("post_ffw_norm.weight"), n, true));
    }
#undef ESCALA_LOAD
  }
  for (const GgufTensor& t : file.tensors()) info.weight_bytes += t.size;
  // A matrix copied into the kernels' layout is read only from there: its file pages need not stay
  // resident (the model file + KV + 64 MB memory bound).
  auto store = [&](const GgufTensor* t) {
    if (stored.add(t->as_matrix())) file.release_pages(*t);
  };
  for (const LayerWeights& L : layers)
    for (const GgufTensor* t : {L.q, L.k, L.v, L.o, L.gate, L.up, L.down}) store(t);
  store(output);
  return {};
}

Status Model::Impl::forward(std::span<const StepSequence> batch, std::vector<float>& logits) {
  const ArchParams& a = info.arch;
  const int64_t n = a.embedding_length, hd = a.head_dim, h = a.head_count, hk = a.head_count_kv;
  const int64_t ff = a.feed_forward_length;
  int64_t total = 0, want = 0;
  for (const auto& s : batch) {
    if (s.tokens.empty()) return Status::error("model: a sequence in the batch has no new tokens");
    total += int64_t(s.tokens.size());
    want += s.want_logits ? 1 : 0;
  }
  if (total == 0) return Status::error("model: empty batch");
  x.resize(total * n); xn.resize(total * n); tmp.resize(total * n);
  q.resize(total * h * hd); att.resize(total * h * hd);
  k.resize(total * hk * hd); v.resize(total * hk * hd);
  gate.resize(total * ff); up.resize(total * ff);
  pos_true.resize(total); pos_q.resize(total);

  // Embeddings and positions; the cache has already appended these tokens.
  std::vector<kv::SeqId> seqs;
  std::vector<int32_t> cu_q{0};
  const uint64_t erow = *row_bytes(embed->type, n);
  int64_t at = 0;
  for (const auto& s : batch) {
    const int64_t len = cache->num_tokens(s.seq);
    if (len < int64_t(s.tokens.size())) return Status::error(fmt::format("model: sequence {} not appended", s.seq));
    const int64_t first = len - int64_t(s.tokens.size());
    for (size_t i = 0; i < s.tokens.size(); ++i, ++at) {
      const int32_t tok = s.tokens[i];
      if (tok < 0 || tok >= info.vocab_size) return Status::error(fmt::format("model: token id {} out of range", tok));
      dequantize_row(embed->type, embed->data + erow * uint64_t(tok), x.data() + at * n, n);
      pos_true[at] = first + int64_t(i);
      pos_q[at] = keys_pre_rope ? cache->query_position(s.seq, first + int64_t(i)) : first + int64_t(i);
    }
    seqs.push_back(s.seq);
    cu_q.push_back(int32_t(at));
  }
  if (arch == Arch::kGemma2) {
    const float sc = std::sqrt(float(n));
    for (auto& e : x) e *= sc;
  }
  build_rope_table(rope, pos_q, rope_q);  // once per step, for every layer
  auto kvb = cache->batch(seqs);
  if (!kvb.ok()) return kvb.status();
  const float eps = a.rms_norm_eps;

  for (uint32_t li = 0; li < a.block_count; ++li) {
    const LayerWeights& L = layers[li];
    rms_norm(x.data(), reinterpret_cast<const float*>(L.attn_norm->data), xn.data(), total, n, eps, threads());
    {
      const WeightView w3[3] = {L.q->as_matrix(), L.k->as_matrix(), L.v->as_matrix()};
      float* const y3[3] = {q.data(), k.data(), v.data()};
      ESCALA_RETURN_IF_ERROR(matmul_group(w3, xn.data(), total, y3, threads()));
    }
    if (L.q_bias) {
      const auto add = [total](std::vector<float>& y, const GgufTensor* b, int64_t w) {
        const float* bb = reinterpret_cast<const float*>(b->data);
        for (int64_t r = 0; r < total; ++r)
          for (int64_t c = 0; c < w; ++c) y[r * w + c] += bb[c];
      };
      add(q, L.q_bias, h * hd);
      add(k, L.k_bias, hk * hd);
      add(v, L.v_bias, hk * hd);
    }
    // Without --streaming the queries' positions are the keys' (pos_q == pos_true): one table.
    apply_rope(rope_q, rope.neox, q.data(), total, int32_t(h), int32_t(hd));
    if (!keys_pre_rope) apply_rope(rope_q, rope.neox, k.data(), total, int32_t(hk), int32_t(hd));
    at = 0;
    for (const auto& s : batch) {
      const int64_t cnt = int64_t(s.tokens.size());
      ESCALA_RETURN_IF_ERROR(cache->write_kv(s.seq, int32_t(li), pos_true[at], cnt, k.data() + at * hk * hd,
                                             v.data() + at * hk * hd));
      at += cnt;
    }
    cache->rotate_queries(q.data(), total * h);
    // The attention kernels read a NaN score as a masked key, so NaN queries (corrupt weights)
    // would silently zero the head; K/V are checked as the cache stores them.
    if (!all_finite(q.data(), total * h * hd))
      return Status::error(fmt::format("model: non-finite queries in layer {} (corrupt weights?)", li));

    attn::AttentionParams p;
    ESCALA_RETURN_IF_ERROR(cache->bind(*kvb, int32_t(li), p));
    p.q = q.data();
    p.o = att.data();
    p.q_dtype = p.o_dtype = DType::kF32;
    p.q_head_stride = p.o_head_stride = hd;
    p.q_row_stride = p.o_row_stride = h * hd;
    p.cu_seqlens_q = cu_q.data();
    p.num_heads = int32_t(h);
    p.head_dim = int32_t(hd);
    p.causal = true;
    const LayerAttention& la = info.layers[li];
    if (options.streaming.enabled()) {
      p.num_sinks = options.streaming.num_sinks;
      p.window_left = options.streaming.window - 1;
    }
    if (la.window > 0) p.window_left = p.window_left < 0 ? la.window - 1 : std::min(p.window_left, la.window - 1);
    p.softcap = la.softcap;
    attn::CpuOptions copt;
    copt.num_threads = threads();
    ESCALA_RETURN_IF_ERROR(attn::attention(p, copt));

    ESCALA_RETURN_IF_ERROR(matmul_into(L.o, att.data(), total, tmp.data()));
    if (L.post_attn_norm) rms_norm(tmp.data(), reinterpret_cast<const float*>(L.post_attn_norm->data), tmp.data(), total, n, eps, threads());
    for (int64_t i = 0; i < total * n; ++i) x[i] += tmp[i];

    rms_norm(x.data(), reinterpret_cast<const float*>(L.ffn_norm->data), xn.data(), total, n, eps, threads());
    {
      const WeightView w2[2] = {L.gate->as_matrix(), L.up->as_matrix()};
      float* const y2[2] = {gate.data(), up.data()};
      ESCALA_RETURN_IF_ERROR(matmul_group(w2, xn.data(), total, y2, threads()));
    }
    if (arch == Arch::kGemma2) {
      for (int64_t i = 0; i < total * ff; ++i) gate[i] = gelu_tanh(gate[i]) * up[i];
    } else {
      for (int64_t i = 0; i < total * ff; ++i) gate[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
    }
    ESCALA_RETURN_IF_ERROR(matmul_into(L.down, gate.data(), total, tmp.data()));
    if (L.post_ffn_norm) rms_norm(tmp.data(), reinterpret_cast<const float*>(L.post_ffn_norm->data), tmp.data(), total, n, eps, threads());
    for (int64_t i = 0; i < total * n; ++i) x[i] += tmp[i];
  }

  // Logits of the last token of each sequence that wants them.
  last.resize(std::max<int64_t>(want, 1) * n);
  int64_t w = 0;
  at = 0;
  for (const auto& s : batch) {
    at += int64_t(s.tokens.size());
    if (s.want_logits) rms_norm(x.data() + (at - 1) * n, reinterpret_cast<const float*>(out_norm->data),
                                last.data() + (w++) * n, 1, n, eps, threads());
  }
  logits.resize(size_t(want) * info.vocab_size);
  if (want > 0) ESCALA_RETURN_IF_ERROR(matmul_into(output, last.data(), want, logits.data()));
  if (a.final_logit_softcap > 0.0f) {
    const float c = a.final_logit_softcap;
    for (auto& l : logits) l = c * std::tanh(l / c);
  }
  // NaN / inf weights (a corrupt file) that did not reach the K/V (checked when written) surface
  // here; the sampler needs an order on the logits.
  w = 0;
  for (const auto& s : batch) {
    if (!s.want_logits) continue;
    const float* l = logits.data() + (w++) * info.vocab_size;
    if (!all_finite(l, info.vocab_size))
      return Status::error(fmt::format("model: non-finite logits for sequence {} (corrupt weights?)", s.seq));
  }
  for (const auto& s : batch) ESCALA_RETURN_IF_ERROR(cache->mark_written(s.seq, cache->num_tokens(s.seq)));
  return {};
}

Result<std::unique_ptr<Model>> Model::load(const std::string& path, const ModelOptions& options) {
  auto file = GgufFile::open(path);
  if (!file.ok()) return file.status();
  auto impl = std::make_unique<Impl>();
  impl->file = std::move(*file);
  impl->options = options;
  auto arch = read_arch_params(impl->file);
  if (!arch.ok()) return arch.status();
  ModelInfo& info = impl->info;
  info.arch = *arch;
  impl->arch = info.arch.arch == "qwen2" ? Arch::kQwen2 : info.arch.arch == "gemma2" ? Arch::kGemma2 : Arch::kLlama;
  info.rope_neox = impl->arch != Arch::kLlama;  // llama GGUFs permute Q/K for interleaved pairs
  ESCALA_RETURN_IF_ERROR(impl->load_weights());
  auto rope = read_rope_config(impl->file, info.arch, info.rope_neox);
  if (!rope.ok()) return rope.status();
  impl->rope = std::move(*rope);
  for (uint32_t i = 0; i < info.arch.block_count; ++i) {
    LayerAttention la;
    la.softcap = info.arch.attn_logit_softcap;
    if (impl->arch == Arch::kGemma2) la.window = i % 2 == 0 ? int32_t(info.arch.sliding_window) : 0;  // local, global, ...
    else la.window = int32_t(info.arch.sliding_window);  // Mistral: every layer
    info.layers.push_back(la);
  }

  // The KV cache: budget from the planner's formula unless given.
  kv::CacheConfig cc;
  cc.num_layers = int32_t(info.arch.block_count);
  cc.num_kv_heads = int32_t(info.arch.head_count_kv);
  cc.head_dim = int32_t(info.arch.head_dim);
  cc.dtype = options.kv_dtype;
  cc.block_size = options.block_size;
  cc.prefix_caching = options.prefix_caching && !options.streaming.enabled();
  const int32_t ctx = options.context > 0 ? options.context : int32_t(std::min<uint32_t>(info.arch.context_length, 8192));
  if (options.kv_budget_bytes > 0) {
    cc.budget_bytes = options.kv_budget_bytes;
  } else {
    const int64_t per_seq_tokens = options.streaming.enabled()
                                       ? options.streaming.num_sinks + options.streaming.window + 2 * options.block_size
                                       : ctx;
    const int64_t blocks = (per_seq_tokens + options.block_size - 1) / options.block_size + 1;
    auto bb = kv::block_bytes(cc.num_layers, cc.num_kv_heads, cc.head_dim, kv::format_of(cc.dtype), cc.block_size);
    if (!bb.ok()) return bb.status();
    cc.budget_bytes = *bb * blocks * std::max(1, options.max_sequences);
  }
  if (options.streaming.enabled()) {
    impl->keys_pre_rope = true;  // StreamingLLM: positions re-assigned by place in the cache
    if (impl->rope.dims != int32_t(info.arch.head_dim) || impl->rope.attn_factor != 1.0f)
      return Status::error("model: --streaming needs RoPE over the whole head dim without YaRN scaling");
    cc.rope_inv_freq = impl->rope.inv_freq;
    cc.rope_neox = impl->rope.neox;
  }
  auto cache = kv::KvCache::create(cc);
  if (!cache.ok()) return cache.status();
  impl->cache = std::move(*cache);
  return std::unique_ptr<Model>(new Model(std::move(impl)));
}

Model::Model(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Model::~Model() = default;
const ModelInfo& Model::info() const { return impl_->info; }
const GgufFile& Model::gguf() const { return impl_->file; }
kv::KvCache& Model::cache() { return *impl_->cache; }

Status Model::forward(std::span<const StepSequence> batch, std::vector<float>& logits) {
  return impl_->forward(batch, logits);
}

Status Model::append(kv::SeqId seq, std::span<const int32_t> tokens, std::vector<float>& logits) {
  kv::KvCache& c = *impl_->cache;
  std::span<const int32_t> rest = tokens;
  if (!c.contains(seq)) {
    kv::SeqOptions so;
    so.streaming = impl_->options.streaming;
    auto hit = c.add_sequence(seq, tokens, so);
    if (!hit.ok()) return hit.status();
    rest = tokens.subspan(size_t(*hit));
  }
  if (rest.empty()) return Status::error("model: append() needs at least one new token");
  // The whole append must fit before any of it runs (prepare_append changes nothing).
  kv::AppendRequest whole{seq, rest};
  auto check = c.prepare_append(std::span(&whole, 1));
  if (!check.ok()) return check.status();
  if (!check->fits())
    return Status::error(fmt::format("model: the KV cache is full ({} blocks short); raise the KV budget or use --streaming",
                                     check->blocks_short));
  // A long prompt runs in chunks (llama.cpp's micro-batches): the activations of one step grow with
  // its token count (~27 KB per token for SmolLM2, 110 MB for a 4096-token prompt in one step), while
  // the weights are streamed once per step either way. Only the last chunk's logits are computed.
  while (!rest.empty()) {
    const size_t cnt = std::min(rest.size(), size_t(kPrefillChunk));
    const std::span<const int32_t> part = rest.first(cnt);
    kv::AppendRequest req{seq, part};
    auto plan = c.prepare_append(std::span(&req, 1));
    if (!plan.ok()) return plan.status();
    if (!plan->fits()) return Status::error("model: the KV cache ran out of blocks during a chunked append");
    ESCALA_RETURN_IF_ERROR(c.apply(*plan));
    StepSequence s{seq, part, cnt == rest.size()};
    ESCALA_RETURN_IF_ERROR(impl_->forward(std::span(&s, 1), logits));
    rest = rest.subspan(cnt);
  }
  return {};
}

}  // namespace escala::model

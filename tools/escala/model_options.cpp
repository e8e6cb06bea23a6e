#include "model_options.h"

#include <fmt/format.h>

#include <charconv>

#include "model/model_paths.h"

namespace escala::cli {

void add_model_flags(CLI::App& cmd, ModelFlags& f) {
  cmd.add_option("--model,-m", f.model, "GGUF model file (default: models/SmolLM2-135M-Instruct.Q4_1.gguf)");
  cmd.add_option("--threads,-t", f.threads, "Threads (default: all cores)")->check(CLI::Range(0, 1024));
  cmd.add_option("--kv-type", f.kv_type, "KV cache storage: f16, bf16, f32, int8, fp8");
  cmd.add_option("--streaming", f.streaming, "StreamingLLM: keep SINKS first tokens and the last WINDOW (\"4,1024\")");
  cmd.add_option("--context", f.context, "Context length the KV cache is sized for (default: the model's, at most 8192)")
      ->check(CLI::Range(0, 1 << 24));
  cmd.add_option("--chat-template", f.chat_template, "Override the model's chat template: chatml, llama3, gemma, llama2");
}

void add_sampling_flags(CLI::App& cmd, SamplingFlags& f) {
  auto& p = f.params;
  cmd.add_option("-n,--max-tokens", f.max_tokens, "Tokens to generate")->check(CLI::Range(0, 1 << 24));
  cmd.add_option("--temp", p.temperature, "Temperature (0: greedy)");
  cmd.add_option("--top-k", p.top_k, "Top-k (0: off)");
  cmd.add_option("--top-p", p.top_p, "Top-p (1: off)");
  cmd.add_option("--min-p", p.min_p, "Min-p (0: off)");
  cmd.add_option("--repeat-penalty", p.repetition_penalty, "Repetition penalty (1: off)");
  cmd.add_option("--presence-penalty", p.presence_penalty, "Presence penalty");
  cmd.add_option("--frequency-penalty", p.frequency_penalty, "Frequency penalty");
  cmd.add_option("--seed", p.seed, "Random seed (runs with the same seed repeat)");
  cmd.add_option("--stop", f.stop, "Stop string (repeatable)");
}

namespace {
Result<kv::StreamingPolicy> parse_streaming(const std::string& s) {
  kv::StreamingPolicy p;
  if (s.empty()) return p;
  const auto comma = s.find(',');
  auto num = [](std::string_view t, int32_t& out) {
    auto [ptr, ec] = std::from_chars(t.data(), t.data() + t.size(), out);
    return ec == std::errc() && ptr == t.data() + t.size();
  };
  if (comma == std::string::npos || !num(std::string_view(s).substr(0, comma), p.num_sinks) ||
      !num(std::string_view(s).substr(comma + 1), p.window) || p.num_sinks < 0 || p.window < 1)
    return Status::error(fmt::format("--streaming expects SINKS,WINDOW with SINKS >= 0 and WINDOW >= 1 (got '{}')", s));
  return p;
}
}  // namespace

Result<LoadedModel> load_model(const ModelFlags& f, int32_t max_sequences) {
  std::string path = f.model;
  if (path.empty()) {
    auto d = model::default_model_path();
    if (!d.ok()) return d.status();
    path = *d;
  }
  model::ModelOptions o;
  o.threads = f.threads;
  auto kv = parse_dtype(f.kv_type);
  if (!kv) return Status::error(fmt::format("--kv-type must be f16, bf16, f32, int8 or fp8 (got '{}')", f.kv_type));
  o.kv_dtype = *kv;
  auto st = parse_streaming(f.streaming);
  if (!st.ok()) return st.status();
  o.streaming = *st;
  o.context = f.context;
  o.max_sequences = max_sequences;
  auto m = model::Model::load(path, o);
  if (!m.ok()) return m.status();
  auto tok = model::Tokenizer::from_gguf((*m)->gguf());
  if (!tok.ok()) return tok.status();
  return LoadedModel{std::move(*m), std::move(*tok)};
}

}  // namespace escala::cli

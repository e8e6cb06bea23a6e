#include "model_options.h"

#include <fmt/format.h>

#include <unistd.h>

#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

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

Status check_omp_spin(const std::string& spin) {
  if (spin != "keep" && spin != "passive" && (spin.empty() || spin.find_first_not_of("0123456789") != std::string::npos))
    return Status::error(fmt::format("--omp-spin must be a spin count, passive or keep (got '{}')", spin));
  return {};
}

void reexec_with_omp_spin(const std::string& spin, const char* marker_env) {
  if (spin == "keep" || std::getenv("OMP_WAIT_POLICY") || std::getenv("GOMP_SPINCOUNT") || std::getenv(marker_env))
    return;
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (!f.good() && !f.eof()) return;
  std::vector<std::string> args;
  for (size_t at = 0; at < all.size();) {
    const size_t end = all.find('\0', at);
    args.push_back(all.substr(at, end == std::string::npos ? std::string::npos : end - at));
    if (end == std::string::npos) break;
    at = end + 1;
  }
  if (args.empty()) return;
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  if (spin == "passive") setenv("OMP_WAIT_POLICY", "passive", 1);
  else setenv("GOMP_SPINCOUNT", spin.c_str(), 1);
  setenv(marker_env, "1", 1);
  std::error_code ec;
  const std::string self = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  std::fflush(nullptr);
  execv(ec || self.empty() ? "/proc/self/exe" : self.c_str(), argv.data());
  // Could not: run with the runtime's defaults.
  unsetenv("OMP_WAIT_POLICY");
  unsetenv("GOMP_SPINCOUNT");
}

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

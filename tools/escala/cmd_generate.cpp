// `escala generate`: completes a prompt with a GGUF model, streaming the text, then one line of
// timings (prompt and generation tokens/s, KV-cache bytes).
#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include <charconv>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>

#include "commands.h"
#include "engine/generation.h"
#include "engine/json_schema.h"
#include "model_options.h"

namespace escala::cli {

namespace {
struct GenerateFlags {
  ModelFlags model;
  SamplingFlags sampling;
  std::string prompt;
  std::string prompt_ids;  // comma-separated token ids, instead of text (benchmarks: exact lengths)
  bool chat = false;  // wrap the prompt as one user turn of the model's chat template
  bool json = false;  // one JSON object instead of streamed text (scripts, comparisons)
  bool json_object = false;  // structured output: any JSON object
  std::string json_schema;   // structured output: a JSON schema file
  std::string omp_spin = "3000";  // as escala serve: see reexec_with_omp_spin
};

// "1,2,3" -> {1, 2, 3}; ids are checked against the vocabulary by the model.
Result<std::vector<int32_t>> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  size_t at = 0;
  while (at <= s.size()) {
    size_t end = s.find(',', at);
    if (end == std::string::npos) end = s.size();
    int32_t v = 0;
    auto [ptr, ec] = std::from_chars(s.data() + at, s.data() + end, v);
    if (ec != std::errc() || ptr != s.data() + end || v < 0)
      return Status::error(fmt::format("--prompt-ids expects comma-separated token ids (bad entry at offset {})", at));
    ids.push_back(v);
    at = end + 1;
  }
  return ids;
}

// Peak resident set of this process (VmHWM), in bytes; -1 where /proc is not available. Read here
// rather than by the parent's wait4: a child's ru_maxrss also counts the image it was forked from.
int64_t peak_rss_bytes() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  int64_t kb = -1;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "VmHWM: %lld kB", reinterpret_cast<long long*>(&kb)) == 1) break;
  std::fclose(f);
  return kb < 0 ? -1 : kb * 1024;
}

// --json-object / --json-schema FILE: the compiled schema (null without either).
Result<std::shared_ptr<const engine::JsonSchema>> structured_output(const GenerateFlags& f) {
  if (f.json_object && !f.json_schema.empty()) return Status::error("give at most one of --json-object and --json-schema");
  if (f.json_object) return engine::JsonSchema::any_object();
  if (f.json_schema.empty()) return std::shared_ptr<const engine::JsonSchema>();
  std::ifstream in(f.json_schema, std::ios::binary);
  if (!in) return Status::error(fmt::format("--json-schema: cannot read '{}'", f.json_schema));
  const auto doc = nlohmann::ordered_json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return Status::error(fmt::format("--json-schema: '{}' is not valid JSON", f.json_schema));
  auto compiled = engine::JsonSchema::compile(doc);
  if (!compiled.ok()) return Status::error(fmt::format("--json-schema: {}", compiled.message()));
  return *compiled;
}

Status run_generate(const GenerateFlags& f) {
  if (f.prompt.empty() == f.prompt_ids.empty()) return Status::error("give exactly one of --prompt and --prompt-ids");
  if (!f.prompt_ids.empty() && f.chat) return Status::error("--chat needs --prompt (text), not --prompt-ids");
  // Before the model loads and the prompt is echoed: no partial output for bad sampling flags.
  ESCALA_RETURN_IF_ERROR(f.sampling.params.validate());
  auto schema = structured_output(f);
  if (!schema.ok()) return schema.status();
  ESCALA_RETURN_IF_ERROR(check_omp_spin(f.omp_spin));
  reexec_with_omp_spin(f.omp_spin, "ESCALA_GENERATE_REEXEC");
  auto lm = load_model(f.model);
  if (!lm.ok()) return lm.status();
  std::string text = f.prompt;
  model::EncodeOptions eo;
  if (f.chat) {
    auto tmpl = model::ChatTemplate::for_model(lm->tokenizer, f.model.chat_template);
    if (!tmpl.ok()) return tmpl.status();
    std::vector<model::ChatMessage> msgs{{"user", f.prompt}};
    auto r = tmpl->render(msgs, true);
    if (!r.ok()) return r.status();
    text = *r;
    eo.parse_special = true;
  }
  auto ids = f.prompt_ids.empty() ? lm->tokenizer.encode(text, eo) : parse_ids(f.prompt_ids);
  if (!ids.ok()) return ids.status();
  for (int32_t id : *ids)
    if (id >= lm->model->info().vocab_size)
      return Status::error(fmt::format("--prompt-ids: token id {} is outside the vocabulary ({})", id,
                                       lm->model->info().vocab_size));
  engine::GenerationRequest req;
  req.prompt = *ids;
  req.sampling = f.sampling.params;
  req.max_tokens = f.sampling.max_tokens;
  req.stop = f.sampling.stop;
  req.json_schema = *schema;
  if (!f.chat && !f.json && f.prompt_ids.empty()) {
    std::fputs(f.prompt.c_str(), stdout);
    std::fflush(stdout);
  }
  // With --json: when each piece of text became final. Between two pieces lies one decode step
  // (sometimes more, when a token completes no character), so the median gap is a step time that a
  // busy machine's preemptions do not move (benchmarks on shared machines).
  std::vector<double> piece_times;
  const auto t_start = std::chrono::steady_clock::now();
  auto res = engine::generate(*lm->model, lm->tokenizer, 0, req, [&](std::string_view t) {
    if (f.json) {
      piece_times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count());
      return;
    }
    std::fwrite(t.data(), 1, t.size(), stdout);
    std::fflush(stdout);
  });
  if (!res.ok()) return res.status();
  const auto st = lm->model->cache().stats();
  if (f.json) {
    // The 20 largest first-position logits, for comparisons with another runtime.
    std::vector<int32_t> order(res->first_logits.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = int32_t(i);
    const size_t top = std::min<size_t>(20, order.size());
    std::partial_sort(order.begin(), order.begin() + top, order.end(),
                      [&](int32_t a, int32_t b) { return res->first_logits[a] > res->first_logits[b]; });
    nlohmann::json j;
    j["prompt_tokens"] = req.prompt;
    j["tokens"] = res->tokens;
    j["text"] = res->text;
    j["finish_reason"] = res->finish_reason;
    nlohmann::json tops = nlohmann::json::array();
    for (size_t i = 0; i < top; ++i) tops.push_back({order[i], res->first_logits[order[i]]});
    j["first_logits_top"] = tops;
    j["prompt_tokens_per_s"] = double(res->prompt_tokens) / std::max(1e-9, res->prompt_seconds);
    j["generated_tokens_per_s"] = double(res->tokens.size()) / std::max(1e-9, res->generation_seconds);
    // Raw timings: the first generated token comes from the prompt's logits, so a run of N tokens
    // makes N - 1 decode steps in generation_seconds.
    j["prompt_seconds"] = res->prompt_seconds;
    j["generation_seconds"] = res->generation_seconds;
    j["kv_bytes_in_use"] = st.bytes_in_use;
    j["peak_rss_bytes"] = peak_rss_bytes();
    j["piece_times"] = piece_times;
    std::puts(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return {};
  }
  std::fputs("\n", stdout);
  std::fflush(stdout);  // the timing line goes to stderr: keep it after the text
  std::fprintf(stderr,
               "[escala] prompt %lld tokens, %.1f tokens/s | generated %zu tokens, %.1f tokens/s | KV cache %lld bytes "
               "in use (%s) | finish: %s\n",
               (long long)res->prompt_tokens, double(res->prompt_tokens) / std::max(1e-9, res->prompt_seconds),
               res->tokens.size(), double(res->tokens.size()) / std::max(1e-9, res->generation_seconds),
               (long long)st.bytes_in_use, f.model.kv_type.c_str(), res->finish_reason.c_str());
  return {};
}
}  // namespace

void add_generate_command(CLI::App& app, int& exit_code) {
  static GenerateFlags flags;
  auto* cmd = app.add_subcommand("generate", "Complete a prompt with a GGUF model (default: SmolLM2-135M-Instruct)");
  cmd->add_option("--prompt,-p", flags.prompt, "Prompt text");
  cmd->add_option("--prompt-ids", flags.prompt_ids, "Prompt as comma-separated token ids (instead of --prompt)");
  cmd->add_flag("--chat", flags.chat, "Apply the model's chat template to the prompt (one user turn)");
  cmd->add_flag("--json", flags.json, "Print one JSON object (token ids, text, top first-position logits, speeds)");
  cmd->add_flag("--json-object", flags.json_object, "Structured output: generate one JSON object, then stop");
  cmd->add_option("--json-schema", flags.json_schema,
                  "Structured output: generate JSON that this schema file allows (properties in order), then stop");
  cmd->add_option("--omp-spin", flags.omp_spin,
                  "OpenMP wait: spin count before a waiting thread sleeps (default 3000: short, for shared "
                  "machines), passive, or keep (the runtime's default)");
  add_model_flags(*cmd, flags.model);
  add_sampling_flags(*cmd, flags.sampling);
  cmd->callback([&exit_code] {
    Status st = run_generate(flags);
    if (!st.ok()) {
      std::fprintf(stderr, "escala: error: %s\n", st.message().c_str());
      exit_code = 1;
    }
  });
}

}  // namespace escala::cli

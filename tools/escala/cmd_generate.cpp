// `escala generate`: completes a prompt with a GGUF model, streaming the text, then one line of
// timings (prompt and generation tokens/s, KV-cache bytes).
#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include <cstdio>

#include "commands.h"
#include "engine/generation.h"
#include "model_options.h"

namespace escala::cli {

namespace {
struct GenerateFlags {
  ModelFlags model;
  SamplingFlags sampling;
  std::string prompt;
  bool chat = false;  // wrap the prompt as one user turn of the model's chat template
  bool json = false;  // one JSON object instead of streamed text (scripts, comparisons)
};

Status run_generate(const GenerateFlags& f) {
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
  auto ids = lm->tokenizer.encode(text, eo);
  if (!ids.ok()) return ids.status();
  engine::GenerationRequest req;
  req.prompt = *ids;
  req.sampling = f.sampling.params;
  req.max_tokens = f.sampling.max_tokens;
  req.stop = f.sampling.stop;
  if (!f.chat && !f.json) {
    std::fputs(f.prompt.c_str(), stdout);
    std::fflush(stdout);
  }
  auto res = engine::generate(*lm->model, lm->tokenizer, 0, req, [&f](std::string_view t) {
    if (f.json) return;
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
    j["kv_bytes_in_use"] = st.bytes_in_use;
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
  cmd->add_option("--prompt,-p", flags.prompt, "Prompt text")->required();
  cmd->add_flag("--chat", flags.chat, "Apply the model's chat template to the prompt (one user turn)");
  cmd->add_flag("--json", flags.json, "Print one JSON object (token ids, text, top first-position logits, speeds)");
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

// `escala generate`: completes a prompt with a GGUF model, streaming the text, then one line of
// timings (prompt and generation tokens/s, KV-cache bytes).
#include <fmt/format.h>

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
  if (!f.chat) {
    std::fputs(f.prompt.c_str(), stdout);
    std::fflush(stdout);
  }
  auto res = engine::generate(*lm->model, lm->tokenizer, 0, req, [](std::string_view t) {
    std::fwrite(t.data(), 1, t.size(), stdout);
    std::fflush(stdout);
  });
  if (!res.ok()) return res.status();
  const auto st = lm->model->cache().stats();
  std::fprintf(stdout, "\n");
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

// `escala chat`: an interactive conversation in the terminal. Each turn renders the whole history
// with the chat template; the previous turn's full KV blocks are found again through the prefix
// cache, so the history is not recomputed.
#include <fmt/format.h>

#include <cstdio>
#include <iostream>
#include <string>

#include "commands.h"
#include "engine/generation.h"
#include "model_options.h"

namespace escala::cli {

namespace {
struct ChatFlags {
  ModelFlags model;
  SamplingFlags sampling;
  std::string system;
};

Status run_chat(const ChatFlags& f) {
  // Bad sampling flags fail before the model loads, not at the first turn.
  ESCALA_RETURN_IF_ERROR(f.sampling.params.validate());
  auto lm = load_model(f.model);
  if (!lm.ok()) return lm.status();
  auto tmpl = model::ChatTemplate::for_model(lm->tokenizer, f.model.chat_template);
  if (!tmpl.ok()) return tmpl.status();
  std::vector<model::ChatMessage> history;
  if (!f.system.empty()) history.push_back({"system", f.system});
  std::fprintf(stderr, "escala chat (%s template) — /reset clears the history, /exit or Ctrl-D quits\n",
               std::string(tmpl->name()).c_str());
  kv::SeqId seq = 0;
  std::string line;
  while (true) {
    std::fputs("> ", stdout);
    std::fflush(stdout);
    if (!std::getline(std::cin, line) || line == "/exit") break;
    if (line == "/reset") {
      history.resize(f.system.empty() ? 0 : 1);
      continue;
    }
    if (line.empty()) continue;
    history.push_back({"user", line});
    auto text = tmpl->render(history, true);
    if (!text.ok()) return text.status();
    model::EncodeOptions eo;
    eo.parse_special = true;
    auto ids = lm->tokenizer.encode(*text, eo);
    if (!ids.ok()) return ids.status();
    if (lm->model->cache().contains(seq)) ESCALA_RETURN_IF_ERROR(lm->model->cache().free_sequence(seq));
    ++seq;
    engine::GenerationRequest req;
    req.prompt = *ids;
    req.sampling = f.sampling.params;
    req.max_tokens = f.sampling.max_tokens;
    req.stop = f.sampling.stop;
    auto res = engine::generate(*lm->model, lm->tokenizer, seq, req, [](std::string_view t) {
      std::fwrite(t.data(), 1, t.size(), stdout);
      std::fflush(stdout);
    });
    if (!res.ok()) return res.status();
    std::fputs("\n", stdout);
    history.push_back({"assistant", res->text});
  }
  return {};
}
}  // namespace

void add_chat_command(CLI::App& app, int& exit_code) {
  static ChatFlags flags;
  auto* cmd = app.add_subcommand("chat", "Interactive conversation with a GGUF model, using its chat template");
  cmd->add_option("--system", flags.system, "System prompt");
  add_model_flags(*cmd, flags.model);
  flags.sampling.max_tokens = 512;
  add_sampling_flags(*cmd, flags.sampling);
  cmd->callback([&exit_code] {
    Status st = run_chat(flags);
    if (!st.ok()) {
      std::fprintf(stderr, "escala: error: %s\n", st.message().c_str());
      exit_code = 1;
    }
  });
}

}  // namespace escala::cli

// `escala tokenize`: the token ids of a prompt under a model's GGUF vocabulary.
#include <fmt/format.h>

#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "cli_args.h"
#include "commands.h"
#include "escala/gguf.h"
#include "escala/tokenizer.h"
#include "model/model_paths.h"

namespace escala::cli {

namespace {

struct TokenizeArgs {
  std::optional<std::string> prompt, prompt_file;
  std::string model;
  bool no_bos = false, special = false, pieces = false, batch = false;
};

// Printable form of a piece: escapes for control bytes, quotes and backslashes.
std::string quote(std::string_view s) {
  std::string out = "'";
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '\r') out += "\\r";
    else if (c == '\'' || c == '\\') out += std::string("\\") + c;
    else if (u < 0x20 || u == 0x7F) out += fmt::format("\\x{:02x}", u);
    else out += c;
  }
  return out + "'";
}

Status run_tokenize(const TokenizeArgs& a) {
  if (a.prompt.has_value() == a.prompt_file.has_value())
    return Status::error("give exactly one of --prompt TEXT and --prompt-file FILE");
  std::string text;
  if (a.prompt) {
    text = *a.prompt;
  } else {
    std::ifstream in(*a.prompt_file, std::ios::binary);
    if (!in) return Status::error(fmt::format("--prompt-file: cannot open '{}'", *a.prompt_file));
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  std::string path = a.model;
  if (path.empty()) {
    auto p = model::default_model_path();
    if (!p.ok()) return p.status();
    path = *p;
  }
  auto file = model::GgufFile::open(path);
  if (!file.ok()) return file.status();
  auto tok = model::Tokenizer::from_gguf(*file);
  if (!tok.ok()) return tok.status();
  // --batch: NUL-separated texts, one line of ids each (used by the llama.cpp comparison).
  std::vector<std::string_view> texts;
  if (a.batch) {
    std::string_view rest = text;
    for (size_t nul; (nul = rest.find('\0')) != std::string_view::npos; rest.remove_prefix(nul + 1))
      texts.push_back(rest.substr(0, nul));
    texts.push_back(rest);
  } else {
    texts.push_back(text);
  }
  std::string out;
  for (std::string_view t : texts) {
    auto ids = tok->encode(t, {.add_special = !a.no_bos, .parse_special = a.special});
    if (!ids.ok()) return ids.status();
    if (a.pieces) {
      for (model::TokenId id : *ids) out += fmt::format("{:>6} {}\n", id, quote(tok->token_to_piece(id, true)));
    } else {
      for (size_t i = 0; i < ids->size(); ++i) out += fmt::format("{}{}", i ? " " : "", (*ids)[i]);
      out += '\n';
    }
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  return {};
}

}  // namespace

void add_tokenize_command(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<TokenizeArgs>();
  CLI::App* cmd = app.add_subcommand("tokenize", "Print the token ids of a prompt (one line, space-separated)");
  cmd->add_option("--prompt", args->prompt, "Text to tokenize");
  cmd->add_option("--prompt-file", args->prompt_file, "Read the text to tokenize from a file (bytes as they are)");
  cmd->add_option("--model", args->model, "GGUF file (default: models/SmolLM2-135M-Instruct.Q4_1.gguf)");
  cmd->add_flag("--no-bos", args->no_bos, "Do not add BOS/EOS even when the model asks for them");
  cmd->add_flag("--special", args->special, "Recognise control tokens such as <|im_start|> in the text");
  cmd->add_flag("--pieces", args->pieces, "Print one token per line: id and its text");
  cmd->add_flag("--batch", args->batch, "The text holds several texts separated by NUL bytes: one line of ids each");
  cmd->callback([args, &exit_code] {
    const Status st = run_tokenize(*args);
    exit_code = st.ok() ? 0 : report_error(st);
  });
}

}  // namespace escala::cli

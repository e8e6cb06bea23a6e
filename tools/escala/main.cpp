// `escala`: the command-line front end. Subcommands are defined in cmd_*.cpp.
#include <cstdio>
#include <exception>

#include "commands.h"

int main(int argc, char** argv) {
  CLI::App app{"Escala: exact attention kernels, a paged KV cache and an LLM runtime"};
  app.require_subcommand(1);
  int exit_code = 0;
  escala::cli::add_attention_command(app, exit_code);
  escala::cli::add_kv_plan_command(app, exit_code);
  escala::cli::add_bench_command(app, exit_code);
  escala::cli::add_generate_command(app, exit_code);
  escala::cli::add_chat_command(app, exit_code);
  escala::cli::add_tokenize_command(app, exit_code);
  escala::cli::add_serve_command(app, exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help and friends
    std::fprintf(stderr, "escala: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "escala: error: %s\n", e.what());
    return 1;
  }
  return exit_code;
}

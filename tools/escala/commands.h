// Subcommands of the `escala` program; each lives in its own cmd_*.cpp.
#pragma once
#include <CLI/CLI.hpp>

namespace escala::cli {
// Each adds its subcommand to `app`; the callback runs the command and returns the exit code via
// the shared `exit_code` (0 ok, 1 error with one line on stderr).
void add_attention_command(CLI::App& app, int& exit_code);
void add_kv_plan_command(CLI::App& app, int& exit_code);
void add_bench_command(CLI::App& app, int& exit_code);
void add_generate_command(CLI::App& app, int& exit_code);
void add_chat_command(CLI::App& app, int& exit_code);
void add_tokenize_command(CLI::App& app, int& exit_code);
void add_serve_command(CLI::App& app, int& exit_code);
}  // namespace escala::cli

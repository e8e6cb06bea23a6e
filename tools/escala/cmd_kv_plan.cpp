// Placeholder until the command is written.
#include "commands.h"
namespace escala::cli {
void add_kv_plan_command(CLI::App& app, int& exit_code) { (void)app; (void)exit_code; }
}  // namespace escala::cli

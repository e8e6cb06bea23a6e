// Command-line options shared by the commands that run a model (generate, chat, serve).
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "escala/model.h"
#include "escala/sampler.h"
#include "escala/tokenizer.h"

namespace escala::cli {

struct ModelFlags {
  std::string model;  // empty: the default model
  int threads = 0;
  std::string kv_type = "f16";
  std::string streaming;  // "SINKS,WINDOW"
  int context = 0;
  std::string chat_template;
};

struct SamplingFlags {
  engine::SamplingParams params;
  int max_tokens = 128;
  std::vector<std::string> stop;
};

void add_model_flags(CLI::App& cmd, ModelFlags& f);
void add_sampling_flags(CLI::App& cmd, SamplingFlags& f);

// OpenMP threads that wait spin first (libgomp: ~300k pause loops, milliseconds) before they sleep.
// A forward pass opens some 150-300 parallel regions; on a machine whose cores are shared with other
// work, a thread spinning at a region's end holds a core its partner needs, and each region can cost
// a time slice (escala generate, 2 threads, load ~4 on 2 cores: 570 ms per decode step with the
// default spin, 42 ms with 1000). The wait policy is read once, when the OpenMP runtime loads, so
// this sets GOMP_SPINCOUNT=spin (or OMP_WAIT_POLICY=passive for "passive") and executes the program
// again, unless spin is "keep", the user chose a policy (OMP_WAIT_POLICY, GOMP_SPINCOUNT) or
// `marker_env` is set (the re-executed process). Returns only if it did not re-execute.
void reexec_with_omp_spin(const std::string& spin, const char* marker_env);
// Checks a --omp-spin value: a spin count, "passive" or "keep".
Status check_omp_spin(const std::string& spin);

struct LoadedModel {
  std::unique_ptr<model::Model> model;
  model::Tokenizer tokenizer;
};
// Resolves the model path, parses --kv-type / --streaming, loads model and tokenizer.
Result<LoadedModel> load_model(const ModelFlags& f, int32_t max_sequences = 1);

}  // namespace escala::cli

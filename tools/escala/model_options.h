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

struct LoadedModel {
  std::unique_ptr<model::Model> model;
  model::Tokenizer tokenizer;
};
// Resolves the model path, parses --kv-type / --streaming, loads model and tokenizer.
Result<LoadedModel> load_model(const ModelFlags& f, int32_t max_sequences = 1);

}  // namespace escala::cli

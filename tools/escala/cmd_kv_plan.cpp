// `escala kv-plan`: how large the KV cache of a model is, in every storage format, and how many
// sequences fit next to the weights. All numbers come from kv/planner.h (the formula, once).
#include <fmt/format.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "cli_args.h"
#include "commands.h"
#include "kv/planner.h"

namespace escala::cli {

namespace {

struct KvPlanArgs {
  std::string preset;
  std::optional<std::string> layers, heads, kv_heads, head_dim, window, context, batch, block_size;
  std::optional<std::string> device_memory, weights;
  std::string dtype = "fp16";
  bool json = false;
};

struct Plan {
  kv::ModelConfig model;
  int64_t context = 0, batch = 1, block_size = kv::kDefaultBlockSize;
  kv::KvFormat format = kv::KvFormat::kF16;
  std::optional<int64_t> device_memory, weights;
};

// Applies one optional integer flag to `field`.
Status apply_int(const std::optional<std::string>& text, std::string_view flag, int64_t lo, int64_t& field) {
  if (!text) return {};
  auto v = parse_int(*text, flag, lo);
  if (!v.ok()) return v.status();
  field = *v;
  return {};
}

Result<Plan> make_plan(const KvPlanArgs& a) {
  Plan p;
  if (!a.preset.empty()) {
    auto m = kv::find_preset(a.preset);
    if (!m) {
      std::string names;
      for (const kv::ModelConfig& c : kv::presets()) names += (names.empty() ? "" : ", ") + c.name;
      return Status::error(fmt::format("--preset: unknown model '{}' (known: {})", a.preset, names));
    }
    p.model = *m;
    p.context = m->max_context;
  } else {
    if (!a.layers || !a.heads || !a.kv_heads || !a.head_dim)
      return Status::error("without --preset, give --layers, --heads, --kv-heads and --head-dim");
    if (!a.context) return Status::error("without --preset, give --context");
    p.model.name = "custom";
  }
  ESCALA_RETURN_IF_ERROR(apply_int(a.layers, "--layers", 1, p.model.num_layers));
  ESCALA_RETURN_IF_ERROR(apply_int(a.heads, "--heads", 1, p.model.num_heads));
  ESCALA_RETURN_IF_ERROR(apply_int(a.kv_heads, "--kv-heads", 1, p.model.num_kv_heads));
  ESCALA_RETURN_IF_ERROR(apply_int(a.head_dim, "--head-dim", 1, p.model.head_dim));
  ESCALA_RETURN_IF_ERROR(apply_int(a.context, "--context", 1, p.context));
  ESCALA_RETURN_IF_ERROR(apply_int(a.batch, "--batch", 1, p.batch));
  ESCALA_RETURN_IF_ERROR(apply_int(a.block_size, "--block-size", 1, p.block_size));
  if (a.window) {
    ESCALA_RETURN_IF_ERROR(apply_int(a.window, "--sliding-window", 0, p.model.window));
    // A window on a model without local layers applies to every layer; 0 turns it off.
    if (p.model.window == 0)
      p.model.local = kv::LocalLayers::kNone;
    else if (p.model.local == kv::LocalLayers::kNone)
      p.model.local = kv::LocalLayers::kAll;
  }
  auto fmt_opt = kv::parse_format(a.dtype);
  if (!fmt_opt)
    return Status::error(
        fmt::format("--dtype: unknown cache format '{}' (fp32, fp16, bf16, fp8, int8, int4)", a.dtype));
  p.format = *fmt_opt;
  if (a.weights && !a.device_memory) return Status::error("--weights needs --device-memory");
  if (a.device_memory) {
    auto d = kv::parse_byte_size(*a.device_memory);
    if (!d.ok()) return Status::error(fmt::format("--device-memory: {}", d.message()));
    if (*d == 0) return Status::error("--device-memory: must be > 0 bytes");
    p.device_memory = *d;
    p.weights = 0;
  }
  if (a.weights) {
    auto w = kv::parse_byte_size(*a.weights);
    if (!w.ok()) return Status::error(fmt::format("--weights: {}", w.message()));
    p.weights = *w;
  }
  ESCALA_RETURN_IF_ERROR(kv::validate_config(p.model));
  return p;
}

std::string describe_layers(const kv::ModelConfig& m) {
  if (m.num_local_layers() == 0) return fmt::format("{} layers", m.num_layers);
  if (m.num_global_layers() == 0)
    return fmt::format("{} layers, all with a {}-token sliding window", m.num_layers, m.window);
  return fmt::format("{} layers ({} local with a {}-token window, {} global)", m.num_layers, m.num_local_layers(),
                     m.window, m.num_global_layers());
}

int run(const KvPlanArgs& args) {
  auto plan_r = make_plan(args);
  if (!plan_r.ok()) return report_error(plan_r.status());
  const Plan& p = *plan_r;
  const kv::ModelConfig& m = p.model;

  auto bytes_for = [&](const kv::ModelConfig& model, kv::KvFormat f) {
    return kv::kv_cache_bytes(model, p.context, p.batch, f, p.block_size);
  };
  auto main_bytes = bytes_for(m, p.format);
  if (!main_bytes.ok()) return report_error(main_bytes.status());
  kv::ModelConfig mha = m, mqa = m;
  mha.num_kv_heads = m.num_heads;
  mqa.num_kv_heads = 1;
  auto mha_bytes = bytes_for(mha, p.format);
  if (!mha_bytes.ok()) return report_error(mha_bytes.status());
  auto mqa_bytes = bytes_for(mqa, p.format);
  if (!mqa_bytes.ok()) return report_error(mqa_bytes.status());
  auto token_bytes = kv::token_bytes_per_layer(m.num_kv_heads, m.head_dim, p.format);
  if (!token_bytes.ok()) return report_error(token_bytes.status());
  auto block = kv::block_bytes(m.num_layers, m.num_kv_heads, m.head_dim, p.format, p.block_size);
  if (!block.ok()) return report_error(block.status());

  struct FormatRow {
    kv::KvFormat f;
    kv::KvBytes b;
  };
  std::vector<FormatRow> rows;
  for (kv::KvFormat f : kv::kAllFormats) {
    auto b = bytes_for(m, f);
    if (!b.ok()) return report_error(b.status());
    rows.push_back({f, *b});
  }

  std::optional<kv::Fit> fit;
  int64_t per_sequence = 0;
  if (p.device_memory) {
    auto per_seq = kv::paged_sequence_bytes(m, p.context, p.format, p.block_size);
    if (!per_seq.ok()) return report_error(per_seq.status());
    per_sequence = *per_seq;
    auto f = kv::sequences_that_fit(*p.device_memory, *p.weights, per_sequence);
    if (!f.ok()) return report_error(f.status());
    fit = *f;
  }

  const std::string dtype(kv::format_name(p.format));
  if (args.json) {
    using nlohmann::ordered_json;
    auto add_bytes = [](ordered_json& o, const kv::KvBytes& b) {
      o["bytes"] = b.total;
      o["data_bytes"] = b.data;
      o["scale_bytes"] = b.scales;
      o["gib"] = double(b.total) / double(int64_t{1} << 30);
      o["gb"] = double(b.total) / 1e9;
    };
    ordered_json j;
    j["model"] = {{"name", m.name},
                  {"layers", m.num_layers},
                  {"heads", m.num_heads},
                  {"kv_heads", m.num_kv_heads},
                  {"head_dim", m.head_dim},
                  {"sliding_window", m.window},
                  {"local_layers", m.num_local_layers()},
                  {"max_context", m.max_context}};
    j["context"] = p.context;
    j["batch"] = p.batch;
    j["dtype"] = dtype;
    j["block_size"] = p.block_size;
    add_bytes(j, *main_bytes);
    j["bytes_per_token_per_layer"] = *token_bytes;
    j["bytes_per_block"] = *block;
    j["mha"]["kv_heads"] = mha.num_kv_heads;
    add_bytes(j["mha"], *mha_bytes);
    j["mqa"]["kv_heads"] = 1;
    add_bytes(j["mqa"], *mqa_bytes);
    j["formats"] = ordered_json::array();
    for (const FormatRow& r : rows) {
      ordered_json e;
      e["dtype"] = std::string(kv::format_name(r.f));
      add_bytes(e, r.b);
      j["formats"].push_back(e);
    }
    if (fit) {
      j["fit"] = {{"device_memory", *p.device_memory},  {"weights", *p.weights},       {"free_bytes", fit->free_bytes},
                  {"bytes_per_sequence", per_sequence}, {"sequences", fit->sequences}, {"message", fit->message}};
    }
    fmt::print("{}\n", j.dump());
    return 0;
  }

  const kv::KvBytes& b = *main_bytes;
  fmt::print("model    {}: {}, {} heads, {} kv heads, head dim {}\n", m.name, describe_layers(m), m.num_heads,
             m.num_kv_heads, m.head_dim);
  fmt::print("cache    {} tokens x batch {}, {}, blocks of {} tokens\n", p.context, p.batch, dtype, p.block_size);
  fmt::print("KV cache {} bytes = {} GiB = {} GB", b.total, kv::format_gib(b.total), kv::format_gb(b.total));
  if (b.scales > 0) fmt::print(" (data {} + scales {})", b.data, b.scales);
  fmt::print("\n");
  fmt::print("         {} bytes per token per layer; {} bytes per block of {} tokens over all {} layers\n\n",
             *token_bytes, *block, p.block_size, m.num_layers);

  fmt::print("{:<10} {:>8} {:>20} {:>12} {:>12}\n", "attention", "kv heads", "bytes", "GiB", "GB");
  auto attn_row = [&](std::string_view name, int64_t kvh, const kv::KvBytes& x) {
    fmt::print("{:<10} {:>8} {:>20} {:>12} {:>12}\n", name, kvh, x.total, kv::format_gib(x.total),
               kv::format_gb(x.total));
  };
  attn_row(m.num_kv_heads == m.num_heads ? "MHA" : (m.num_kv_heads == 1 ? "MQA" : "GQA"), m.num_kv_heads, b);
  attn_row("MHA", mha.num_kv_heads, *mha_bytes);
  attn_row("MQA", 1, *mqa_bytes);

  fmt::print("\n{:<10} {:>20} {:>14} {:>20} {:>12}\n", "format", "data bytes", "scale bytes", "total bytes", "GiB");
  for (const FormatRow& r : rows)
    fmt::print("{:<10} {:>20} {:>14} {:>20} {:>12}\n", kv::format_name(r.f), r.b.data, r.b.scales, r.b.total,
               kv::format_gib(r.b.total));
  fmt::print(
      "(int8: f32 scale per token and kv head; fp8: f32 scale per block and kv head; "
      "int4: f16 scale per {} elements)\n",
      kv::kInt4GroupSize);

  if (fit) {
    fmt::print("\ndevice   {} bytes ({} GiB), weights {} bytes ({} GiB), {} bytes per sequence of {} tokens\n",
               *p.device_memory, kv::format_gib(*p.device_memory), *p.weights, kv::format_gib(*p.weights), per_sequence,
               p.context);
    if (fit->sequences == 0)
      fmt::print("fits     0 sequences: {}\n", fit->message);
    else
      fmt::print("fits     {} concurrent sequences of {} tokens ({} bytes free for the cache)\n", fit->sequences,
                 p.context, fit->free_bytes);
  }
  return 0;
}

}  // namespace

void add_kv_plan_command(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<KvPlanArgs>();
  CLI::App* cmd = app.add_subcommand("kv-plan", "KV-cache size of a model: every format, MHA/GQA/MQA, what fits");
  cmd->add_option("--preset", args->preset,
                  "llama-3-8b, llama-3-70b, llama-3.1-405b, mistral-7b, qwen2-7b, gemma-2-9b, smollm2-135m")
      ->type_name("NAME");
  cmd->add_option("--layers", args->layers, "number of layers L")->type_name("N");
  cmd->add_option("--heads", args->heads, "query heads h")->type_name("N");
  cmd->add_option("--kv-heads", args->kv_heads, "key/value heads h_kv")->type_name("N");
  cmd->add_option("--head-dim", args->head_dim, "head dimension d_h")->type_name("N");
  cmd->add_option("--sliding-window", args->window, "window of the local layers in tokens (0: none)")->type_name("N");
  cmd->add_option("--context", args->context, "tokens per sequence T (default: the model's context)")->type_name("T");
  cmd->add_option("--batch", args->batch, "sequences B (default 1)")->type_name("B");
  cmd->add_option("--dtype", args->dtype, "cache format: fp32, fp16, bf16, fp8, int8, int4 (default fp16)")
      ->type_name("DTYPE");
  cmd->add_option("--block-size", args->block_size, "tokens per cache block (default 16)")->type_name("N");
  cmd->add_option("--device-memory", args->device_memory, "device memory: bytes or with GB/GiB/MB/MiB suffix")
      ->type_name("SIZE");
  cmd->add_option("--weights", args->weights, "memory taken by the weights: bytes or with a suffix")->type_name("SIZE");
  cmd->add_flag("--json", args->json, "print one JSON object");
  cmd->callback([args, &exit_code] { exit_code = run(*args); });
}

}  // namespace escala::cli

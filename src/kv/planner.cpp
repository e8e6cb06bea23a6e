// The KV-cache formula and model presets. See planner.h.
#include "kv/planner.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

namespace escala::kv {

namespace {

// Checked int64 arithmetic: one overflow anywhere turns the whole product into an error.
class Checked {
 public:
  explicit Checked(int64_t v) : v_(v) {}
  Checked& mul(int64_t x) {
    ok_ = ok_ && !__builtin_mul_overflow(v_, x, &v_);
    return *this;
  }
  Checked& add(int64_t x) {
    ok_ = ok_ && !__builtin_add_overflow(v_, x, &v_);
    return *this;
  }
  Result<int64_t> get() const {
    if (!ok_) return Status::error("kv-plan: the result overflows 2^63 bytes");
    return v_;
  }

 private:
  int64_t v_;
  bool ok_ = true;
};

int64_t ceil_div(int64_t a, int64_t b) { return a / b + (a % b != 0); }

// Stored bytes of one (token, kv head) row of d elements, for K or for V.
int64_t row_bytes(int64_t head_dim, KvFormat f) { return ceil_div(head_dim * format_bits(f), 8); }

// Per-token scale bytes of one (token, kv head) row.
int64_t row_scale_bytes(int64_t head_dim, KvFormat f) {
  switch (f) {
    case KvFormat::kInt8: return 4;                                       // f32 per (token, head)
    case KvFormat::kInt4: return 2 * ceil_div(head_dim, kInt4GroupSize);  // f16 per group of 32
    default: return 0;
  }
}

Status check_dims(int64_t num_kv_heads, int64_t head_dim) {
  ESCALA_CHECK_ARG(num_kv_heads >= 1, "kv-plan: kv heads must be >= 1 (got {})", num_kv_heads);
  ESCALA_CHECK_ARG(head_dim >= 1, "kv-plan: head dim must be >= 1 (got {})", head_dim);
  // Keeps row_bytes' head_dim * bits from overflowing; no real head is anywhere near this.
  ESCALA_CHECK_ARG(head_dim <= (int64_t{1} << 40), "kv-plan: head dim {} is absurd", head_dim);
  return {};
}

const std::vector<ModelConfig>& preset_table() {
  // Values from each model's published config.json (num_hidden_layers, num_attention_heads,
  // num_key_value_heads, head_dim or hidden_size / heads, max_position_embeddings, sliding_window).
  static const std::vector<ModelConfig> kPresets = {
      {"llama-3-8b", 32, 32, 8, 128, 8192, 0, LocalLayers::kNone},
      {"llama-3-70b", 80, 64, 8, 128, 8192, 0, LocalLayers::kNone},
      {"llama-3.1-405b", 126, 128, 8, 128, 131072, 0, LocalLayers::kNone},
      // v0.1: every layer attends through a 4096-token window (max_position_embeddings 32768).
      {"mistral-7b", 32, 32, 8, 128, 32768, 4096, LocalLayers::kAll},
      // 32768 is the context Qwen2-7B was trained for; longer needs YaRN scaling.
      {"qwen2-7b", 28, 28, 4, 128, 32768, 0, LocalLayers::kNone},
      // Alternating local (4096-token window) and global layers, head_dim 256 (not hidden/heads).
      {"gemma-2-9b", 42, 16, 8, 256, 8192, 4096, LocalLayers::kAlternate},
      {"smollm2-135m", 30, 9, 3, 64, 8192, 0, LocalLayers::kNone},
  };
  return kPresets;
}

std::string trim_decimal(double v) {
  std::string s = fmt::format("{:.3f}", v);
  while (!s.empty() && s.back() == '0') s.pop_back();
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

}  // namespace

std::string_view format_name(KvFormat f) {
  switch (f) {
    case KvFormat::kF32: return "fp32";
    case KvFormat::kF16: return "fp16";
    case KvFormat::kBF16: return "bf16";
    case KvFormat::kFp8: return "fp8";
    case KvFormat::kInt8: return "int8";
    case KvFormat::kInt4: return "int4";
  }
  return "?";
}

std::optional<KvFormat> parse_format(std::string_view n) {
  if (n == "fp32" || n == "f32" || n == "float32") return KvFormat::kF32;
  if (n == "fp16" || n == "f16" || n == "float16") return KvFormat::kF16;
  if (n == "bf16" || n == "bfloat16") return KvFormat::kBF16;
  if (n == "fp8" || n == "fp8_e4m3" || n == "e4m3") return KvFormat::kFp8;
  if (n == "int8" || n == "i8") return KvFormat::kInt8;
  if (n == "int4" || n == "i4") return KvFormat::kInt4;
  return std::nullopt;
}

KvFormat format_of(DType t) {
  switch (t) {
    case DType::kF32: return KvFormat::kF32;
    case DType::kF16: return KvFormat::kF16;
    case DType::kBF16: return KvFormat::kBF16;
    case DType::kI8: return KvFormat::kInt8;
    case DType::kFp8E4M3: return KvFormat::kFp8;
  }
  return KvFormat::kF32;
}

int64_t format_bits(KvFormat f) {
  switch (f) {
    case KvFormat::kF32: return 32;
    case KvFormat::kF16:
    case KvFormat::kBF16: return 16;
    case KvFormat::kFp8:
    case KvFormat::kInt8: return 8;
    case KvFormat::kInt4: return 4;
  }
  return 0;
}

int64_t ModelConfig::num_local_layers() const {
  if (window <= 0) return 0;
  switch (local) {
    case LocalLayers::kNone: return 0;
    case LocalLayers::kAll: return num_layers;
    case LocalLayers::kAlternate: return (num_layers + 1) / 2;  // layers 0, 2, 4, ...
  }
  return 0;
}

std::span<const ModelConfig> presets() { return preset_table(); }

std::optional<ModelConfig> find_preset(std::string_view name) {
  for (const ModelConfig& m : preset_table())
    if (m.name == name) return m;
  return std::nullopt;
}

Status validate_config(const ModelConfig& m) {
  ESCALA_CHECK_ARG(m.num_layers >= 1, "kv-plan: layers must be >= 1 (got {})", m.num_layers);
  ESCALA_CHECK_ARG(m.num_heads >= 1, "kv-plan: heads must be >= 1 (got {})", m.num_heads);
  ESCALA_RETURN_IF_ERROR(check_dims(m.num_kv_heads, m.head_dim));
  ESCALA_CHECK_ARG(m.num_kv_heads <= m.num_heads && m.num_heads % m.num_kv_heads == 0,
                   "kv-plan: heads ({}) must be a multiple of kv heads ({})", m.num_heads, m.num_kv_heads);
  ESCALA_CHECK_ARG(m.window >= 0, "kv-plan: sliding window must be >= 0 (got {})", m.window);
  ESCALA_CHECK_ARG(m.local == LocalLayers::kNone || m.window > 0, "kv-plan: local layers need a sliding window > 0");
  return {};
}

std::vector<LayerGroup> layer_groups(const ModelConfig& m) {
  std::vector<LayerGroup> groups;
  if (m.num_global_layers() > 0) groups.push_back({m.num_global_layers(), 0});
  if (m.num_local_layers() > 0) groups.push_back({m.num_local_layers(), m.window});
  return groups;
}

Result<int64_t> token_bytes_per_layer(int64_t num_kv_heads, int64_t head_dim, KvFormat f) {
  ESCALA_RETURN_IF_ERROR(check_dims(num_kv_heads, head_dim));
  // 2 (K and V) * h_kv * (row data + row scales)
  return Checked(2).mul(num_kv_heads).mul(row_bytes(head_dim, f) + row_scale_bytes(head_dim, f)).get();
}

Result<int64_t> block_scale_bytes_per_layer(int64_t num_kv_heads, KvFormat f) {
  ESCALA_CHECK_ARG(num_kv_heads >= 1, "kv-plan: kv heads must be >= 1 (got {})", num_kv_heads);
  if (f != KvFormat::kFp8) return int64_t{0};
  return Checked(2).mul(num_kv_heads).mul(4).get();  // f32 per (block, kv head), K and V
}

Result<int64_t> block_bytes(int64_t num_layers, int64_t num_kv_heads, int64_t head_dim, KvFormat f,
                            int64_t block_size) {
  ESCALA_CHECK_ARG(num_layers >= 1, "kv-plan: layers must be >= 1 (got {})", num_layers);
  ESCALA_CHECK_ARG(block_size >= 1, "kv-plan: block size must be >= 1 (got {})", block_size);
  auto token = token_bytes_per_layer(num_kv_heads, head_dim, f);
  if (!token.ok()) return token.status();
  auto scales = block_scale_bytes_per_layer(num_kv_heads, f);
  if (!scales.ok()) return scales.status();
  auto per_layer = Checked(*token).mul(block_size).add(*scales).get();
  if (!per_layer.ok()) return per_layer.status();
  return Checked(*per_layer).mul(num_layers).get();
}

Result<int64_t> blocks_in_budget(int64_t budget_bytes, int64_t bytes_per_block) {
  ESCALA_CHECK_ARG(budget_bytes >= 0, "kv-plan: byte budget must be >= 0 (got {})", budget_bytes);
  ESCALA_CHECK_ARG(bytes_per_block >= 1, "kv-plan: block bytes must be >= 1 (got {})", bytes_per_block);
  return budget_bytes / bytes_per_block;
}

Result<KvBytes> kv_cache_bytes(const ModelConfig& m, int64_t context, int64_t batch, KvFormat f, int64_t block_size) {
  ESCALA_RETURN_IF_ERROR(validate_config(m));
  ESCALA_CHECK_ARG(context >= 1, "kv-plan: context must be >= 1 token (got {})", context);
  ESCALA_CHECK_ARG(batch >= 1, "kv-plan: batch must be >= 1 (got {})", batch);
  ESCALA_CHECK_ARG(block_size >= 1, "kv-plan: block size must be >= 1 (got {})", block_size);
  Checked data(0), scales(0);
  const int64_t row = row_bytes(m.head_dim, f), row_scale = row_scale_bytes(m.head_dim, f);
  auto block_scale = block_scale_bytes_per_layer(m.num_kv_heads, f);
  if (!block_scale.ok()) return block_scale.status();
  for (const LayerGroup& g : layer_groups(m)) {
    const int64_t tokens = g.resident_tokens(context);
    // 2 · L · B · T · h_kv · (d · bytes_per_elem)
    auto d = Checked(2).mul(g.num_layers).mul(batch).mul(tokens).mul(m.num_kv_heads).mul(row).get();
    auto s_tok = Checked(2).mul(g.num_layers).mul(batch).mul(tokens).mul(m.num_kv_heads).mul(row_scale).get();
    auto s_blk = Checked(g.num_layers).mul(batch).mul(ceil_div(tokens, block_size)).mul(*block_scale).get();
    if (!d.ok()) return d.status();
    if (!s_tok.ok()) return s_tok.status();
    if (!s_blk.ok()) return s_blk.status();
    data.add(*d);
    scales.add(*s_tok).add(*s_blk);
  }
  KvBytes out;
  auto dv = data.get(), sv = scales.get();
  if (!dv.ok()) return dv.status();
  if (!sv.ok()) return sv.status();
  out.data = *dv;
  out.scales = *sv;
  auto total = Checked(out.data).add(out.scales).get();
  if (!total.ok()) return total.status();
  out.total = *total;
  return out;
}

Result<int64_t> paged_sequence_bytes(const ModelConfig& m, int64_t context, KvFormat f, int64_t block_size) {
  ESCALA_RETURN_IF_ERROR(validate_config(m));
  ESCALA_CHECK_ARG(context >= 1, "kv-plan: context must be >= 1 token (got {})", context);
  Checked total(0);
  for (const LayerGroup& g : layer_groups(m)) {
    auto per_block = block_bytes(g.num_layers, m.num_kv_heads, m.head_dim, f, block_size);
    if (!per_block.ok()) return per_block.status();
    auto group = Checked(*per_block).mul(ceil_div(g.resident_tokens(context), block_size)).get();
    if (!group.ok()) return group.status();
    total.add(*group);
  }
  return total.get();
}

Result<Fit> sequences_that_fit(int64_t device_memory, int64_t weights, int64_t bytes_per_sequence) {
  ESCALA_CHECK_ARG(device_memory >= 1, "kv-plan: device memory must be >= 1 byte (got {})", device_memory);
  ESCALA_CHECK_ARG(weights >= 0, "kv-plan: weights must be >= 0 bytes (got {})", weights);
  ESCALA_CHECK_ARG(bytes_per_sequence >= 1, "kv-plan: bytes per sequence must be >= 1 (got {})", bytes_per_sequence);
  Fit fit;
  if (weights >= device_memory) {
    fit.message =
        weights > device_memory
            ? fmt::format("the weights alone ({} bytes) do not fit in device memory ({} bytes)", weights, device_memory)
            : fmt::format("the weights ({} bytes) fill all of device memory; no room for a KV cache", weights);
    return fit;
  }
  fit.free_bytes = device_memory - weights;
  fit.sequences = fit.free_bytes / bytes_per_sequence;
  if (fit.sequences == 0)
    fit.message = fmt::format("one sequence needs {} bytes of KV cache but only {} bytes are left after the weights",
                              bytes_per_sequence, fit.free_bytes);
  return fit;
}

Result<int64_t> parse_byte_size(std::string_view text) {
  auto bad = [&](std::string_view why) {
    return Status::error(
        fmt::format("invalid size '{}': {} (expected e.g. 80GB, 24GiB, 512MiB or 1000000)", text, why));
  };
  size_t i = 0;
  unsigned __int128 whole = 0;
  const unsigned __int128 kCap = (unsigned __int128)1 << 64;  // past 2^63; the exact check is below
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
    whole = whole * 10 + unsigned(text[i] - '0');
    if (whole > kCap) return bad("too large");
    ++i;
  }
  if (i == 0) return bad("it must start with a digit");
  unsigned __int128 frac = 0, frac_scale = 1;
  if (i < text.size() && text[i] == '.') {
    ++i;
    const size_t start = i;
    while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
      if (i - start < 18) {  // digits past 1e-18 cannot change a whole-byte count
        frac = frac * 10 + unsigned(text[i] - '0');
        frac_scale *= 10;
      }
      ++i;
    }
    if (i == start) return bad("digits must follow the decimal point");
  }
  std::string unit(text.substr(i));
  std::transform(unit.begin(), unit.end(), unit.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  struct Unit {
    const char* name;
    uint64_t mult;
  };
  static constexpr Unit kUnits[] = {{"", 1},
                                    {"b", 1},
                                    {"kb", 1000ull},
                                    {"kib", 1ull << 10},
                                    {"mb", 1000000ull},
                                    {"mib", 1ull << 20},
                                    {"gb", 1000000000ull},
                                    {"gib", 1ull << 30},
                                    {"tb", 1000000000000ull},
                                    {"tib", 1ull << 40}};
  const Unit* u = nullptr;
  for (const Unit& c : kUnits)
    if (unit == c.name) u = &c;
  if (!u) return bad(fmt::format("unknown unit '{}'", text.substr(i)));
  const unsigned __int128 bytes = whole * u->mult + frac * u->mult / frac_scale;
  if (bytes > (unsigned __int128)INT64_MAX) return bad("it overflows 2^63 bytes");
  return int64_t(bytes);
}

std::string format_gib(int64_t bytes) { return trim_decimal(double(bytes) / double(int64_t{1} << 30)); }
std::string format_gb(int64_t bytes) { return trim_decimal(double(bytes) / 1e9); }

}  // namespace escala::kv

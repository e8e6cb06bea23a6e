// Typed metadata accessors and the per-architecture key table.
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>

#include <fmt/format.h>

#include "escala/gguf.h"
#include "model/gguf_internal.h"

namespace escala::model {

std::string_view gguf_value_type_name(GgufValueType t) {
  switch (t) {
    case GgufValueType::kU8: return "u8";
    case GgufValueType::kI8: return "i8";
    case GgufValueType::kU16: return "u16";
    case GgufValueType::kI16: return "i16";
    case GgufValueType::kU32: return "u32";
    case GgufValueType::kI32: return "i32";
    case GgufValueType::kF32: return "f32";
    case GgufValueType::kBool: return "bool";
    case GgufValueType::kString: return "string";
    case GgufValueType::kArray: return "array";
    case GgufValueType::kU64: return "u64";
    case GgufValueType::kI64: return "i64";
    case GgufValueType::kF64: return "f64";
  }
  return "?";
}

namespace {

bool is_signed_type(GgufValueType t) {
  return t == GgufValueType::kI8 || t == GgufValueType::kI16 || t == GgufValueType::kI32 ||
         t == GgufValueType::kI64;
}
bool is_integer_type(GgufValueType t) {
  return is_signed_type(t) || t == GgufValueType::kU8 || t == GgufValueType::kU16 ||
         t == GgufValueType::kU32 || t == GgufValueType::kU64;
}

std::string type_label(const GgufValue& v) {
  if (v.type == GgufValueType::kArray)
    return fmt::format("array of {}", gguf_value_type_name(v.elem_type));
  return std::string(gguf_value_type_name(v.type));
}

Status wrong_type(std::string_view key, const GgufValue& v, std::string_view expected) {
  return Status::error(fmt::format("gguf: metadata '{}' has type {}, expected {}", printable(key),
                                   type_label(v), expected));
}

// An integer value widened to a signed 128-bit range check.
struct Wide {
  bool negative;
  uint64_t magnitude;  // the value when !negative
  int64_t signed_value;
};
Wide widen(const GgufValue& v) {
  if (is_signed_type(v.type)) return {v.i < 0, static_cast<uint64_t>(v.i), v.i};
  return {false, v.u, static_cast<int64_t>(v.u)};
}

template <class T>
Result<T> get_int(const GgufFile& f, std::string_view key, std::string_view tname) {
  const GgufValue* v = f.find(key);
  if (!v) return Status::error(fmt::format("gguf: metadata '{}' is missing", printable(key)));
  if (!is_integer_type(v->type)) return wrong_type(key, *v, tname);
  Wide w = widen(*v);
  bool fits;
  if (w.negative) {
    fits = std::is_signed_v<T> && w.signed_value >= static_cast<int64_t>(std::numeric_limits<T>::min());
  } else {
    fits = w.magnitude <= static_cast<uint64_t>(std::numeric_limits<T>::max());
  }
  if (!fits)
    return Status::error(fmt::format("gguf: metadata '{}' = {} does not fit in {}", printable(key),
                                     w.negative ? fmt::format("{}", w.signed_value)
                                                : fmt::format("{}", w.magnitude),
                                     tname));
  return w.negative ? static_cast<T>(w.signed_value) : static_cast<T>(w.magnitude);
}

template <class T>
T load(const uint8_t* p) {
  T x;
  std::memcpy(&x, p, sizeof(T));
  return x;
}

}  // namespace

bool GgufValue::is_integer() const { return is_integer_type(type); }

Result<uint32_t> GgufFile::get_u32(std::string_view key) const { return get_int<uint32_t>(*this, key, "u32"); }
Result<int32_t> GgufFile::get_i32(std::string_view key) const { return get_int<int32_t>(*this, key, "i32"); }
Result<uint64_t> GgufFile::get_u64(std::string_view key) const { return get_int<uint64_t>(*this, key, "u64"); }
Result<int64_t> GgufFile::get_i64(std::string_view key) const { return get_int<int64_t>(*this, key, "i64"); }

Result<double> GgufFile::get_f64(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return Status::error(fmt::format("gguf: metadata '{}' is missing", printable(key)));
  if (!v->is_float()) return wrong_type(key, *v, "f32");
  return v->f;
}

Result<float> GgufFile::get_f32(std::string_view key) const {
  auto r = get_f64(key);
  if (!r.ok()) return r.status();
  return static_cast<float>(*r);
}

Result<bool> GgufFile::get_bool(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return Status::error(fmt::format("gguf: metadata '{}' is missing", printable(key)));
  if (v->type != GgufValueType::kBool) return wrong_type(key, *v, "bool");
  return v->u != 0;
}

Result<std::string_view> GgufFile::get_string(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return Status::error(fmt::format("gguf: metadata '{}' is missing", printable(key)));
  if (v->type != GgufValueType::kString) return wrong_type(key, *v, "string");
  return v->str;
}

Result<std::vector<std::string_view>> GgufFile::get_string_array(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return Status::error(fmt::format("gguf: metadata '{}' is missing", printable(key)));
  if (v->type != GgufValueType::kArray || v->elem_type != GgufValueType::kString)
    return wrong_type(key, *v, "array of string");
  return v->strings;
}

Result<std::vector<int64_t>> GgufFile::get_int_array(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return Status::error(fmt::format("gguf: metadata '{}' is missing", printable(key)));
  if (v->type != GgufValueType::kArray || !is_integer_type(v->elem_type))
    return wrong_type(key, *v, "array of integers");
  std::vector<int64_t> out(v->count);
  uint64_t sz = gguf_fixed_size(v->elem_type);
  for (uint64_t k = 0; k < v->count; ++k) {
    const uint8_t* p = v->raw + k * sz;
    switch (v->elem_type) {
      case GgufValueType::kU8: out[k] = load<uint8_t>(p); break;
      case GgufValueType::kI8: out[k] = load<int8_t>(p); break;
      case GgufValueType::kU16: out[k] = load<uint16_t>(p); break;
      case GgufValueType::kI16: out[k] = load<int16_t>(p); break;
      case GgufValueType::kU32: out[k] = load<uint32_t>(p); break;
      case GgufValueType::kI32: out[k] = load<int32_t>(p); break;
      case GgufValueType::kI64: out[k] = load<int64_t>(p); break;
      case GgufValueType::kU64: {
        uint64_t x = load<uint64_t>(p);
        if (x > static_cast<uint64_t>(INT64_MAX))
          return Status::error(fmt::format("gguf: metadata '{}' element {} = {} does not fit in i64",
                                           printable(key), k, x));
        out[k] = static_cast<int64_t>(x);
        break;
      }
      default: break;
    }
  }
  return out;
}

Result<std::vector<float>> GgufFile::get_f32_array(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return Status::error(fmt::format("gguf: metadata '{}' is missing", printable(key)));
  if (v->type != GgufValueType::kArray ||
      (v->elem_type != GgufValueType::kF32 && v->elem_type != GgufValueType::kF64))
    return wrong_type(key, *v, "array of f32");
  std::vector<float> out(v->count);
  for (uint64_t k = 0; k < v->count; ++k)
    out[k] = v->elem_type == GgufValueType::kF32 ? load<float>(v->raw + 4 * k)
                                                 : static_cast<float>(load<double>(v->raw + 8 * k));
  return out;
}

Result<uint32_t> GgufFile::get_u32_or(std::string_view key, uint32_t fallback) const {
  return has(key) ? get_u32(key) : Result<uint32_t>(fallback);
}
Result<float> GgufFile::get_f32_or(std::string_view key, float fallback) const {
  return has(key) ? get_f32(key) : Result<float>(fallback);
}

// ---- Architectures -------------------------------------------------------------------------

namespace {

enum class Need : uint8_t { kNo, kOpt, kReq };   // not read / optional / required
enum class Kind : uint8_t { kCount, kU32, kF32, kString };  // kCount: u32 > 0

struct ArchKey {
  std::string_view suffix;  // the key is "<arch>.<suffix>"
  Kind kind;
  Need llama, qwen2, gemma2;
};

constexpr Need R = Need::kReq, O = Need::kOpt, N = Need::kNo;

// The one table of what each architecture needs. llama covers Llama 2/3, SmolLM2, TinyLlama
// and Mistral; gemma2's soft-caps and window default to 50, 30 and 4096 when absent.
constexpr ArchKey kArchKeys[] = {
    // suffix                                  kind          llama qwen2 gemma2
    {"context_length",                         Kind::kCount,  R,    R,    R},
    {"embedding_length",                       Kind::kCount,  R,    R,    R},
    {"block_count",                            Kind::kCount,  R,    R,    R},
    {"feed_forward_length",                    Kind::kCount,  R,    R,    R},
    {"attention.head_count",                   Kind::kCount,  R,    R,    R},
    {"attention.head_count_kv",                Kind::kCount,  O,    O,    O},
    {"attention.key_length",                   Kind::kCount,  O,    O,    O},
    {"attention.value_length",                 Kind::kCount,  O,    O,    O},
    {"attention.layer_norm_rms_epsilon",       Kind::kF32,    R,    R,    R},
    {"rope.dimension_count",                   Kind::kCount,  O,    O,    O},
    {"rope.freq_base",                         Kind::kF32,    O,    O,    O},
    {"rope.scaling.type",                      Kind::kString, O,    O,    O},
    {"rope.scaling.factor",                    Kind::kF32,    O,    O,    O},
    {"rope.scaling.original_context_length",   Kind::kCount,  O,    O,    O},
    {"attention.sliding_window",               Kind::kU32,    O,    N,    O},
    {"attn_logit_softcapping",                 Kind::kF32,    N,    N,    O},
    {"final_logit_softcapping",                Kind::kF32,    N,    N,    O},
    {"vocab_size",                             Kind::kCount,  O,    O,    O},
};

constexpr std::string_view kArchitectures[] = {"llama", "qwen2", "gemma2"};

Need need_for(const ArchKey& k, size_t arch) {
  return arch == 0 ? k.llama : arch == 1 ? k.qwen2 : k.gemma2;
}

Status check_key(const GgufFile& f, const std::string& key, Kind kind) {
  switch (kind) {
    case Kind::kCount: {
      auto r = f.get_u32(key);
      if (!r.ok()) return r.status();
      if (*r == 0) return Status::error(fmt::format("gguf: metadata '{}' is 0", key));
      return {};
    }
    case Kind::kU32: return f.get_u32(key).status();
    case Kind::kF32: {
      auto r = f.get_f32(key);
      if (!r.ok()) return r.status();
      if (!std::isfinite(*r))
        return Status::error(fmt::format("gguf: metadata '{}' is not finite", key));
      return {};
    }
    case Kind::kString: return f.get_string(key).status();
  }
  return {};
}

}  // namespace

std::span<const std::string_view> supported_architectures() { return kArchitectures; }

Result<ArchParams> read_arch_params(const GgufFile& f) {
  auto arch_r = f.get_string("general.architecture");
  if (!arch_r.ok()) return arch_r.status();
  std::string_view arch = *arch_r;
  size_t ai = std::size(kArchitectures);
  for (size_t k = 0; k < std::size(kArchitectures); ++k)
    if (kArchitectures[k] == arch) ai = k;
  if (ai == std::size(kArchitectures))
    return Status::error(fmt::format("gguf: architecture '{}' is not supported (llama, qwen2, "
                                     "gemma2)",
                                     printable(arch)));
  for (const ArchKey& k : kArchKeys) {
    Need need = need_for(k, ai);
    if (need == Need::kNo) continue;
    std::string key = fmt::format("{}.{}", arch, k.suffix);
    if (!f.has(key)) {
      if (need == Need::kReq)
        return Status::error(fmt::format("gguf: metadata '{}' is missing (required for {})", key,
                                         arch));
      continue;
    }
    ESCALA_RETURN_IF_ERROR(check_key(f, key, k.kind));
  }

  // Every key was checked above, so the reads below cannot fail.
  auto key = [&](std::string_view suffix) { return fmt::format("{}.{}", arch, suffix); };
  ArchParams p;
  p.arch = std::string(arch);
  p.context_length = *f.get_u32(key("context_length"));
  p.embedding_length = *f.get_u32(key("embedding_length"));
  p.block_count = *f.get_u32(key("block_count"));
  p.feed_forward_length = *f.get_u32(key("feed_forward_length"));
  p.head_count = *f.get_u32(key("attention.head_count"));
  p.head_count_kv = *f.get_u32_or(key("attention.head_count_kv"), p.head_count);
  p.rms_norm_eps = *f.get_f32(key("attention.layer_norm_rms_epsilon"));
  p.rope_freq_base = *f.get_f32_or(key("rope.freq_base"), 10000.0f);
  p.vocab_size = *f.get_u32_or(key("vocab_size"), 0);
  bool gemma2 = arch == "gemma2";
  if (arch != "qwen2")
    p.sliding_window = *f.get_u32_or(key("attention.sliding_window"), gemma2 ? 4096 : 0);
  if (gemma2) {
    p.attn_logit_softcap = *f.get_f32_or(key("attn_logit_softcapping"), 50.0f);
    p.final_logit_softcap = *f.get_f32_or(key("final_logit_softcapping"), 30.0f);
  }

  if (p.head_count_kv > p.head_count || p.head_count % p.head_count_kv != 0)
    return Status::error(fmt::format("gguf: {}.attention.head_count_kv = {} does not divide "
                                     "head_count = {}",
                                     arch, p.head_count_kv, p.head_count));
  if (f.has(key("attention.key_length"))) {
    p.head_dim = *f.get_u32(key("attention.key_length"));
  } else {
    if (p.embedding_length % p.head_count != 0)
      return Status::error(fmt::format("gguf: {}.embedding_length = {} is not a multiple of "
                                       "head_count = {}",
                                       arch, p.embedding_length, p.head_count));
    p.head_dim = p.embedding_length / p.head_count;
  }
  p.rope_dimension_count = *f.get_u32_or(key("rope.dimension_count"), p.head_dim);
  if (p.rope_dimension_count > p.head_dim || p.rope_dimension_count % 2 != 0)
    return Status::error(fmt::format("gguf: {}.rope.dimension_count = {} must be even and at most "
                                     "the head dimension {}",
                                     arch, p.rope_dimension_count, p.head_dim));
  if (!(p.rms_norm_eps > 0))
    return Status::error(fmt::format("gguf: {}.attention.layer_norm_rms_epsilon = {} must be > 0",
                                     arch, p.rms_norm_eps));
  // Caught here rather than as non-finite K/V at the first forward pass.
  if (!(p.rope_freq_base > 0))
    return Status::error(fmt::format("gguf: {}.rope.freq_base = {} must be > 0", arch, p.rope_freq_base));
  if (p.attn_logit_softcap < 0 || p.final_logit_softcap < 0)
    return Status::error(fmt::format("gguf: {}'s logit soft-caps ({}, {}) must be >= 0 (0: none)", arch,
                                     p.attn_logit_softcap, p.final_logit_softcap));
  return p;
}

}  // namespace escala::model

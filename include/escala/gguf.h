// GGUF (v2 and v3): a validating, memory-mapping reader and a writer for test fixtures.
//
// Everything in the file is checked once, in `GgufFile::open` / `parse`, before any of it is
// used: afterwards every tensor's bytes lie inside the mapping and every metadata value is
// well-formed, so later accessors never touch memory out of bounds.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "escala/quant.h"
#include "escala/status.h"

namespace escala::model {

inline constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" read as little-endian u32
inline constexpr uint32_t kGgufDefaultAlignment = 32;
inline constexpr int kGgufMaxDims = 4;

// Metadata value types, numbered as in the GGUF specification.
enum class GgufValueType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};
std::string_view gguf_value_type_name(GgufValueType t);

// One metadata value. Strings point into the file mapping (valid while the GgufFile lives).
struct GgufValue {
  GgufValueType type = GgufValueType::kU8;
  uint64_t u = 0;  // unsigned integers and bool
  int64_t i = 0;   // signed integers
  double f = 0;    // f32 / f64
  std::string_view str;
  // Arrays: element type and count; numeric elements stay in the file (read with array_*),
  // strings and nested arrays are parsed.
  GgufValueType elem_type = GgufValueType::kU8;
  uint64_t count = 0;
  const uint8_t* raw = nullptr;  // first element of a numeric array
  std::vector<std::string_view> strings;
  std::vector<GgufValue> items;

  bool is_integer() const;
  bool is_float() const { return type == GgufValueType::kF32 || type == GgufValueType::kF64; }
};

struct GgufTensor {
  std::string_view name;
  TensorType type = TensorType::kF32;
  int n_dims = 0;
  std::array<int64_t, kGgufMaxDims> ne{1, 1, 1, 1};  // ne[0] is the contiguous dimension
  uint64_t offset = 0;                              // from the start of the data section
  uint64_t size = 0;                                // bytes
  const uint8_t* data = nullptr;

  int64_t elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
  // ne[0] columns by ne[1]*ne[2]*ne[3] rows.
  WeightView as_matrix() const;
};

class GgufFile {
 public:
  // Maps `path` read-only and validates it. Errors name the file and what is wrong.
  static Result<GgufFile> open(const std::string& path);
  // Validates a buffer the caller keeps alive (tests, the fuzzer).
  static Result<GgufFile> parse(std::span<const uint8_t> bytes);

  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }
  uint64_t file_size() const { return bytes_.size(); }

  // Metadata in file order.
  const std::vector<std::pair<std::string_view, GgufValue>>& metadata() const { return kv_; }
  const GgufValue* find(std::string_view key) const;
  bool has(std::string_view key) const { return find(key) != nullptr; }

  // Typed accessors: a missing key or a value of another type is an error naming the key.
  // Integers convert between widths when the value fits; floats accept f32 and f64.
  Result<uint32_t> get_u32(std::string_view key) const;
  Result<int32_t> get_i32(std::string_view key) const;
  Result<uint64_t> get_u64(std::string_view key) const;
  Result<int64_t> get_i64(std::string_view key) const;
  Result<float> get_f32(std::string_view key) const;
  Result<double> get_f64(std::string_view key) const;
  Result<bool> get_bool(std::string_view key) const;
  Result<std::string_view> get_string(std::string_view key) const;
  Result<std::vector<std::string_view>> get_string_array(std::string_view key) const;
  Result<std::vector<int64_t>> get_int_array(std::string_view key) const;
  Result<std::vector<float>> get_f32_array(std::string_view key) const;
  // Optional keys: the default when absent, an error when present with the wrong type.
  Result<uint32_t> get_u32_or(std::string_view key, uint32_t fallback) const;
  Result<float> get_f32_or(std::string_view key, float fallback) const;

  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  const GgufTensor* find_tensor(std::string_view name) const;

  // Drops the resident pages of a tensor's bytes from the mapping, for weights the runtime keeps in
  // its own layout: they no longer count in the process's memory, and are read from the file again
  // if touched. A no-op for parse().
  void release_pages(const GgufTensor& t) const;

 private:
  static Result<GgufFile> parse_impl(std::span<const uint8_t> bytes);

  std::shared_ptr<void> mapping_;  // keeps the mmap alive; null for parse()
  std::span<const uint8_t> bytes_;
  uint32_t version_ = 0;
  uint32_t alignment_ = kGgufDefaultAlignment;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string_view, GgufValue>> kv_;
  std::map<std::string_view, size_t, std::less<>> kv_index_;
  std::vector<GgufTensor> tensors_;
  std::map<std::string_view, size_t, std::less<>> tensor_index_;
};

// ---- Architectures -------------------------------------------------------------------------

// The hyper-parameters the runtime reads; keys are "<arch>.<suffix>" (see kArchKeys in
// gguf_arch.cpp for the one table of required and optional keys).
struct ArchParams {
  std::string arch;
  uint32_t context_length = 0;
  uint32_t embedding_length = 0;
  uint32_t block_count = 0;
  uint32_t feed_forward_length = 0;
  uint32_t head_count = 0;
  uint32_t head_count_kv = 0;      // defaults to head_count
  uint32_t head_dim = 0;           // key_length, else rope.dimension_count, else n_embd/n_head
  uint32_t rope_dimension_count = 0;  // defaults to head_dim
  float rms_norm_eps = 0;
  float rope_freq_base = 10000.0f;
  uint32_t sliding_window = 0;     // 0: none
  float attn_logit_softcap = 0;    // 0: none (gemma2)
  float final_logit_softcap = 0;   // 0: none (gemma2)
  uint32_t vocab_size = 0;         // 0: take it from the token list
};

// The architectures Escala knows ("llama", "qwen2", "gemma2").
std::span<const std::string_view> supported_architectures();

// Reads general.architecture and checks every key that architecture needs (presence, type,
// sane values such as head_count_kv dividing head_count). One error naming the first problem.
Result<ArchParams> read_arch_params(const GgufFile& file);

// ---- Writer --------------------------------------------------------------------------------

// A metadata value to write. Arrays may nest.
struct GgufWriteValue {
  GgufValueType type = GgufValueType::kU32;
  uint64_t u = 0;
  int64_t i = 0;
  double f = 0;
  std::string str;
  GgufValueType elem_type = GgufValueType::kU32;
  std::vector<GgufWriteValue> items;

  static GgufWriteValue u8(uint8_t v);
  static GgufWriteValue i8(int8_t v);
  static GgufWriteValue u16(uint16_t v);
  static GgufWriteValue i16(int16_t v);
  static GgufWriteValue u32(uint32_t v);
  static GgufWriteValue i32(int32_t v);
  static GgufWriteValue u64(uint64_t v);
  static GgufWriteValue i64(int64_t v);
  static GgufWriteValue f32(float v);
  static GgufWriteValue f64(double v);
  static GgufWriteValue boolean(bool v);
  static GgufWriteValue string(std::string v);
  // Every item must have type `elem_type` (checked when writing).
  static GgufWriteValue array(GgufValueType elem_type, std::vector<GgufWriteValue> items);
  static GgufWriteValue string_array(const std::vector<std::string>& v);
  static GgufWriteValue i32_array(const std::vector<int32_t>& v);
  static GgufWriteValue f32_array(const std::vector<float>& v);
};

class GgufWriter {
 public:
  explicit GgufWriter(uint32_t version = 3) : version_(version) {}

  // Replaces an existing key. "general.alignment" (u32, a power of two) sets the padding.
  void set(std::string key, GgufWriteValue value);
  // Quantizes `values` (f32, ne[0]-major) to `type`. ne has 1..4 entries; ne[0] must be a
  // multiple of the type's block size.
  Status add_tensor(std::string name, TensorType type, std::vector<int64_t> ne,
                    std::span<const float> values);
  // Already-encoded bytes (row_bytes(type, ne[0]) * rows).
  Status add_tensor_bytes(std::string name, TensorType type, std::vector<int64_t> ne,
                          std::span<const uint8_t> bytes);

  // The whole file in memory, and an atomic write (temp file in the same folder, then rename).
  Result<std::vector<uint8_t>> to_bytes() const;
  Status write(const std::string& path) const;

 private:
  struct Tensor {
    std::string name;
    TensorType type;
    std::vector<int64_t> ne;
    std::vector<uint8_t> bytes;
  };
  uint32_t version_;
  std::vector<std::pair<std::string, GgufWriteValue>> kv_;
  std::vector<Tensor> tensors_;
};

}  // namespace escala::model

// NumPy .npy files: a strict reader and an atomic writer (format versions 1.0, 2.0 and 3.0,
// little-endian '<f4', '<f2', '<i4' and '|i1', C order only).
//
// The reader trusts nothing in the file: magic, version, header length, the header dict (parsed
// here, not by a general Python-literal evaluator), the shape (no overflow; the element count times
// the item size must equal the data bytes exactly) and the dtype are all checked, and every problem
// is a one-line error naming the file. The writer never leaves a partial file behind: it writes a
// temporary file next to the target and renames it into place.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "escala/status.h"

namespace escala::npy {

enum class NpyDType : uint8_t { kF32, kF16, kI32, kI8 };

// Item size in bytes and the descr string written to the header ('<f4', ...).
size_t npy_itemsize(NpyDType t);
std::string_view npy_descr(NpyDType t);
// Human name for error messages: float32, float16, int32, int8.
std::string_view npy_type_name(NpyDType t);

struct NpyArray {
  NpyDType dtype = NpyDType::kF32;
  std::vector<int64_t> shape;  // empty: a 0-d array (one element)
  std::vector<uint8_t> data;   // little-endian, C order, exactly numel() * itemsize bytes

  int64_t numel() const;
  std::string shape_string() const;  // "(3, 4)" as NumPy prints it

  // Typed views; the caller must have checked dtype (vector storage is suitably aligned).
  const float* f32() const { return reinterpret_cast<const float*>(data.data()); }
  const uint16_t* f16() const { return reinterpret_cast<const uint16_t*>(data.data()); }
  const int32_t* i32() const { return reinterpret_cast<const int32_t*>(data.data()); }
};

// Builds an array from typed values (copies them).
NpyArray make_f32(std::vector<int64_t> shape, std::span<const float> values);
NpyArray make_f16(std::vector<int64_t> shape, std::span<const uint16_t> values);
NpyArray make_i32(std::vector<int64_t> shape, std::span<const int32_t> values);

// Parses a whole .npy image held in memory; `name` is used in error messages.
Result<NpyArray> parse_npy(std::span<const uint8_t> bytes, std::string_view name);

// Reads and parses a file.
Result<NpyArray> read_npy(const std::string& path);

// Serialises an array. version 0 picks the smallest that fits (1.0 unless the header needs 2.0);
// 1, 2 or 3 forces that format version. The header is padded so the data starts 64-byte aligned.
Result<std::vector<uint8_t>> encode_npy(const NpyArray& array, int version = 0);

// A file written under a temporary name next to its target. commit() renames it into place;
// if it is never committed the destructor removes it, so a failed run leaves nothing behind.
class StagedFile {
 public:
  StagedFile() = default;
  StagedFile(std::string temp_path, std::string final_path)
      : temp_path_(std::move(temp_path)), final_path_(std::move(final_path)) {}
  StagedFile(const StagedFile&) = delete;
  StagedFile& operator=(const StagedFile&) = delete;
  StagedFile(StagedFile&& other) noexcept { *this = std::move(other); }
  StagedFile& operator=(StagedFile&& other) noexcept;
  ~StagedFile() { discard(); }

  Status commit();
  void discard();
  const std::string& temp_path() const { return temp_path_; }
  const std::string& final_path() const { return final_path_; }

 private:
  std::string temp_path_, final_path_;
};

// Writes `bytes` to a fresh temporary file in the directory of `path` (flushed and closed).
Result<StagedFile> stage_file(const std::string& path, std::span<const uint8_t> bytes);
Result<StagedFile> stage_npy(const std::string& path, const NpyArray& array, int version = 0);

// Atomic write: stage, then rename.
Status write_npy(const std::string& path, const NpyArray& array, int version = 0);

}  // namespace escala::npy

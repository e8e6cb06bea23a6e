// Strict .npy reading and atomic .npy writing. See npy.h for the contract.
#include "common/npy.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <random>

namespace escala::npy {

static_assert(std::endian::native == std::endian::little, ".npy data is read in place: little-endian hosts only");

namespace {

constexpr uint8_t kMagic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
constexpr size_t kMaxDims = 32;  // NumPy's own limit is 64; no tensor here needs more than a few
constexpr size_t kAlign = 64;    // data offset alignment written by NumPy >= 1.14

Status fail(std::string_view name, std::string_view what) { return Status::error(fmt::format("{}: {}", name, what)); }

// A strict parser of the one dict literal NumPy writes: {'descr': '<f4', 'fortran_order': False,
// 'shape': (3, 4), }. Only str, bool and tuple-of-int values; no escapes, no expressions.
class HeaderParser {
 public:
  HeaderParser(std::string_view text, std::string_view name) : s_(text), name_(name) {}

  struct Fields {
    std::optional<std::string> descr;
    std::optional<bool> fortran_order;
    std::optional<std::vector<int64_t>> shape;
  };

  Result<Fields> parse() {
    Fields f;
    skip_ws();
    ESCALA_RETURN_IF_ERROR(expect('{'));
    skip_ws();
    while (!at('}')) {
      auto key = parse_string();
      if (!key.ok()) return key.status();
      skip_ws();
      ESCALA_RETURN_IF_ERROR(expect(':'));
      skip_ws();
      if (*key == "descr") {
        if (f.descr) return error("key 'descr' appears twice");
        auto v = parse_string();
        if (!v.ok()) return v.status();
        f.descr = std::move(*v);
      } else if (*key == "fortran_order") {
        if (f.fortran_order) return error("key 'fortran_order' appears twice");
        auto v = parse_bool();
        if (!v.ok()) return v.status();
        f.fortran_order = *v;
      } else if (*key == "shape") {
        if (f.shape) return error("key 'shape' appears twice");
        auto v = parse_shape();
        if (!v.ok()) return v.status();
        f.shape = std::move(*v);
      } else {
        return error(fmt::format("unexpected key '{}'", *key));
      }
      skip_ws();
      if (at(',')) {
        ++pos_;
        skip_ws();
      } else if (!at('}')) {
        return error(fmt::format("expected ',' or '}}' at offset {}", pos_));
      }
    }
    ++pos_;  // '}'
    // NumPy pads the header with spaces and ends it with exactly one newline.
    while (pos_ < s_.size() && s_[pos_] == ' ') ++pos_;
    if (pos_ + 1 != s_.size() || s_[pos_] != '\n')
      return error("header must end with '}', space padding and one newline");
    if (!f.descr) return error("key 'descr' is missing");
    if (!f.fortran_order) return error("key 'fortran_order' is missing");
    if (!f.shape) return error("key 'shape' is missing");
    return f;
  }

 private:
  Status error(std::string_view what) const { return fail(name_, fmt::format("bad .npy header: {}", what)); }
  bool at(char c) const { return pos_ < s_.size() && s_[pos_] == c; }
  void skip_ws() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t')) ++pos_;
  }
  Status expect(char c) {
    if (!at(c)) return error(fmt::format("expected '{}' at offset {}", c, pos_));
    ++pos_;
    return {};
  }

  Result<std::string> parse_string() {
    if (!at('\'') && !at('"')) return error(fmt::format("expected a quoted string at offset {}", pos_));
    const char quote = s_[pos_++];
    const size_t start = pos_;
    while (pos_ < s_.size() && s_[pos_] != quote) {
      const char c = s_[pos_];
      if (c == '\\' || c == '\n') return error("escapes and newlines are not allowed in header strings");
      ++pos_;
    }
    if (pos_ >= s_.size()) return error("unterminated string");
    std::string out(s_.substr(start, pos_ - start));
    ++pos_;
    return out;
  }

  Result<bool> parse_bool() {
    if (s_.substr(pos_, 4) == "True") {
      pos_ += 4;
      return true;
    }
    if (s_.substr(pos_, 5) == "False") {
      pos_ += 5;
      return false;
    }
    return error("fortran_order must be True or False");
  }

  Result<int64_t> parse_int() {
    const size_t start = pos_;
    int64_t v = 0;
    while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
      if (__builtin_mul_overflow(v, int64_t{10}, &v) || __builtin_add_overflow(v, int64_t(s_[pos_] - '0'), &v))
        return error("shape dimension overflows 64 bits");
      ++pos_;
    }
    if (pos_ == start) return error(fmt::format("expected a non-negative integer in shape at offset {}", pos_));
    if (s_[start] == '0' && pos_ - start > 1) return error("shape dimension has a leading zero");
    return v;
  }

  // '()', '(n,)', '(a, b)', '(a, b,)'. '(n)' is not a tuple in Python and is rejected.
  Result<std::vector<int64_t>> parse_shape() {
    ESCALA_RETURN_IF_ERROR(expect('('));
    std::vector<int64_t> dims;
    bool trailing_comma = false;
    skip_ws();
    while (!at(')')) {
      if (pos_ >= s_.size()) return error("unterminated shape tuple");
      auto d = parse_int();
      if (!d.ok()) return d.status();
      if (dims.size() == kMaxDims) return error(fmt::format("more than {} dimensions", kMaxDims));
      dims.push_back(*d);
      skip_ws();
      trailing_comma = false;
      if (at(',')) {
        ++pos_;
        trailing_comma = true;
        skip_ws();
      } else if (!at(')')) {
        return error(fmt::format("expected ',' or ')' in shape at offset {}", pos_));
      }
    }
    ++pos_;
    if (dims.size() == 1 && !trailing_comma) return error("a one-element shape needs a trailing comma: (n,)");
    return dims;
  }

  std::string_view s_;
  std::string_view name_;
  size_t pos_ = 0;
};

std::optional<NpyDType> dtype_from_descr(std::string_view d) {
  if (d == "<f4") return NpyDType::kF32;
  if (d == "<f2") return NpyDType::kF16;
  if (d == "<i4") return NpyDType::kI32;
  if (d == "|i1") return NpyDType::kI8;
  return std::nullopt;
}

std::string shape_to_string(const std::vector<int64_t>& shape) {
  if (shape.empty()) return "()";
  if (shape.size() == 1) return fmt::format("({},)", shape[0]);
  return fmt::format("({})", fmt::join(shape, ", "));
}

Status write_all(int fd, const uint8_t* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return Status::error(std::strerror(errno));
    }
    p += w;
    n -= size_t(w);
  }
  return {};
}

}  // namespace

size_t npy_itemsize(NpyDType t) {
  switch (t) {
    case NpyDType::kF32:
    case NpyDType::kI32: return 4;
    case NpyDType::kF16: return 2;
    case NpyDType::kI8: return 1;
  }
  return 0;
}

std::string_view npy_descr(NpyDType t) {
  switch (t) {
    case NpyDType::kF32: return "<f4";
    case NpyDType::kF16: return "<f2";
    case NpyDType::kI32: return "<i4";
    case NpyDType::kI8: return "|i1";
  }
  return "?";
}

std::string_view npy_type_name(NpyDType t) {
  switch (t) {
    case NpyDType::kF32: return "float32";
    case NpyDType::kF16: return "float16";
    case NpyDType::kI32: return "int32";
    case NpyDType::kI8: return "int8";
  }
  return "?";
}

int64_t NpyArray::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // parse_npy / make_* guarantee no overflow
  return n;
}

std::string NpyArray::shape_string() const { return shape_to_string(shape); }

namespace {
template <class T>
NpyArray make_typed(NpyDType t, std::vector<int64_t> shape, std::span<const T> values) {
  NpyArray a;
  a.dtype = t;
  a.shape = std::move(shape);
  a.data.resize(values.size_bytes());
  if (!values.empty()) std::memcpy(a.data.data(), values.data(), values.size_bytes());
  return a;
}
}  // namespace

NpyArray make_f32(std::vector<int64_t> shape, std::span<const float> v) {
  return make_typed(NpyDType::kF32, std::move(shape), v);
}
NpyArray make_f16(std::vector<int64_t> shape, std::span<const uint16_t> v) {
  return make_typed(NpyDType::kF16, std::move(shape), v);
}
NpyArray make_i32(std::vector<int64_t> shape, std::span<const int32_t> v) {
  return make_typed(NpyDType::kI32, std::move(shape), v);
}

Result<NpyArray> parse_npy(std::span<const uint8_t> bytes, std::string_view name) {
  if (bytes.size() < 10) return fail(name, fmt::format("too short for a .npy file ({} bytes)", bytes.size()));
  if (std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) return fail(name, "not a .npy file (bad magic)");
  const int major = bytes[6], minor = bytes[7];
  if (major < 1 || major > 3 || minor != 0)
    return fail(name, fmt::format("unsupported .npy format version {}.{}", major, minor));
  size_t header_len, start;
  if (major == 1) {
    header_len = size_t(bytes[8]) | size_t(bytes[9]) << 8;
    start = 10;
  } else {
    if (bytes.size() < 12)
      return fail(name, fmt::format("too short for a .npy {}.0 file ({} bytes)", major, bytes.size()));
    header_len = size_t(bytes[8]) | size_t(bytes[9]) << 8 | size_t(bytes[10]) << 16 | size_t(bytes[11]) << 24;
    start = 12;
  }
  if (header_len == 0) return fail(name, "empty .npy header");
  if (header_len > bytes.size() - start)
    return fail(name,
                fmt::format("header length {} runs past the end of the file ({} bytes)", header_len, bytes.size()));
  const std::string_view header(reinterpret_cast<const char*>(bytes.data() + start), header_len);
  for (size_t i = 0; i < header.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(header[i]);
    if ((c < 0x20 && c != '\n' && c != '\t') || c > 0x7e)
      return fail(name, fmt::format("bad .npy header: unexpected byte 0x{:02x} at offset {}", c, i));
  }
  auto fields = HeaderParser(header, name).parse();
  if (!fields.ok()) return fields.status();

  const std::string& descr = *fields->descr;
  const auto dtype = dtype_from_descr(descr);
  if (!dtype) {
    if (!descr.empty() && descr[0] == '>')
      return fail(name, fmt::format("big-endian dtype '{}' is not supported", descr));
    return fail(name, fmt::format("unsupported dtype '{}' (expected <f4, <f2, <i4 or |i1)", descr));
  }
  if (*fields->fortran_order)
    return fail(name, "Fortran-order arrays are not supported (save with np.ascontiguousarray)");

  NpyArray a;
  a.dtype = *dtype;
  a.shape = std::move(*fields->shape);
  int64_t bytes_needed = int64_t(npy_itemsize(a.dtype));
  for (int64_t d : a.shape)
    if (__builtin_mul_overflow(bytes_needed, d, &bytes_needed))
      return fail(name, fmt::format("shape {} overflows 64 bits", shape_to_string(a.shape)));
  const size_t data_bytes = bytes.size() - start - header_len;
  if (uint64_t(bytes_needed) != data_bytes)
    return fail(name, fmt::format("shape {} of {} needs {} data bytes but the file has {}{}", shape_to_string(a.shape),
                                  npy_type_name(a.dtype), bytes_needed, data_bytes,
                                  uint64_t(bytes_needed) > data_bytes ? " (truncated?)" : ""));
  a.data.assign(bytes.begin() + ptrdiff_t(start + header_len), bytes.end());
  return a;
}

Result<NpyArray> read_npy(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return fail(path, fmt::format("cannot open: {}", std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return fail(path, "not a regular file");
  }
  std::vector<uint8_t> buf(size_t(st.st_size));
  size_t got = 0;
  while (got < buf.size()) {
    const ssize_t r = ::read(fd, buf.data() + got, buf.size() - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += size_t(r);
  }
  const int read_errno = errno;
  ::close(fd);
  if (got != buf.size())
    return fail(path, fmt::format("read failed after {} of {} bytes: {}", got, buf.size(),
                                  got < buf.size() ? std::strerror(read_errno) : "file changed"));
  return parse_npy(buf, path);
}

Result<std::vector<uint8_t>> encode_npy(const NpyArray& a, int version) {
  ESCALA_CHECK_ARG(version >= 0 && version <= 3, "npy: format version must be 1, 2 or 3 (got {})", version);
  ESCALA_CHECK_ARG(a.shape.size() <= kMaxDims, "npy: more than {} dimensions", kMaxDims);
  int64_t need = int64_t(npy_itemsize(a.dtype));
  for (int64_t d : a.shape) {
    ESCALA_CHECK_ARG(d >= 0, "npy: negative dimension in shape {}", shape_to_string(a.shape));
    ESCALA_CHECK_ARG(!__builtin_mul_overflow(need, d, &need), "npy: shape {} overflows", shape_to_string(a.shape));
  }
  ESCALA_CHECK_ARG(uint64_t(need) == a.data.size(), "npy: shape {} of {} needs {} bytes, array holds {}",
                   shape_to_string(a.shape), npy_type_name(a.dtype), need, a.data.size());

  std::string dict = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}", npy_descr(a.dtype),
                                 shape_to_string(a.shape));
  auto padded_len = [&](size_t preamble) {
    const size_t unpadded = preamble + dict.size() + 1;  // + '\n'
    return (unpadded + kAlign - 1) / kAlign * kAlign - preamble;
  };
  if (version == 0) version = padded_len(10) <= 0xffff ? 1 : 2;
  const size_t preamble = version == 1 ? 10 : 12;
  const size_t header_len = padded_len(preamble);
  ESCALA_CHECK_ARG(version != 1 || header_len <= 0xffff, "npy: header of {} bytes needs format version 2.0",
                   header_len);

  std::vector<uint8_t> out;
  out.reserve(preamble + header_len + a.data.size());
  out.insert(out.end(), kMagic, kMagic + sizeof(kMagic));
  out.push_back(uint8_t(version));
  out.push_back(0);
  for (size_t i = 0; i < preamble - 8; ++i) out.push_back(uint8_t(header_len >> (8 * i)));
  out.insert(out.end(), dict.begin(), dict.end());
  out.insert(out.end(), header_len - dict.size() - 1, uint8_t(' '));
  out.push_back('\n');
  out.insert(out.end(), a.data.begin(), a.data.end());
  return out;
}

StagedFile& StagedFile::operator=(StagedFile&& other) noexcept {
  if (this != &other) {
    discard();
    temp_path_ = std::move(other.temp_path_);
    final_path_ = std::move(other.final_path_);
    other.temp_path_.clear();
  }
  return *this;
}

void StagedFile::discard() {
  if (!temp_path_.empty()) ::unlink(temp_path_.c_str());
  temp_path_.clear();
}

Status StagedFile::commit() {
  if (temp_path_.empty()) return Status::error(fmt::format("{}: nothing staged to commit", final_path_));
  if (::rename(temp_path_.c_str(), final_path_.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    discard();
    return fail(final_path_, fmt::format("cannot rename temporary file into place: {}", why));
  }
  temp_path_.clear();
  return {};
}

Result<StagedFile> stage_file(const std::string& path, std::span<const uint8_t> bytes) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  if (target.filename().empty()) return fail(path, "output path names a directory");
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  static std::atomic<uint64_t> counter{0};
  thread_local std::mt19937_64 rng{std::random_device{}()};
  for (int attempt = 0; attempt < 16; ++attempt) {
    // Hidden, unique name in the same directory, so rename() is atomic (same file system).
    const fs::path temp = dir / fmt::format(".{}.tmp-{}-{}-{:x}", target.filename().string(), ::getpid(),
                                            counter.fetch_add(1), rng() & 0xffffff);
    const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0) {
      if (errno == EEXIST) continue;
      return fail(path, fmt::format("cannot create a file in {}: {}", dir.string(), std::strerror(errno)));
    }
    StagedFile staged(temp.string(), path);
    Status st = write_all(fd, bytes.data(), bytes.size());
    if (st.ok() && ::fsync(fd) != 0) st = Status::error(std::strerror(errno));
    if (::close(fd) != 0 && st.ok()) st = Status::error(std::strerror(errno));
    if (!st.ok()) return fail(path, fmt::format("write failed: {}", st.message()));
    return staged;
  }
  return fail(path, "cannot find a free temporary file name");
}

Result<StagedFile> stage_npy(const std::string& path, const NpyArray& array, int version) {
  auto bytes = encode_npy(array, version);
  if (!bytes.ok()) return fail(path, bytes.message());
  return stage_file(path, *bytes);
}

Status write_npy(const std::string& path, const NpyArray& array, int version) {
  auto staged = stage_npy(path, array, version);
  if (!staged.ok()) return staged.status();
  return staged->commit();
}

}  // namespace escala::npy

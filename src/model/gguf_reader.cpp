// GGUF reader: maps the file and validates every field before anything is used.
//
// Layout (all little-endian): magic "GGUF", u32 version, u64 tensor_count, u64 kv_count, the
// metadata entries (string key, u32 type, value), the tensor infos (string name, u32 n_dims,
// u64 ne[n_dims], u32 type, u64 offset), padding to general.alignment, then the data section.
// Strings are a u64 length and that many bytes (no terminator).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "escala/gguf.h"
#include "model/gguf_internal.h"

namespace escala::model {
namespace {

constexpr uint64_t kMaxKeyLength = 65535;    // the spec's bound for keys
constexpr uint64_t kMaxTensorNameLength = 64;  // ggml's GGML_MAX_NAME
constexpr int kMaxArrayDepth = 8;              // nested arrays deeper than this are rejected
constexpr uint64_t kMinKvBytes = 8 + 1 + 4 + 1;  // key length, 1-byte key, type, 1-byte value
constexpr uint64_t kMinTensorInfoBytes = 8 + 1 + 4 + 4 + 8;

// Sequential reads over the file bytes; every read is bounds-checked.
class Cursor {
 public:
  explicit Cursor(std::span<const uint8_t> b) : b_(b) {}
  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return b_.size() - pos_; }
  const uint8_t* here() const { return b_.data() + pos_; }

  template <class T>
  bool read(T& out) {
    if (remaining() < sizeof(T)) return false;
    std::memcpy(&out, here(), sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool skip(uint64_t n) {
    if (remaining() < n) return false;
    pos_ += n;
    return true;
  }

 private:
  std::span<const uint8_t> b_;
  uint64_t pos_ = 0;
};

// Names of ggml types Escala does not load, so the error says what the file holds.
std::string ggml_type_label(uint32_t id) {
  static constexpr const char* kNames[] = {
      "f32",     "f16",    "q4_0",    "q4_1",  "q4_2",  "q4_3",    "q5_0",  "q5_1",
      "q8_0",    "q8_1",   "q2_K",    "q3_K",  "q4_K",  "q5_K",    "q6_K",  "q8_K",
      "iq2_xxs", "iq2_xs", "iq3_xxs", "iq1_s", "iq4_nl", "iq3_s",   "iq2_s", "iq4_xs",
      "i8",      "i16",    "i32",     "i64",   "f64",   "iq1_m",   "bf16",  "q4_0_4_4",
      "q4_0_4_8", "q4_0_8_8", "tq1_0", "tq2_0"};
  if (id < std::size(kNames)) return fmt::format("{} ({})", id, kNames[id]);
  return fmt::format("{}", id);
}

bool valid_value_type(uint32_t t) { return t <= static_cast<uint32_t>(GgufValueType::kF64); }

class Parser {
 public:
  explicit Parser(std::span<const uint8_t> bytes) : c_(bytes), size_(bytes.size()) {}

  Status truncated(std::string_view what) const {
    return Status::error(fmt::format("gguf: file truncated while reading {} (at byte {} of {})",
                                     what, c_.pos(), size_));
  }

  Status read_string(std::string_view& out, uint64_t max_len, std::string_view what) {
    uint64_t len = 0;
    if (!c_.read(len)) return truncated(fmt::format("the length of {}", what));
    if (len > max_len)
      return Status::error(fmt::format("gguf: {} has length {} (limit {}) at byte {}", what, len,
                                       max_len, c_.pos() - 8));
    if (len > c_.remaining())
      return Status::error(fmt::format(
          "gguf: {} has length {} but only {} bytes remain in the file (at byte {})", what, len,
          c_.remaining(), c_.pos() - 8));
    out = std::string_view(reinterpret_cast<const char*>(c_.here()), len);
    c_.skip(len);
    return {};
  }

  Status read_value(GgufValueType type, GgufValue& v, int depth, const std::string& what) {
    v.type = type;
    switch (type) {
      case GgufValueType::kU8: return read_int<uint8_t>(v, what);
      case GgufValueType::kI8: return read_int<int8_t>(v, what);
      case GgufValueType::kU16: return read_int<uint16_t>(v, what);
      case GgufValueType::kI16: return read_int<int16_t>(v, what);
      case GgufValueType::kU32: return read_int<uint32_t>(v, what);
      case GgufValueType::kI32: return read_int<int32_t>(v, what);
      case GgufValueType::kU64: return read_int<uint64_t>(v, what);
      case GgufValueType::kI64: return read_int<int64_t>(v, what);
      case GgufValueType::kF32: {
        float f;
        if (!c_.read(f)) return truncated(what);
        v.f = f;
        return {};
      }
      case GgufValueType::kF64:
        if (!c_.read(v.f)) return truncated(what);
        return {};
      case GgufValueType::kBool: {
        uint8_t b;
        if (!c_.read(b)) return truncated(what);
        if (b > 1)
          return Status::error(fmt::format("gguf: {} is a bool with byte value {} (must be 0 or 1)",
                                           what, b));
        v.u = b;
        return {};
      }
      case GgufValueType::kString:
        return read_string(v.str, UINT64_MAX, what);
      case GgufValueType::kArray:
        return read_array(v, depth, what);
    }
    return Status::error(fmt::format("gguf: {} has unknown value type", what));
  }

  Status read_array(GgufValue& v, int depth, const std::string& what) {
    if (depth >= kMaxArrayDepth)
      return Status::error(fmt::format("gguf: {} nests arrays deeper than {}", what, kMaxArrayDepth));
    uint32_t et = 0;
    if (!c_.read(et)) return truncated(fmt::format("the element type of {}", what));
    if (!valid_value_type(et))
      return Status::error(fmt::format("gguf: {} has unknown array element type {}", what, et));
    uint64_t count = 0;
    if (!c_.read(count)) return truncated(fmt::format("the element count of {}", what));
    v.elem_type = static_cast<GgufValueType>(et);
    v.count = count;
    uint64_t min_elem = gguf_fixed_size(v.elem_type);
    if (v.elem_type == GgufValueType::kString) min_elem = 8;
    if (v.elem_type == GgufValueType::kArray) min_elem = 12;
    if (count > c_.remaining() / min_elem)
      return Status::error(fmt::format(
          "gguf: {} claims {} elements of type {} but only {} bytes remain in the file", what,
          count, gguf_value_type_name(v.elem_type), c_.remaining()));
    if (gguf_fixed_size(v.elem_type) != 0) {
      v.raw = c_.here();
      if (v.elem_type == GgufValueType::kBool) {
        for (uint64_t k = 0; k < count; ++k)
          if (v.raw[k] > 1)
            return Status::error(fmt::format(
                "gguf: {} element {} is a bool with byte value {} (must be 0 or 1)", what, k,
                v.raw[k]));
      }
      c_.skip(count * min_elem);
      return {};
    }
    if (v.elem_type == GgufValueType::kString) {
      v.strings.resize(count);
      for (uint64_t k = 0; k < count; ++k)
        ESCALA_RETURN_IF_ERROR(
            read_string(v.strings[k], UINT64_MAX, fmt::format("{} element {}", what, k)));
      return {};
    }
    v.items.resize(count);
    for (uint64_t k = 0; k < count; ++k)
      ESCALA_RETURN_IF_ERROR(read_value(GgufValueType::kArray, v.items[k], depth + 1,
                                        fmt::format("{} element {}", what, k)));
    return {};
  }

  template <class T>
  Status read_int(GgufValue& v, const std::string& what) {
    T x;
    if (!c_.read(x)) return truncated(what);
    if constexpr (std::is_signed_v<T>) {
      v.i = x;
    } else {
      v.u = x;
    }
    return {};
  }

  Cursor c_;
  uint64_t size_;
};

}  // namespace

std::string printable(std::string_view s) {
  std::string out;
  for (char ch : s.substr(0, 80)) {
    auto u = static_cast<unsigned char>(ch);
    if (u >= 0x20 && u < 0x7f && ch != '\'') {
      out += ch;
    } else {
      out += fmt::format("\\x{:02x}", u);
    }
  }
  if (s.size() > 80) out += "...";
  return out;
}

uint64_t gguf_fixed_size(GgufValueType t) {
  switch (t) {
    case GgufValueType::kU8:
    case GgufValueType::kI8:
    case GgufValueType::kBool: return 1;
    case GgufValueType::kU16:
    case GgufValueType::kI16: return 2;
    case GgufValueType::kU32:
    case GgufValueType::kI32:
    case GgufValueType::kF32: return 4;
    case GgufValueType::kU64:
    case GgufValueType::kI64:
    case GgufValueType::kF64: return 8;
    case GgufValueType::kString:
    case GgufValueType::kArray: return 0;
  }
  return 0;
}

Result<GgufFile> GgufFile::parse(std::span<const uint8_t> bytes) { return parse_impl(bytes); }

Result<GgufFile> GgufFile::parse_impl(std::span<const uint8_t> bytes) {
  GgufFile file;
  file.bytes_ = bytes;
  Parser p(bytes);
  Cursor& c = p.c_;

  uint32_t magic = 0;
  if (!c.read(magic)) return p.truncated("the magic");
  if (magic != kGgufMagic) {
    return Status::error(fmt::format("gguf: bad magic 0x{:08x} (expected \"GGUF\")", magic));
  }
  if (!c.read(file.version_)) return p.truncated("the version");
  if (file.version_ != 2 && file.version_ != 3) {
    uint32_t swapped = __builtin_bswap32(file.version_);
    if (swapped == 2 || swapped == 3)
      return Status::error(
          fmt::format("gguf: version field reads {} — a big-endian file, not supported",
                      file.version_));
    return Status::error(fmt::format(
        "gguf: version {} is not supported (Escala reads versions 2 and 3)", file.version_));
  }
  uint64_t n_tensors = 0, n_kv = 0;
  if (!c.read(n_tensors)) return p.truncated("the tensor count");
  if (!c.read(n_kv)) return p.truncated("the metadata count");
  if (n_kv > c.remaining() / kMinKvBytes)
    return Status::error(fmt::format(
        "gguf: metadata count {} cannot fit in the {} bytes that follow the header", n_kv,
        c.remaining()));
  if (n_tensors > c.remaining() / kMinTensorInfoBytes)
    return Status::error(fmt::format(
        "gguf: tensor count {} cannot fit in the {} bytes that follow the header", n_tensors,
        c.remaining()));

  file.kv_.reserve(n_kv);
  for (uint64_t k = 0; k < n_kv; ++k) {
    std::string_view key;
    ESCALA_RETURN_IF_ERROR(p.read_string(key, kMaxKeyLength, fmt::format("metadata key {}", k)));
    if (key.empty()) return Status::error(fmt::format("gguf: metadata key {} is empty", k));
    std::string what = fmt::format("metadata '{}'", printable(key));
    if (file.kv_index_.count(key))
      return Status::error(fmt::format("gguf: duplicate metadata key '{}'", printable(key)));
    uint32_t type = 0;
    if (!c.read(type)) return p.truncated(fmt::format("the type of {}", what));
    if (!valid_value_type(type))
      return Status::error(fmt::format("gguf: {} has unknown value type {}", what, type));
    GgufValue v;
    ESCALA_RETURN_IF_ERROR(p.read_value(static_cast<GgufValueType>(type), v, 0, what));
    file.kv_index_.emplace(key, file.kv_.size());
    file.kv_.emplace_back(key, std::move(v));
  }

  // Alignment must be known before the data section can be located.
  if (const GgufValue* a = file.find("general.alignment")) {
    if (!a->is_integer() || a->type == GgufValueType::kBool)
      return Status::error(fmt::format("gguf: general.alignment has type {}, expected u32",
                                       gguf_value_type_name(a->type)));
    bool negative = a->type == GgufValueType::kI8 || a->type == GgufValueType::kI16 ||
                    a->type == GgufValueType::kI32 || a->type == GgufValueType::kI64;
    uint64_t al = negative ? static_cast<uint64_t>(a->i) : a->u;
    if ((negative && a->i <= 0) || al == 0 || (al & (al - 1)) != 0 || al > (1u << 30))
      return Status::error(fmt::format(
          "gguf: general.alignment {} is not a power of two in [1, 2^30]",
          negative ? fmt::format("{}", a->i) : fmt::format("{}", al)));
    file.alignment_ = static_cast<uint32_t>(al);
  }

  file.tensors_.reserve(n_tensors);
  for (uint64_t k = 0; k < n_tensors; ++k) {
    GgufTensor t;
    ESCALA_RETURN_IF_ERROR(
        p.read_string(t.name, kMaxTensorNameLength, fmt::format("the name of tensor {}", k)));
    if (t.name.empty()) return Status::error(fmt::format("gguf: tensor {} has an empty name", k));
    std::string what = fmt::format("tensor '{}'", printable(t.name));
    if (file.tensor_index_.count(t.name))
      return Status::error(fmt::format("gguf: duplicate {}", what));
    uint32_t n_dims = 0;
    if (!c.read(n_dims)) return p.truncated(fmt::format("the dimension count of {}", what));
    if (n_dims == 0 || n_dims > kGgufMaxDims)
      return Status::error(
          fmt::format("gguf: {} has {} dimensions (must be 1 to {})", what, n_dims, kGgufMaxDims));
    t.n_dims = static_cast<int>(n_dims);
    int64_t elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      uint64_t ne = 0;
      if (!c.read(ne)) return p.truncated(fmt::format("dimension {} of {}", d, what));
      if (ne == 0 || ne > static_cast<uint64_t>(INT64_MAX))
        return Status::error(fmt::format("gguf: {} has dimension {} = {} (must be > 0)", what, d, ne));
      t.ne[d] = static_cast<int64_t>(ne);
      if (__builtin_mul_overflow(elements, t.ne[d], &elements))
        return Status::error(fmt::format("gguf: {} element count overflows", what));
    }
    uint32_t type_id = 0;
    if (!c.read(type_id)) return p.truncated(fmt::format("the type of {}", what));
    auto type = tensor_type_from_id(type_id);
    if (!type)
      return Status::error(fmt::format("gguf: {} has unsupported tensor type {}", what,
                                       ggml_type_label(type_id)));
    t.type = *type;
    if (!c.read(t.offset)) return p.truncated(fmt::format("the data offset of {}", what));
    auto rb = row_bytes(t.type, t.ne[0]);
    if (!rb)
      return Status::error(fmt::format("gguf: {} row of {} elements is not a whole number of {} "
                                       "blocks ({} elements each)",
                                       what, t.ne[0], tensor_type_name(t.type),
                                       block_elems(t.type)));
    uint64_t rows = static_cast<uint64_t>(elements / t.ne[0]);
    if (__builtin_mul_overflow(*rb, rows, &t.size))
      return Status::error(fmt::format("gguf: {} byte size overflows", what));
    if (t.offset % file.alignment_ != 0)
      return Status::error(fmt::format("gguf: {} data offset {} is not a multiple of the "
                                       "alignment {}",
                                       what, t.offset, file.alignment_));
    file.tensor_index_.emplace(t.name, file.tensors_.size());
    file.tensors_.push_back(t);
  }

  // The data section starts at the next multiple of the alignment.
  uint64_t pos = c.pos();
  uint64_t pad = (file.alignment_ - pos % file.alignment_) % file.alignment_;
  file.data_offset_ = pos + pad;
  if (!file.tensors_.empty() && file.data_offset_ > bytes.size())
    return Status::error(fmt::format(
        "gguf: file truncated before the data section (needs {} bytes, has {})",
        file.data_offset_, bytes.size()));
  uint64_t data_size = file.tensors_.empty() ? 0 : bytes.size() - file.data_offset_;
  for (GgufTensor& t : file.tensors_) {
    if (t.offset > data_size || t.size > data_size - t.offset)
      return Status::error(fmt::format(
          "gguf: tensor '{}' data [{}, +{} bytes) lies outside the data section ({} bytes; file "
          "truncated?)",
          printable(t.name), t.offset, t.size, data_size));
    t.data = bytes.data() + file.data_offset_ + t.offset;
  }
  // Overlapping tensors are never written by a sane writer; refuse them.
  std::vector<const GgufTensor*> by_offset;
  by_offset.reserve(file.tensors_.size());
  for (const GgufTensor& t : file.tensors_) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const GgufTensor* a, const GgufTensor* b) { return a->offset < b->offset; });
  for (size_t k = 1; k < by_offset.size(); ++k) {
    const GgufTensor* a = by_offset[k - 1];
    const GgufTensor* b = by_offset[k];
    if (a->offset + a->size > b->offset)
      return Status::error(fmt::format("gguf: tensors '{}' and '{}' overlap in the data section",
                                       printable(a->name), printable(b->name)));
  }
  return file;
}

Result<GgufFile> GgufFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return Status::error(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::error(fmt::format("{}: not a regular file", path));
  }
  auto size = static_cast<size_t>(st.st_size);
  if (size == 0) {
    ::close(fd);
    return Status::error(fmt::format("{}: empty file, not GGUF", path));
  }
  void* addr = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  int map_errno = errno;
  ::close(fd);  // the mapping keeps the file open
  if (addr == MAP_FAILED)
    return Status::error(fmt::format("{}: mmap failed: {}", path, std::strerror(map_errno)));
  std::shared_ptr<void> mapping(addr, [size](void* p) { munmap(p, size); });
  auto bytes = std::span<const uint8_t>(static_cast<const uint8_t*>(addr), size);
  Result<GgufFile> r = parse_impl(bytes);
  if (!r.ok()) return Status::error(fmt::format("{}: {}", path, r.message()));
  r->mapping_ = std::move(mapping);
  return r;
}

const GgufValue* GgufFile::find(std::string_view key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

const GgufTensor* GgufFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

void GgufFile::release_pages(const GgufTensor& t) const {
  if (!mapping_ || t.data == nullptr || t.size == 0) return;
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto begin = (reinterpret_cast<uintptr_t>(t.data) + page - 1) / page * page;  // whole pages only:
  const auto end = (reinterpret_cast<uintptr_t>(t.data) + t.size) / page * page;       // neighbours keep theirs
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

WeightView GgufTensor::as_matrix() const {
  return WeightView{.type = type,
                    .data = data,
                    .rows = ne[1] * ne[2] * ne[3],
                    .cols = ne[0],
                    .row_stride = row_bytes(type, ne[0]).value_or(0)};
}

}  // namespace escala::model

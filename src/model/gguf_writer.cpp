// GGUF writer (v3 by default; v2 has the same layout): builds test fixtures of any shape.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>

#include <fmt/format.h>

#include "escala/gguf.h"
#include "model/gguf_internal.h"

namespace escala::model {

// ---- GgufWriteValue constructors ----

namespace {
GgufWriteValue scalar(GgufValueType t) {
  GgufWriteValue v;
  v.type = t;
  return v;
}
}  // namespace

#define ESCALA_UINT_CTOR(fn, ctype, vt) \
  GgufWriteValue GgufWriteValue::fn(ctype x) { auto v = scalar(GgufValueType::vt); v.u = x; return v; }
#define ESCALA_INT_CTOR(fn, ctype, vt) \
  GgufWriteValue GgufWriteValue::fn(ctype x) { auto v = scalar(GgufValueType::vt); v.i = x; return v; }
ESCALA_UINT_CTOR(u8, uint8_t, kU8)
ESCALA_UINT_CTOR(u16, uint16_t, kU16)
ESCALA_UINT_CTOR(u32, uint32_t, kU32)
ESCALA_UINT_CTOR(u64, uint64_t, kU64)
ESCALA_INT_CTOR(i8, int8_t, kI8)
ESCALA_INT_CTOR(i16, int16_t, kI16)
ESCALA_INT_CTOR(i32, int32_t, kI32)
ESCALA_INT_CTOR(i64, int64_t, kI64)
#undef ESCALA_UINT_CTOR
#undef ESCALA_INT_CTOR

GgufWriteValue GgufWriteValue::f32(float x) { auto v = scalar(GgufValueType::kF32); v.f = x; return v; }
GgufWriteValue GgufWriteValue::f64(double x) { auto v = scalar(GgufValueType::kF64); v.f = x; return v; }
GgufWriteValue GgufWriteValue::boolean(bool x) { auto v = scalar(GgufValueType::kBool); v.u = x; return v; }
GgufWriteValue GgufWriteValue::string(std::string x) {
  auto v = scalar(GgufValueType::kString);
  v.str = std::move(x);
  return v;
}
GgufWriteValue GgufWriteValue::array(GgufValueType elem_type, std::vector<GgufWriteValue> items) {
  auto v = scalar(GgufValueType::kArray);
  v.elem_type = elem_type;
  v.items = std::move(items);
  return v;
}
GgufWriteValue GgufWriteValue::string_array(const std::vector<std::string>& xs) {
  std::vector<GgufWriteValue> items;
  items.reserve(xs.size());
  for (const auto& x : xs) items.push_back(string(x));
  return array(GgufValueType::kString, std::move(items));
}
GgufWriteValue GgufWriteValue::i32_array(const std::vector<int32_t>& xs) {
  std::vector<GgufWriteValue> items;
  items.reserve(xs.size());
  for (int32_t x : xs) items.push_back(i32(x));
  return array(GgufValueType::kI32, std::move(items));
}
GgufWriteValue GgufWriteValue::f32_array(const std::vector<float>& xs) {
  std::vector<GgufWriteValue> items;
  items.reserve(xs.size());
  for (float x : xs) items.push_back(f32(x));
  return array(GgufValueType::kF32, std::move(items));
}

// ---- serialization ----

namespace {

class Out {
 public:
  std::vector<uint8_t> b;
  template <class T>
  void put(T x) {
    size_t n = b.size();
    b.resize(n + sizeof(T));
    std::memcpy(b.data() + n, &x, sizeof(T));
  }
  void str(std::string_view s) {
    put<uint64_t>(s.size());
    b.insert(b.end(), s.begin(), s.end());
  }
  void pad_to(uint64_t alignment) {
    while (b.size() % alignment != 0) b.push_back(0);
  }
};

Status put_value(Out& o, const GgufWriteValue& v, bool with_type, const std::string& key) {
  if (with_type) o.put<uint32_t>(static_cast<uint32_t>(v.type));
  switch (v.type) {
    case GgufValueType::kU8: o.put(static_cast<uint8_t>(v.u)); break;
    case GgufValueType::kI8: o.put(static_cast<int8_t>(v.i)); break;
    case GgufValueType::kU16: o.put(static_cast<uint16_t>(v.u)); break;
    case GgufValueType::kI16: o.put(static_cast<int16_t>(v.i)); break;
    case GgufValueType::kU32: o.put(static_cast<uint32_t>(v.u)); break;
    case GgufValueType::kI32: o.put(static_cast<int32_t>(v.i)); break;
    case GgufValueType::kU64: o.put(static_cast<uint64_t>(v.u)); break;
    case GgufValueType::kI64: o.put(static_cast<int64_t>(v.i)); break;
    case GgufValueType::kF32: o.put(static_cast<float>(v.f)); break;
    case GgufValueType::kF64: o.put(v.f); break;
    case GgufValueType::kBool: o.put<uint8_t>(v.u ? 1 : 0); break;
    case GgufValueType::kString: o.str(v.str); break;
    case GgufValueType::kArray:
      o.put<uint32_t>(static_cast<uint32_t>(v.elem_type));
      o.put<uint64_t>(v.items.size());
      for (const GgufWriteValue& item : v.items) {
        if (item.type != v.elem_type)
          return Status::error(fmt::format("gguf writer: '{}' has an array of {} holding a {}", key,
                                           gguf_value_type_name(v.elem_type),
                                           gguf_value_type_name(item.type)));
        ESCALA_RETURN_IF_ERROR(put_value(o, item, false, key));
      }
      break;
  }
  return {};
}

Status check_shape(const std::string& name, TensorType type, const std::vector<int64_t>& ne,
                   uint64_t& bytes) {
  if (name.empty() || name.size() > 64)
    return Status::error(fmt::format("gguf writer: tensor name '{}' must be 1 to 64 bytes", name));
  if (ne.empty() || ne.size() > static_cast<size_t>(kGgufMaxDims))
    return Status::error(fmt::format("gguf writer: tensor '{}' needs 1 to 4 dimensions", name));
  uint64_t rows = 1;
  for (size_t d = 0; d < ne.size(); ++d) {
    if (ne[d] <= 0)
      return Status::error(fmt::format("gguf writer: tensor '{}' dimension {} is {}", name, d, ne[d]));
    if (d > 0 && __builtin_mul_overflow(rows, static_cast<uint64_t>(ne[d]), &rows))
      return Status::error(fmt::format("gguf writer: tensor '{}' is too large", name));
  }
  auto rb = row_bytes(type, ne[0]);
  if (!rb)
    return Status::error(fmt::format("gguf writer: tensor '{}' row of {} is not a multiple of {}'s "
                                     "block of {}",
                                     name, ne[0], tensor_type_name(type), block_elems(type)));
  if (__builtin_mul_overflow(*rb, rows, &bytes))
    return Status::error(fmt::format("gguf writer: tensor '{}' is too large", name));
  return {};
}

}  // namespace

void GgufWriter::set(std::string key, GgufWriteValue value) {
  for (auto& kv : kv_)
    if (kv.first == key) {
      kv.second = std::move(value);
      return;
    }
  kv_.emplace_back(std::move(key), std::move(value));
}

Status GgufWriter::add_tensor_bytes(std::string name, TensorType type, std::vector<int64_t> ne,
                                    std::span<const uint8_t> bytes) {
  uint64_t want = 0;
  ESCALA_RETURN_IF_ERROR(check_shape(name, type, ne, want));
  if (bytes.size() != want)
    return Status::error(fmt::format("gguf writer: tensor '{}' needs {} bytes, got {}", name, want,
                                     bytes.size()));
  for (const Tensor& t : tensors_)
    if (t.name == name) return Status::error(fmt::format("gguf writer: duplicate tensor '{}'", name));
  tensors_.push_back(Tensor{std::move(name), type, std::move(ne), {bytes.begin(), bytes.end()}});
  return {};
}

Status GgufWriter::add_tensor(std::string name, TensorType type, std::vector<int64_t> ne,
                              std::span<const float> values) {
  uint64_t bytes = 0;
  ESCALA_RETURN_IF_ERROR(check_shape(name, type, ne, bytes));
  uint64_t elements = 1;
  for (int64_t n : ne) elements *= static_cast<uint64_t>(n);
  if (values.size() != elements)
    return Status::error(fmt::format("gguf writer: tensor '{}' has {} elements, got {} values",
                                     name, elements, values.size()));
  std::vector<uint8_t> data(bytes);
  uint64_t rb = *row_bytes(type, ne[0]);
  uint64_t rows = elements / static_cast<uint64_t>(ne[0]);
  for (uint64_t r = 0; r < rows; ++r)
    quantize_row(type, values.data() + r * static_cast<uint64_t>(ne[0]), data.data() + r * rb, ne[0]);
  return add_tensor_bytes(std::move(name), type, std::move(ne), data);
}

Result<std::vector<uint8_t>> GgufWriter::to_bytes() const {
  uint64_t alignment = kGgufDefaultAlignment;
  for (const auto& [key, v] : kv_)
    if (key == "general.alignment") {
      if (v.type != GgufValueType::kU32 || v.u == 0 || (v.u & (v.u - 1)) != 0)
        return Status::error("gguf writer: general.alignment must be a u32 power of two");
      alignment = v.u;
    }
  Out o;
  o.put<uint32_t>(kGgufMagic);
  o.put<uint32_t>(version_);
  o.put<uint64_t>(tensors_.size());
  o.put<uint64_t>(kv_.size());
  for (const auto& [key, v] : kv_) {
    o.str(key);
    ESCALA_RETURN_IF_ERROR(put_value(o, v, true, key));
  }
  uint64_t offset = 0;
  for (const Tensor& t : tensors_) {
    o.str(t.name);
    o.put<uint32_t>(static_cast<uint32_t>(t.ne.size()));
    for (int64_t n : t.ne) o.put<uint64_t>(static_cast<uint64_t>(n));
    o.put<uint32_t>(static_cast<uint32_t>(t.type));
    o.put<uint64_t>(offset);
    offset += (t.bytes.size() + alignment - 1) / alignment * alignment;
  }
  o.pad_to(alignment);
  for (const Tensor& t : tensors_) {
    o.b.insert(o.b.end(), t.bytes.begin(), t.bytes.end());
    o.pad_to(alignment);
  }
  return std::move(o.b);
}

Status GgufWriter::write(const std::string& path) const {
  auto bytes = to_bytes();
  if (!bytes.ok()) return bytes.status();
  // A unique temp name next to the target, so rename() is atomic on the same file system.
  std::string tmp = fmt::format("{}.tmp.{}.{}", path, getpid(), std::random_device{}());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return Status::error(fmt::format("{}: cannot create: {}", tmp, std::strerror(errno)));
  const uint8_t* p = bytes->data();
  size_t left = bytes->size();
  while (left > 0) {
    ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int e = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return Status::error(fmt::format("{}: write failed: {}", tmp, std::strerror(e)));
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  bool synced = ::fsync(fd) == 0;
  int sync_errno = errno;
  bool closed = ::close(fd) == 0;
  if (!synced || !closed) {
    ::unlink(tmp.c_str());
    return Status::error(fmt::format("{}: sync/close failed: {}", tmp,
                                     std::strerror(synced ? errno : sync_errno)));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    int e = errno;
    ::unlink(tmp.c_str());
    return Status::error(fmt::format("{}: rename failed: {}", path, std::strerror(e)));
  }
  return {};
}

}  // namespace escala::model

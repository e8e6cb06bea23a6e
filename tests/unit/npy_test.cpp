// The .npy reader and writer: round trips for every dtype and format version, exact NumPy headers,
// one clear error for each kind of damage, a mutation fuzz loop, and the atomic write.
#include "common/npy.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

namespace escala::npy {
namespace {

namespace fs = std::filesystem;

// A fresh directory per test, removed afterwards.
class TempDir {
 public:
  TempDir() {
    static int counter = 0;
    path_ =
        fs::temp_directory_path() / ("escala_npy_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  size_t entries() const { return size_t(std::distance(fs::directory_iterator(path_), fs::directory_iterator())); }

 private:
  fs::path path_;
};

NpyArray random_array(NpyDType t, std::vector<int64_t> shape, std::mt19937& rng) {
  NpyArray a;
  a.dtype = t;
  a.shape = std::move(shape);
  a.data.resize(size_t(a.numel()) * npy_itemsize(t));
  for (auto& b : a.data) b = uint8_t(rng());
  return a;
}

// A .npy image with a hand-written header (padded as NumPy pads it unless `raw`).
std::vector<uint8_t> with_header(const std::string& dict, size_t data_bytes, int version = 1, bool pad = true) {
  std::string header = dict;
  const size_t preamble = version == 1 ? 10 : 12;
  if (pad) {
    while ((preamble + header.size() + 1) % 64 != 0) header += ' ';
    header += '\n';
  }
  std::vector<uint8_t> out = {0x93, 'N', 'U', 'M', 'P', 'Y', uint8_t(version), 0};
  for (size_t i = 0; i < preamble - 8; ++i) out.push_back(uint8_t(header.size() >> (8 * i)));
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), data_bytes, uint8_t(0x3c));
  return out;
}

void expect_error(const std::vector<uint8_t>& bytes, const std::string& fragment) {
  auto r = parse_npy(bytes, "x.npy");
  ASSERT_FALSE(r.ok()) << "expected an error containing '" << fragment << "'";
  EXPECT_EQ(r.message().rfind("x.npy: ", 0), 0u) << r.message();
  EXPECT_NE(r.message().find(fragment), std::string::npos) << r.message();
  EXPECT_EQ(r.message().find('\n'), std::string::npos) << r.message();
}

TEST(NpyTest, RoundTripEveryDtypeVersionAndShape) {
  std::mt19937 rng(1);
  const std::vector<std::vector<int64_t>> shapes = {{}, {0}, {5}, {3, 4}, {2, 3, 4}, {1, 1, 1, 7}, {4, 0, 2}};
  TempDir dir;
  for (NpyDType t : {NpyDType::kF32, NpyDType::kF16, NpyDType::kI32, NpyDType::kI8})
    for (int version : {0, 1, 2, 3})
      for (const auto& shape : shapes) {
        const NpyArray a = random_array(t, shape, rng);
        auto bytes = encode_npy(a, version);
        ASSERT_TRUE(bytes.ok()) << bytes.message();
        EXPECT_EQ((*bytes)[6], version == 0 ? 1 : version);
        const size_t preamble = (*bytes)[6] == 1 ? 10 : 12;
        const size_t header_len = (*bytes)[8] | size_t((*bytes)[9]) << 8;
        EXPECT_EQ((preamble + header_len) % 64, 0u) << "data must start 64-byte aligned";
        auto back = parse_npy(*bytes, "mem");
        ASSERT_TRUE(back.ok()) << back.message();
        EXPECT_EQ(back->dtype, t);
        EXPECT_EQ(back->shape, shape);
        EXPECT_EQ(back->data, a.data);

        const std::string path = dir.file("a.npy");
        ASSERT_TRUE(write_npy(path, a, version).ok());
        auto from_file = read_npy(path);
        ASSERT_TRUE(from_file.ok()) << from_file.message();
        EXPECT_EQ(from_file->shape, shape);
        EXPECT_EQ(from_file->data, a.data);
      }
  EXPECT_EQ(dir.entries(), 1u) << "no temporary files may be left behind";
}

TEST(NpyTest, ReadsHeadersAsNumPyWritesThem) {
  // Byte for byte what numpy 1.26 writes for np.zeros((2, 3), np.float32) (1.0) ...
  auto v1 = with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 24);
  ASSERT_EQ(v1.size(), 128u + 24u);  // NumPy: data at offset 128
  auto a = parse_npy(v1, "v1");
  ASSERT_TRUE(a.ok()) << a.message();
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 3}));
  // ... and other spellings a valid Python dict may take: other key order, double quotes, no
  // trailing comma, a one-element tuple, version 2.0 and 3.0 headers.
  for (const std::string& dict : {std::string("{\"shape\": (6,), \"fortran_order\": False, \"descr\": \"<f4\"}"),
                                  std::string("{'descr':'<f4','fortran_order':False,'shape':(6,)}"),
                                  std::string("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 6,), }")}) {
    for (int version : {1, 2, 3}) {
      auto r = parse_npy(with_header(dict, 24, version), "alt");
      EXPECT_TRUE(r.ok()) << dict << ": " << r.message();
    }
  }
  auto scalar = parse_npy(with_header("{'descr': '<i4', 'fortran_order': False, 'shape': (), }", 4), "s");
  ASSERT_TRUE(scalar.ok()) << scalar.message();
  EXPECT_EQ(scalar->numel(), 1);
  auto i8 = parse_npy(with_header("{'descr': '|i1', 'fortran_order': False, 'shape': (3,), }", 3), "s");
  EXPECT_TRUE(i8.ok()) << i8.message();
}

TEST(NpyTest, EachKindOfDamageIsOneClearError) {
  const std::string ok = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  auto good = with_header(ok, 24);
  ASSERT_TRUE(parse_npy(good, "x.npy").ok());

  expect_error({}, "too short");
  expect_error(std::vector<uint8_t>(good.begin(), good.begin() + 9), "too short");
  auto bad_magic = good;
  bad_magic[1] = 'n';
  expect_error(bad_magic, "bad magic");
  auto v4 = good;
  v4[6] = 4;
  expect_error(v4, "version 4.0");
  auto v11 = good;
  v11[7] = 1;
  expect_error(v11, "version 1.1");
  auto long_header = good;
  long_header[8] = 0xff;
  long_header[9] = 0xff;
  expect_error(long_header, "runs past the end");
  auto zero_header = good;
  zero_header[8] = zero_header[9] = 0;
  expect_error(zero_header, "empty");

  expect_error(std::vector<uint8_t>(good.begin(), good.end() - 1), "truncated");
  auto extra = good;
  extra.push_back(0);
  expect_error(extra, "needs 24 data bytes but the file has 25");

  expect_error(with_header("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", 24), "Fortran");
  expect_error(with_header("{'descr': '>f4', 'fortran_order': False, 'shape': (2, 3), }", 24), "big-endian");
  expect_error(with_header("{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }", 48), "unsupported dtype");
  expect_error(with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (6), }", 24), "trailing comma");
  expect_error(with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (-1, 3), }", 24), "integer");
  expect_error(with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (06,), }", 24), "leading zero");
  expect_error(with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (2L, 3L), }", 24), "expected ','");
  expect_error(with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904, 8), }", 24),
               "overflows");
  expect_error(with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }", 24),
               "overflows");
  expect_error(with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'descr': '<f4'}", 24),
               "appears twice");
  expect_error(with_header("{'descr': '<f4', 'shape': (2, 3), }", 24), "'fortran_order' is missing");
  expect_error(with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'x': 1}", 24), "unexpected key");
  expect_error(with_header("{'descr': '<f4', 'fortran_order': 0, 'shape': (2, 3), }", 24), "True or False");
  expect_error(with_header("{'descr': '<f\\4', 'fortran_order': False, 'shape': (2, 3), }", 24), "escapes");
  expect_error(with_header("{'descr': '<f4' 'fortran_order': False, 'shape': (2, 3), }", 24), "expected ','");
  expect_error(with_header(ok, 24, 1, /*pad=*/false), "newline");
  expect_error(with_header(ok + " x\n", 24, 1, false), "newline");
  auto non_ascii = with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 24, 3);
  non_ascii[20] = 0xc3;
  expect_error(non_ascii, "unexpected byte 0xc3");
}

// Random byte flips, truncations, insertions and length-field edits of valid files: the reader must
// return an error or a consistent array, never crash or over-read (run under ASan/UBSan in CI).
TEST(NpyTest, MutationFuzzNeverCrashes) {
  std::mt19937 rng(12345);
  int accepted = 0, rejected = 0;
  constexpr int kIterations = 6000;
  for (int it = 0; it < kIterations; ++it) {
    const NpyDType types[] = {NpyDType::kF32, NpyDType::kF16, NpyDType::kI32, NpyDType::kI8};
    std::vector<int64_t> shape;
    const int dims = int(rng() % 4);
    for (int d = 0; d < dims; ++d) shape.push_back(int64_t(rng() % 5));
    auto bytes = *encode_npy(random_array(types[rng() % 4], shape, rng), 1 + int(rng() % 3));
    const int mutations = 1 + int(rng() % 4);
    for (int m = 0; m < mutations; ++m) {
      const size_t header_end = std::min<size_t>(bytes.size(), 128);
      switch (rng() % 7) {
        case 0:  // flip a bit, mostly in the header where the parser lives
          if (!bytes.empty()) bytes[rng() % header_end] ^= uint8_t(1u << (rng() % 8));
          break;
        case 1:  // replace a byte with a character the parser cares about
          if (!bytes.empty()) bytes[rng() % header_end] = uint8_t("{}(),:' \n\"0123456789TFLx<|>\\"[rng() % 29]);
          break;
        case 2:  // truncate
          bytes.resize(rng() % (bytes.size() + 1));
          break;
        case 3:  // insert bytes
          bytes.insert(bytes.begin() + ptrdiff_t(rng() % (bytes.size() + 1)), size_t(1 + rng() % 8), uint8_t(rng()));
          break;
        case 4:  // delete a range
          if (!bytes.empty()) {
            const size_t at = rng() % bytes.size();
            bytes.erase(bytes.begin() + ptrdiff_t(at),
                        bytes.begin() + ptrdiff_t(std::min(bytes.size(), at + 1 + rng() % 8)));
          }
          break;
        case 5:  // rewrite the header-length field
          if (bytes.size() >= 12) {
            bytes[8] = uint8_t(rng());
            if (rng() % 2) bytes[9] = uint8_t(rng());
            if (rng() % 4 == 0) bytes[10] = bytes[11] = uint8_t(rng());
          }
          break;
        default:  // grow a digit of the shape
          for (size_t i = 10; i < header_end; ++i)
            if (bytes[i] >= '0' && bytes[i] <= '9' && rng() % 3 == 0) {
              bytes[i] = uint8_t('0' + rng() % 10);
              break;
            }
          break;
      }
    }
    auto r = parse_npy(bytes, "fuzz.npy");
    if (r.ok()) {
      ++accepted;
      ASSERT_EQ(r->data.size(), size_t(r->numel()) * npy_itemsize(r->dtype));
    } else {
      ++rejected;
      ASSERT_EQ(r.message().rfind("fuzz.npy: ", 0), 0u) << r.message();
      ASSERT_EQ(r.message().find('\n'), std::string::npos) << r.message();
    }
  }
  EXPECT_GT(rejected, kIterations / 2);
  EXPECT_GT(accepted, 0) << "some mutations (e.g. in the data) keep the file valid";
}

TEST(NpyTest, FileErrorsNameTheFile) {
  TempDir dir;
  auto missing = read_npy(dir.file("nope.npy"));
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.message().find("nope.npy: cannot open"), std::string::npos) << missing.message();
  auto directory = read_npy(dir.file(""));
  ASSERT_FALSE(directory.ok());
  EXPECT_NE(directory.message().find("not a regular file"), std::string::npos) << directory.message();

  // Truncated on disk: every prefix of a valid file is an error.
  std::mt19937 rng(3);
  auto bytes = *encode_npy(random_array(NpyDType::kF32, {3, 5}, rng));
  for (size_t n = 0; n < bytes.size(); n += 7) {
    std::ofstream(dir.file("t.npy"), std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(n));
    EXPECT_FALSE(read_npy(dir.file("t.npy")).ok()) << n;
  }
}

TEST(NpyTest, WriteIsAtomic) {
  TempDir dir;
  std::mt19937 rng(4);
  const NpyArray a = random_array(NpyDType::kF16, {4, 4}, rng);
  // A directory that does not exist: an error, and nothing created.
  EXPECT_FALSE(write_npy(dir.file("missing/out.npy"), a).ok());
  EXPECT_EQ(dir.entries(), 0u);
  // An inconsistent array is refused before anything is written.
  NpyArray broken = a;
  broken.data.pop_back();
  EXPECT_FALSE(write_npy(dir.file("b.npy"), broken).ok());
  EXPECT_FALSE(fs::exists(dir.file("b.npy")));
  // Staged but never committed: the temporary file disappears with the handle.
  {
    auto staged = stage_npy(dir.file("s.npy"), a);
    ASSERT_TRUE(staged.ok()) << staged.message();
    EXPECT_TRUE(fs::exists(staged->temp_path()));
    EXPECT_FALSE(fs::exists(dir.file("s.npy")));
  }
  EXPECT_EQ(dir.entries(), 0u);
  // Overwriting replaces the old contents in one step.
  ASSERT_TRUE(write_npy(dir.file("o.npy"), a).ok());
  const NpyArray b = random_array(NpyDType::kF16, {2, 2}, rng);
  ASSERT_TRUE(write_npy(dir.file("o.npy"), b).ok());
  EXPECT_EQ(read_npy(dir.file("o.npy"))->data, b.data);
  EXPECT_EQ(dir.entries(), 1u);
}

TEST(NpyTest, TypedHelpers) {
  const float f[] = {1.5f, -2.0f};
  auto a = make_f32({2}, f);
  EXPECT_EQ(a.f32()[1], -2.0f);
  const int32_t i[] = {0, 5, 12};
  auto c = make_i32({3}, i);
  EXPECT_EQ(c.i32()[2], 12);
  EXPECT_EQ(c.shape_string(), "(3,)");
  EXPECT_EQ(make_f32({1, 2}, f).shape_string(), "(1, 2)");
  EXPECT_EQ(npy_descr(NpyDType::kI8), "|i1");
}

}  // namespace
}  // namespace escala::npy

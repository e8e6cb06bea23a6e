// End-to-end tests of the `escala` program: random .npy inputs, the binary run as a child process,
// its output compared with the reference computed here; bad inputs give one error line, exit 1
// and no output file.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>

#include "attention/reference.h"
#include "attention_case.h"
#include "common/npy.h"

namespace escala::test {
namespace {

namespace fs = std::filesystem;
using npy::NpyArray;
using npy::NpyDType;

struct CliResult {
  int rc = -1;
  std::string out, err;
};

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static int counter = 0;
    dir_ =
        fs::temp_directory_path() / ("escala_cli_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "io");
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / "io" / name).string(); }

  CliResult run(const std::string& args) const {
    const fs::path out = dir_ / "stdout", err = dir_ / "stderr";
    // `timeout` so that a hung kernel fails this test instead of stalling the suite.
    const std::string cmd = std::string("timeout 300 '") + ESCALA_CLI_PATH + "' " + args + " >'" + out.string() +
                            "' 2>'" + err.string() + "'";
    const int status = std::system(cmd.c_str());
    CliResult r;
    r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = slurp(out);
    r.err = slurp(err);
    return r;
  }

  // Exit 1, exactly one "escala: error: ..." line, `out` absent, no temporary files left over.
  void expect_clean_failure(const std::string& args, const std::string& fragment, const std::string& out = "") {
    SCOPED_TRACE(args);
    const size_t files_before = count_files();
    const CliResult r = run(args);
    EXPECT_EQ(r.rc, 1) << r.err;
    EXPECT_EQ(r.err.rfind("escala: error: ", 0), 0u) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find(fragment), std::string::npos) << "stderr: " << r.err;
    if (!out.empty()) {
      EXPECT_FALSE(fs::exists(out)) << out << " must not be left behind";
    }
    EXPECT_EQ(count_files(), files_before) << "a temporary or partial file was left in " << (dir_ / "io");
  }

  size_t count_files() const {
    return size_t(std::distance(fs::directory_iterator(dir_ / "io"), fs::directory_iterator()));
  }

  fs::path dir_;
};

// One attention problem: float values (already rounded to the file dtype) and the CLI flags.
struct Problem {
  int h = 4, h_kv = 2, d = 64, dv = 64;
  bool f16 = false;
  std::vector<int32_t> cu_q{0, 9}, cu_k{0, 9};
  std::vector<float> q, k, v, sinks;
  bool causal = false;
  int window_left = -1, window_right = -1, num_sinks = 0;
  float softcap = 0, scale = 0;
  DType kv_dtype = DType::kF32;  // storage the CLI is asked for
  int page_size = 0;

  int64_t tq() const { return cu_q.back(); }
  int64_t tk() const { return cu_k.back(); }
};

float round_to(bool f16, float x) { return f16 ? f16_to_f32(f32_to_f16(x)) : x; }

Problem random_problem(std::mt19937& rng, Problem p) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  auto fill = [&](std::vector<float>& x, int64_t n) {
    x.resize(size_t(n));
    for (auto& e : x) e = round_to(p.f16, u(rng));
  };
  fill(p.q, p.tq() * p.h * p.d);
  fill(p.k, p.tk() * p.h_kv * p.d);
  fill(p.v, p.tk() * p.h_kv * p.dv);
  for (int i = 0; i < p.h; ++i) p.sinks.push_back(u(rng) * 2.0f);
  return p;
}

NpyArray to_npy(const std::vector<float>& x, std::vector<int64_t> shape, bool f16) {
  if (!f16) return npy::make_f32(std::move(shape), x);
  std::vector<uint16_t> h(x.size());
  for (size_t i = 0; i < x.size(); ++i) h[i] = f32_to_f16(x[i]);
  return npy::make_f16(std::move(shape), h);
}

std::string list(const std::vector<int32_t>& cu) {
  std::string s;
  for (size_t i = 0; i < cu.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(cu[i]);
  }
  return s;
}

// K or V as the reference reads it, quantized exactly as the CLI documents: int8 scale per
// (token, head) = maxabs/127 (contiguous); fp8 scale per (page, head) = maxabs/448 over the page's
// tokens (identity page order: pages are sequence chunks, so the scales match whatever the order).
struct RefKv {
  std::vector<uint8_t> data;
  std::vector<float> scale;
};
RefKv quantize(const Problem& p, const std::vector<float>& x, int dim, int32_t page_size,
               const std::vector<int32_t>& page_indptr) {
  RefKv r;
  const int hk = p.h_kv;
  if (p.kv_dtype == DType::kI8) {
    r.data.resize(x.size());
    for (int64_t s = 0; s < p.tk() * hk; ++s) {
      float mx = 0;
      for (int c = 0; c < dim; ++c) mx = std::max(mx, std::fabs(x[s * dim + c]));
      const float sc = mx > 0 ? mx / 127.0f : 1.0f;
      r.scale.push_back(sc);
      for (int c = 0; c < dim; ++c) r.data[s * dim + c] = uint8_t(int8_t(std::lrint(x[s * dim + c] / sc)));
    }
    return r;
  }
  // fp8, paged with pages in sequence order: page g of sequence b holds its tokens g*P .. g*P+P-1.
  const int64_t pages = page_indptr.back();
  r.data.assign(size_t(pages * page_size * hk * dim), 0);
  r.scale.assign(size_t(pages * hk), 1.0f);
  for (size_t b = 0; b + 1 < p.cu_k.size(); ++b) {
    const int64_t len = p.cu_k[b + 1] - p.cu_k[b];
    for (int64_t g = 0; g * page_size < len; ++g) {
      const int64_t page = page_indptr[b] + g;
      for (int hh = 0; hh < hk; ++hh) {
        float mx = 0;
        for (int64_t t = g * page_size; t < std::min(len, (g + 1) * page_size); ++t)
          for (int c = 0; c < dim; ++c) mx = std::max(mx, std::fabs(x[((p.cu_k[b] + t) * hk + hh) * dim + c]));
        const float sc = mx > 0 ? mx / 448.0f : 1.0f;
        r.scale[page * hk + hh] = sc;
        for (int64_t t = g * page_size; t < std::min(len, (g + 1) * page_size); ++t)
          for (int c = 0; c < dim; ++c)
            r.data[((page * page_size + t % page_size) * hk + hh) * dim + c] =
                f32_to_fp8e4m3(x[((p.cu_k[b] + t) * hk + hh) * dim + c] / sc);
      }
    }
  }
  return r;
}

// The double-precision reference on the inputs exactly as the CLI stores them.
void reference(const Problem& p, std::vector<float>& o, std::vector<float>& lse) {
  std::vector<uint8_t> q(p.q.size() * (p.f16 ? 2 : 4)), k, v;
  for (size_t i = 0; i < p.q.size(); ++i) store_as(q.data(), p.f16 ? DType::kF16 : DType::kF32, int64_t(i), p.q[i]);
  attn::AttentionParams a;
  a.q_dtype = p.f16 ? DType::kF16 : DType::kF32;
  a.kv_dtype = p.kv_dtype == DType::kI8 || p.kv_dtype == DType::kFp8E4M3 ? p.kv_dtype : a.q_dtype;
  std::vector<int32_t> indptr{0}, indices;
  RefKv kq, vq;
  if (is_quantized(p.kv_dtype)) {
    const int32_t ps = p.kv_dtype == DType::kFp8E4M3 ? p.page_size : 0;
    if (ps > 0) {
      for (size_t b = 0; b + 1 < p.cu_k.size(); ++b)
        indptr.push_back(indptr.back() + (p.cu_k[b + 1] - p.cu_k[b] + ps - 1) / ps);
      for (int32_t i = 0; i < indptr.back(); ++i) indices.push_back(i);
      a.page_size = ps;
      a.page_indptr = indptr.data();
      a.page_indices = indices.data();
      a.k_page_stride = int64_t(ps) * p.h_kv * p.d;
      a.v_page_stride = int64_t(ps) * p.h_kv * p.dv;
    }
    kq = quantize(p, p.k, p.d, ps, indptr);
    vq = quantize(p, p.v, p.dv, ps, indptr);
    a.k = kq.data.data();
    a.v = vq.data.data();
    a.k_scale = kq.scale.data();
    a.v_scale = vq.scale.data();
  } else {
    const int es = p.f16 ? 2 : 4;
    k.resize(p.k.size() * es);
    v.resize(p.v.size() * es);
    for (size_t i = 0; i < p.k.size(); ++i) store_as(k.data(), a.kv_dtype, int64_t(i), p.k[i]);
    for (size_t i = 0; i < p.v.size(); ++i) store_as(v.data(), a.kv_dtype, int64_t(i), p.v[i]);
    a.k = k.data();
    a.v = v.data();
  }
  o.assign(size_t(p.tq() * p.h * p.dv), 0.0f);
  lse.assign(size_t(p.tq() * p.h), 0.0f);
  a.q = q.data();
  a.o = o.data();
  a.lse = lse.data();
  a.o_dtype = DType::kF32;
  a.q_head_stride = p.d;
  a.q_row_stride = int64_t(p.h) * p.d;
  a.k_head_stride = p.d;
  a.k_row_stride = int64_t(p.h_kv) * p.d;
  a.v_head_stride = p.dv;
  a.v_row_stride = int64_t(p.h_kv) * p.dv;
  a.o_head_stride = p.dv;
  a.o_row_stride = int64_t(p.h) * p.dv;
  a.batch = int32_t(p.cu_q.size() - 1);
  a.cu_seqlens_q = p.cu_q.data();
  a.cu_seqlens_k = p.cu_k.data();
  a.num_heads = p.h;
  a.num_kv_heads = p.h_kv;
  a.head_dim = p.d;
  a.head_dim_v = p.dv;
  a.causal = p.causal;
  a.window_left = p.window_left;
  a.window_right = p.window_right;
  a.num_sinks = p.num_sinks;
  a.softcap = p.softcap;
  a.softmax_scale = p.scale;
  a.sink_logits = p.sinks.empty() ? nullptr : p.sinks.data();
  ASSERT_TRUE(attn::validate(a).ok()) << attn::validate(a).message();
  attn::attention_reference(a);
}

class CliAttentionTest : public CliTest {
 protected:
  // Writes the inputs, runs the CLI with the problem's flags plus `extra`, compares O and LSE.
  // `cu_flags` replaces the --cu-seqlens lists built from the problem.
  void check(const Problem& p, const std::string& extra, bool sink_file = false, const std::string& cu_flags = "") {
    ASSERT_TRUE(npy::write_npy(path("q.npy"), to_npy(p.q, {p.tq(), p.h, p.d}, p.f16)).ok());
    ASSERT_TRUE(npy::write_npy(path("k.npy"), to_npy(p.k, {p.tk(), p.h_kv, p.d}, p.f16)).ok());
    ASSERT_TRUE(npy::write_npy(path("v.npy"), to_npy(p.v, {p.tk(), p.h_kv, p.dv}, p.f16)).ok());
    std::string args = "attention --q " + path("q.npy") + " --k " + path("k.npy") + " --v " + path("v.npy") +
                       " --out " + path("o.npy") + " --lse " + path("lse.npy") + " ";
    args += cu_flags.empty() ? "--cu-seqlens-q " + list(p.cu_q) + " --cu-seqlens-k " + list(p.cu_k) : cu_flags;
    if (p.causal) args += " --causal";
    if (p.window_left >= 0) args += " --window-left " + std::to_string(p.window_left);
    if (p.window_right >= 0) args += " --window-right " + std::to_string(p.window_right);
    if (p.num_sinks) args += " --sinks " + std::to_string(p.num_sinks);
    if (p.softcap > 0) args += " --softcap " + std::to_string(p.softcap);
    if (p.scale != 0) args += " --scale " + std::to_string(p.scale);
    if (p.page_size) args += " --block-size " + std::to_string(p.page_size);
    if (sink_file) {
      ASSERT_TRUE(npy::write_npy(path("sinks.npy"), npy::make_f32({p.h}, p.sinks)).ok());
      args += " --sink-logits " + path("sinks.npy");
    }
    args += " " + extra;
    const CliResult r = run(args);
    ASSERT_EQ(r.rc, 0) << args << "\n" << r.err;
    EXPECT_TRUE(r.err.empty()) << r.err;

    Problem rp = p;
    if (!sink_file) rp.sinks.clear();
    // --scale is passed as text with 6 decimals; the reference must see the same value.
    if (p.scale != 0) rp.scale = std::stof(std::to_string(p.scale));
    if (p.softcap > 0) rp.softcap = std::stof(std::to_string(p.softcap));
    std::vector<float> ref, ref_lse;
    reference(rp, ref, ref_lse);

    auto o = npy::read_npy(path("o.npy"));
    ASSERT_TRUE(o.ok()) << o.message();
    EXPECT_EQ(o->dtype, p.f16 ? NpyDType::kF16 : NpyDType::kF32);
    EXPECT_EQ(o->shape, (std::vector<int64_t>{p.tq(), p.h, p.dv}));
    const Tolerance tol = tolerance_for(p.f16 ? DType::kF16 : DType::kF32);
    int bad = 0;
    for (size_t i = 0; i < ref.size() && bad < 5; ++i) {
      const float got = p.f16 ? f16_to_f32(o->f16()[i]) : o->f32()[i];
      if (!(std::fabs(double(got) - ref[i]) <= tol.atol + tol.rtol * std::fabs(ref[i]))) {
        ++bad;
        ADD_FAILURE() << "O[" << i << "] = " << got << ", reference " << ref[i];
      }
    }
    auto lse = npy::read_npy(path("lse.npy"));
    ASSERT_TRUE(lse.ok()) << lse.message();
    EXPECT_EQ(lse->shape, (std::vector<int64_t>{p.tq(), p.h}));
    for (size_t i = 0; i < ref_lse.size() && bad < 5; ++i) {
      const float got = lse->f32()[i];
      const bool both_empty = std::isinf(got) && got < 0 && std::isinf(ref_lse[i]) && ref_lse[i] < 0;
      if (!both_empty && !(std::fabs(double(got) - ref_lse[i]) <= kLseTolerance * (1 + std::fabs(ref_lse[i])))) {
        ++bad;
        ADD_FAILURE() << "LSE[" << i << "] = " << got << ", reference " << ref_lse[i];
      }
    }
  }
};

TEST_F(CliAttentionTest, CausalSingleSequenceMatchesReference) {
  std::mt19937 rng(1);
  Problem p;
  p.causal = true;
  check(random_problem(rng, p), "");
}

TEST_F(CliAttentionTest, VarlenGqaWithEveryOption) {
  std::mt19937 rng(2);
  Problem p;
  p.h = 8;
  p.h_kv = 2;
  p.d = 64;
  p.dv = 32;
  p.cu_q = {0, 3, 10, 10};
  p.cu_k = {0, 5, 25, 31};
  p.causal = true;
  p.window_left = 4;
  p.num_sinks = 1;
  p.softcap = 20.0f;
  p.scale = 0.1f;
  for (const char* impl : {"flash", "reference", "auto"})
    check(random_problem(rng, p), std::string("--impl ") + impl, true);
}

TEST_F(CliAttentionTest, HalfPrecisionDecode) {
  std::mt19937 rng(3);
  Problem p;
  p.f16 = true;
  p.h = 8;
  p.h_kv = 1;
  p.d = 128;
  p.dv = 128;
  p.cu_q = {0, 1, 3};
  p.cu_k = {0, 40, 97};
  p.causal = true;
  p.window_right = 0;
  check(random_problem(rng, p), "--impl decode --threads 2");
}

TEST_F(CliAttentionTest, PagedWithPermutedPages) {
  std::mt19937 rng(4);
  Problem p;
  p.cu_q = {0, 6, 13};
  p.cu_k = {0, 11, 30};
  p.causal = true;
  p.page_size = 4;
  const Problem r = random_problem(rng, p);
  check(r, "--page-seed 7 --impl flash");
  check(r, "--page-seed 8 --impl reference");
  Problem dec = r;
  check(dec, "--page-seed 9 --impl decode");
}

TEST_F(CliAttentionTest, Int8KvContiguousAndPaged) {
  std::mt19937 rng(5);
  Problem p;
  p.cu_q = {0, 5, 12};
  p.cu_k = {0, 9, 26};
  p.causal = true;
  p.kv_dtype = DType::kI8;
  const Problem r = random_problem(rng, p);
  check(r, "--kv-dtype int8");
  Problem paged = r;
  paged.page_size = 5;
  check(paged, "--kv-dtype int8 --page-seed 3");
}

TEST_F(CliAttentionTest, Fp8KvPaged) {
  std::mt19937 rng(6);
  Problem p;
  p.cu_q = {0, 2, 4};
  p.cu_k = {0, 21, 40};
  p.kv_dtype = DType::kFp8E4M3;
  p.page_size = 8;
  check(random_problem(rng, p), "--kv-dtype fp8 --page-seed 11");
}

TEST_F(CliAttentionTest, CuSeqlensFromNpyFiles) {
  std::mt19937 rng(7);
  Problem p;
  p.cu_q = {0, 4, 9};
  p.cu_k = {0, 4, 9};
  p.causal = true;
  const Problem r = random_problem(rng, p);
  ASSERT_TRUE(npy::write_npy(path("cuq.npy"), npy::make_i32({3}, r.cu_q)).ok());
  check(r, "", false, "--cu-seqlens-q " + path("cuq.npy") + " --cu-seqlens-k " + path("cuq.npy"));
}

TEST_F(CliAttentionTest, BadInputsFailCleanly) {
  std::mt19937 rng(8);
  Problem shape;
  shape.cu_q = shape.cu_k = {0, 20};  // more queries than the decode kernel takes
  Problem p = random_problem(rng, shape);
  ASSERT_TRUE(npy::write_npy(path("q.npy"), to_npy(p.q, {p.tq(), p.h, p.d}, false)).ok());
  ASSERT_TRUE(npy::write_npy(path("k.npy"), to_npy(p.k, {p.tk(), p.h_kv, p.d}, false)).ok());
  ASSERT_TRUE(npy::write_npy(path("v.npy"), to_npy(p.v, {p.tk(), p.h_kv, p.dv}, false)).ok());
  // Damaged and mismatched inputs.
  auto kbytes = *npy::encode_npy(to_npy(p.k, {p.tk(), p.h_kv, p.d}, false));
  std::ofstream(path("k_trunc.npy"), std::ios::binary)
      .write(reinterpret_cast<const char*>(kbytes.data()), std::streamsize(kbytes.size() - 5));
  std::ofstream(path("garbage.npy")) << "this is not a numpy file";
  ASSERT_TRUE(npy::write_npy(path("q2d.npy"), to_npy(p.q, {p.tq(), p.h * p.d}, false)).ok());
  ASSERT_TRUE(npy::write_npy(path("k_short.npy"), to_npy(std::vector<float>(p.k.begin(), p.k.end() - p.h_kv * p.d),
                                                         {p.tk() - 1, p.h_kv, p.d}, false))
                  .ok());
  ASSERT_TRUE(
      npy::write_npy(path("k3.npy"), to_npy(std::vector<float>(size_t(p.tk() * 3 * p.d)), {p.tk(), 3, p.d}, false))
          .ok());
  ASSERT_TRUE(npy::write_npy(path("k_d32.npy"),
                             to_npy(std::vector<float>(size_t(p.tk() * p.h_kv * 32)), {p.tk(), p.h_kv, 32}, false))
                  .ok());
  ASSERT_TRUE(npy::write_npy(path("v16.npy"), to_npy(p.v, {p.tk(), p.h_kv, p.dv}, true)).ok());
  ASSERT_TRUE(npy::write_npy(path("qi.npy"), npy::make_i32({1, 1, 8}, std::vector<int32_t>(8))).ok());
  ASSERT_TRUE(
      npy::write_npy(path("q12.npy"), to_npy(std::vector<float>(size_t(p.tq() * p.h * 12)), {p.tq(), p.h, 12}, false))
          .ok());
  ASSERT_TRUE(npy::write_npy(path("k12.npy"),
                             to_npy(std::vector<float>(size_t(p.tk() * p.h_kv * 12)), {p.tk(), p.h_kv, 12}, false))
                  .ok());
  ASSERT_TRUE(npy::write_npy(path("v12.npy"),
                             to_npy(std::vector<float>(size_t(p.tk() * p.h_kv * 12)), {p.tk(), p.h_kv, 12}, false))
                  .ok());
  ASSERT_TRUE(npy::write_npy(path("sinks3.npy"), npy::make_f32({3}, std::vector<float>(3))).ok());
  std::vector<float> k_nan = p.k;
  k_nan[k_nan.size() / 2] = NAN;  // the kernels would drop that key as if masked
  ASSERT_TRUE(npy::write_npy(path("k_nan.npy"), to_npy(k_nan, {p.tk(), p.h_kv, p.d}, false)).ok());
  std::vector<float> q_inf = p.q;
  q_inf[1] = INFINITY;
  ASSERT_TRUE(npy::write_npy(path("q_inf.npy"), to_npy(q_inf, {p.tq(), p.h, p.d}, true)).ok());
  ASSERT_TRUE(npy::write_npy(path("cu_f.npy"), npy::make_f32({2}, std::vector<float>{0, 20})).ok());

  const std::string out = path("o.npy"), lse = path("lse.npy");
  const std::string q = " --q " + path("q.npy"), k = " --k " + path("k.npy"), v = " --v " + path("v.npy");
  const std::string base = "attention" + q + k + v + " --out " + out;
  expect_clean_failure("attention" + k + v + " --out " + out, "--q, --k and --v are required", out);
  expect_clean_failure("attention" + q + k + v, "--out is required");
  expect_clean_failure("attention --q " + path("missing.npy") + k + v + " --out " + out, "missing.npy: cannot open",
                       out);
  expect_clean_failure("attention" + q + " --k " + path("k_trunc.npy") + v + " --out " + out, "truncated", out);
  expect_clean_failure("attention" + q + " --k " + path("garbage.npy") + v + " --out " + out, "bad magic", out);
  expect_clean_failure("attention --q " + path("q2d.npy") + k + v + " --out " + out, "[tokens, heads, dim]", out);
  expect_clean_failure("attention --q " + path("qi.npy") + k + v + " --out " + out, "float32 or float16", out);
  expect_clean_failure("attention" + q + " --k " + path("k_short.npy") + v + " --out " + out, "tokens", out);
  expect_clean_failure("attention" + q + " --k " + path("k3.npy") + v + " --out " + out, "heads", out);
  expect_clean_failure("attention" + q + " --k " + path("k_d32.npy") + v + " --out " + out, "head dim", out);
  expect_clean_failure("attention" + q + k + " --v " + path("v16.npy") + " --out " + out, "same dtype", out);
  expect_clean_failure("attention" + q + " --k " + path("k_nan.npy") + v + " --out " + out, "K holds nan", out);
  expect_clean_failure("attention --q " + path("q_inf.npy") + k + v + " --out " + out, "Q holds inf at [0, 0, 1]", out);
  expect_clean_failure(
      "attention --q " + path("q12.npy") + " --k " + path("k12.npy") + " --v " + path("v12.npy") + " --out " + out,
      "multiple of 8", out);
  // cu_seqlens
  expect_clean_failure(base + " --cu-seqlens-q 0,5,3,20 --cu-seqlens-k 0,3,5,20", "non-decreasing", out);
  expect_clean_failure(base + " --cu-seqlens-q 0,5,8", "ends at 8 but", out);
  expect_clean_failure(base + " --cu-seqlens-q 1,20", "must start at 0", out);
  expect_clean_failure(base + " --cu-seqlens-q 0,a,20", "not a list of offsets", out);
  expect_clean_failure(base + " --cu-seqlens-q 0,,20", "not a list of offsets", out);
  expect_clean_failure(base + " --cu-seqlens-q 0,4,20", "sequences", out);
  expect_clean_failure(base + " --cu-seqlens-q 0", "at least two offsets", out);
  expect_clean_failure(base + " --cu-seqlens-q " + path("cu_f.npy"), "int32", out);
  // options
  expect_clean_failure(base + " --window-left -5", "--window-left", out);
  expect_clean_failure(base + " --window-left 3x", "not an integer", out);
  expect_clean_failure(base + " --threads 0", "--threads", out);
  expect_clean_failure(base + " --block-size -1", "--block-size", out);
  expect_clean_failure(base + " --softcap nan", "--softcap", out);
  expect_clean_failure(base + " --softcap -2", "--softcap", out);
  expect_clean_failure(base + " --scale abc", "--scale", out);
  expect_clean_failure(base + " --impl fastest", "--impl", out);
  expect_clean_failure(base + " --kv-dtype fp8", "needs --block-size", out);
  expect_clean_failure(base + " --kv-dtype int3", "--kv-dtype", out);
  expect_clean_failure(base + " --sink-logits " + path("sinks3.npy"), "sink logits", out);
  expect_clean_failure(base + " --impl decode", "decode kernel", out);
  // Outputs that cannot be written: neither O nor LSE may appear.
  expect_clean_failure(base + " --lse " + path("nodir/lse.npy"), "nodir", out);
  expect_clean_failure("attention" + q + k + v + " --out " + path("nodir/o.npy") + " --lse " + lse, "nodir", lse);
  expect_clean_failure(base + " --lse " + out, "same file", out);
}

TEST_F(CliTest, KvPlanPrintsTheExact70BFigures) {
  const CliResult r = run("kv-plan --preset llama-3-70b --context 131072 --batch 1 --dtype fp16");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("42949672960 bytes = 40 GiB"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("343597383680"), std::string::npos) << r.out;  // MHA: 8x
  EXPECT_NE(r.out.find("5368709120"), std::string::npos) << r.out;    // MQA: 1/8
  for (const char* f : {"fp32", "fp16", "bf16", "fp8", "int8", "int4"}) EXPECT_NE(r.out.find(f), std::string::npos);

  const CliResult j = run("kv-plan --preset llama-3-70b --context 131072 --json --device-memory 80GiB --weights 0");
  ASSERT_EQ(j.rc, 0) << j.err;
  const auto doc = nlohmann::json::parse(j.out);
  EXPECT_EQ(doc["bytes"].get<int64_t>(), 42949672960);
  EXPECT_EQ(doc["mha"]["bytes"].get<int64_t>(), 343597383680);
  EXPECT_EQ(doc["mqa"]["kv_heads"].get<int64_t>(), 1);
  EXPECT_EQ(doc["formats"].size(), 6u);
  EXPECT_EQ(doc["fit"]["sequences"].get<int64_t>(), 2);
}

TEST_F(CliTest, KvPlanFitAndOverrides) {
  const CliResult none = run("kv-plan --preset llama-3-8b --device-memory 16GB --weights 17GB");
  ASSERT_EQ(none.rc, 0) << none.err;
  EXPECT_NE(none.out.find("fits     0 sequences: the weights alone"), std::string::npos) << none.out;
  const CliResult custom = run("kv-plan --layers 2 --heads 4 --kv-heads 2 --head-dim 8 --context 10 --json");
  ASSERT_EQ(custom.rc, 0) << custom.err;
  EXPECT_EQ(nlohmann::json::parse(custom.out)["bytes"].get<int64_t>(), 2 * 2 * 10 * 2 * 8 * 2);
  const CliResult gemma = run("kv-plan --preset gemma-2-9b --context 100000 --json");
  ASSERT_EQ(gemma.rc, 0) << gemma.err;
  EXPECT_EQ(nlohmann::json::parse(gemma.out)["bytes"].get<int64_t>(), 2LL * (21 * 100000 + 21 * 4096) * 8 * 256 * 2);
}

TEST_F(CliTest, KvPlanRejectsAbsurdValues) {
  for (const std::string& args :
       {std::string("--preset llama-3-8b --layers 0"), std::string("--preset llama-3-8b --context -1"),
        std::string("--preset llama-3-8b --batch 0"), std::string("--preset llama-3-8b --kv-heads 5"),
        std::string("--preset llama-3-8b --head-dim 1x"), std::string("--preset nope"),
        std::string("--preset llama-3-8b --dtype fp4"), std::string("--preset llama-3-8b --device-memory 12QB"),
        std::string("--preset llama-3-8b --device-memory 80 --weights -1GB"),
        std::string("--preset llama-3-8b --weights 10GB"),
        std::string("--preset llama-3-8b --context 99999999999999 --batch 99999999999"),
        std::string("--preset llama-3-8b --layers 99999999999999999999"), std::string("--layers 32")}) {
    SCOPED_TRACE(args);
    const CliResult r = run("kv-plan " + args);
    EXPECT_EQ(r.rc, 1);
    EXPECT_EQ(r.err.rfind("escala: error: ", 0), 0u) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
}

// Sampling flags are checked before the model loads: the error names the flag (not the missing
// model file given here) and nothing reaches stdout (generate used to echo the prompt first).
TEST_F(CliTest, BadSamplingFlagsFailBeforeAnyOutput) {
  for (const std::string& args :
       {std::string("generate --model /nonexistent/m.gguf --prompt hi --top-p 7"),
        std::string("generate --model /nonexistent/m.gguf --prompt hi --temp -1"),
        std::string("generate --model /nonexistent/m.gguf --prompt hi --min-p 2"),
        std::string("chat --model /nonexistent/m.gguf --top-p 0")}) {
    SCOPED_TRACE(args);
    const CliResult r = run(args + " </dev/null");
    EXPECT_EQ(r.rc, 1);
    EXPECT_EQ(r.err.rfind("escala: error: sampling: ", 0), 0u) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
}

// Structured output from the command line with the default model (skipped without it): the text
// is JSON of the schema, properties in order; bad schema flags fail before any output.
TEST_F(CliTest, GenerateFollowsAJsonSchema) {
  {
    std::ofstream(path("bad.json")) << R"({"type": "string", "pattern": "x"})";
    std::ofstream(path("broken.json")) << R"({"type": )";
  }
  for (const auto& [args, fragment] : std::vector<std::pair<std::string, std::string>>{
           {"--json-schema " + path("bad.json"), "schema: 'pattern' is not supported"},
           {"--json-schema " + path("broken.json"), "is not valid JSON"},
           {"--json-schema " + path("none.json"), "cannot read"},
           {"--json-object --json-schema " + path("bad.json"), "at most one of"}}) {
    SCOPED_TRACE(args);
    const CliResult r = run("generate --model /nonexistent/m.gguf --prompt hi " + args);
    EXPECT_EQ(r.rc, 1);
    EXPECT_EQ(r.err.rfind("escala: error: ", 0), 0u) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find(fragment), std::string::npos) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
  const fs::path model = fs::path(__FILE__).parent_path() / ".." / ".." / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!fs::exists(model)) GTEST_SKIP() << "no default model at " << model;
  std::ofstream(path("city.json")) << R"({"type": "object", "properties": {"city": {"type": "string"},
      "population": {"type": "integer"}, "rivers": {"type": "array", "items": {"type": "string"}, "maxItems": 2}},
      "required": ["city", "population"]})";
  for (int seed = 1; seed <= 3; ++seed) {
    const CliResult r = run("generate --model '" + model.string() + "' --chat --prompt 'Describe Paris as JSON.' --json " +
                            "--json-schema " + path("city.json") + " --temp 0.8 -n 120 --seed " + std::to_string(seed));
    ASSERT_EQ(r.rc, 0) << r.err;
    const auto doc = nlohmann::json::parse(r.out);
    ASSERT_EQ(doc["finish_reason"], "stop") << doc["text"];
    const auto v = nlohmann::ordered_json::parse(doc["text"].get<std::string>());
    std::vector<std::string> keys;
    for (const auto& [k, x] : v.items()) keys.push_back(k);
    ASSERT_GE(keys.size(), 2u);
    EXPECT_EQ(keys[0], "city");
    EXPECT_EQ(keys[1], "population");
    EXPECT_TRUE(v["city"].is_string() && v["population"].is_number_integer()) << v.dump();
    if (v.contains("rivers")) {
      EXPECT_TRUE(v["rivers"].is_array() && v["rivers"].size() <= 2) << v.dump();
    }
  }
}

}  // namespace
}  // namespace escala::test

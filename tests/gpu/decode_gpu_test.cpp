// The CUDA decode kernel against the double-precision reference on fresh random inputs: query runs
// of 1..16 tokens (and longer appends), GQA ratios 1, 4, 8 and 9/3, every mask and option, K/V in
// bf16/f16, int8 and fp8, contiguous and paged through randomly permuted pages, forced and heuristic
// split counts, poisoned outputs; paged == contiguous bit for bit; a CUDA graph replayed with new
// lengths.
//
// The reference reads the dequantised values of the very K/V the kernel reads (quantisation error
// is a property of the storage format, documented in src/kv/kv_storage.h), so the tolerance is that
// of the kernel's arithmetic: the query dtype's, or bf16's for 8-bit K/V (Q and P go through f16).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "attention/kv_layout.h"
#include "common/numeric.h"
#include "escala/attention_cuda.h"
#include "gpu_util.h"
#include "reference_util.h"

namespace escala::gputest {
namespace {

struct DecCase {
  std::vector<int> q_lens, kv_lens;
  int h = 8, hk = 2, d = 128;
  DType dt = DType::kBF16;   // q and o
  DType kv = DType::kBF16;   // storage: the q dtype, kI8 or kFp8E4M3
  int page_size = 0;         // 0: contiguous
  int page_run = 1;          // pages in runs of this many consecutive ones (the runs shuffled)
  bool head_major = false;   // K/V as [h_kv][token] (contiguous) or [page][h_kv][token] rows, not [token][h_kv]
  bool causal = true;
  int wl = -1, wr = -1, sinks = 0;
  bool sink_logits = false;
  float softcap = 0.0f;
  int splits = 0;  // 0: heuristic
  int poison = -1;  // 0 / 1 / 2: two random elements of Q / K / V set to poison_value
  float poison_value = 0.0f;
  uint64_t seed = 1;

  std::string describe() const {
    std::ostringstream os;
    os << "q_lens={";
    for (int x : q_lens) os << x << ",";
    os << "} kv_lens={";
    for (int x : kv_lens) os << x << ",";
    os << "} h=" << h << " hk=" << hk << " d=" << d << " q=" << dtype_name(dt) << " kv=" << dtype_name(kv)
       << " page=" << page_size << " causal=" << causal << " window=(" << wl << "," << wr << ") sinks=" << sinks
       << " sink_logits=" << sink_logits << " softcap=" << softcap << " splits=" << splits << " page_run=" << page_run
       << " head_major=" << head_major;
    if (poison >= 0) os << " poison " << "QKV"[poison] << " = " << poison_value;
    return os.str();
  }
};

// K/V of a batch in one storage layout, on the host and the device.
struct KvData {
  std::vector<uint8_t> k, v;      // storage bytes
  std::vector<float> ks, vs;      // scales (quantized)
  std::vector<int32_t> indptr, indices;
  int64_t row_stride = 0, head_stride = 0, page_stride = 0;
  DeviceBuffer dk, dv, dks, dvs, dindptr, dindices;

  void upload() {
    dk = DeviceBuffer(std::max<size_t>(16, k.size())), dv = DeviceBuffer(std::max<size_t>(16, v.size()));
    GPU_CHECK(cudaMemcpy(dk.get(), k.data(), k.size(), cudaMemcpyHostToDevice));
    GPU_CHECK(cudaMemcpy(dv.get(), v.data(), v.size(), cudaMemcpyHostToDevice));
    if (!ks.empty()) dks = DeviceBuffer(ks.size() * 4), dvs = DeviceBuffer(vs.size() * 4), dks.upload(ks), dvs.upload(vs);
    if (!indptr.empty()) {
      dindptr = DeviceBuffer(indptr.size() * 4), dindptr.upload(indptr);
      dindices = DeviceBuffer(std::max<size_t>(4, indices.size() * 4));
      if (!indices.empty()) dindices.upload(indices);
    }
  }
  // Fills the K/V fields of p (host or device pointers).
  void bind(AttentionParams& p, int page_size, bool device) const {
    p.k = device ? dk.get() : static_cast<const void*>(k.data());
    p.v = device ? dv.get() : static_cast<const void*>(v.data());
    p.k_scale = ks.empty() ? nullptr : device ? dks.get<float>() : ks.data();
    p.v_scale = vs.empty() ? nullptr : device ? dvs.get<float>() : vs.data();
    p.page_size = page_size;
    p.k_row_stride = p.v_row_stride = row_stride;
    p.k_head_stride = p.v_head_stride = head_stride;
    p.k_page_stride = p.v_page_stride = page_stride;
    p.page_indptr = indptr.empty() ? nullptr : device ? dindptr.get<int32_t>() : indptr.data();
    p.page_indices = indptr.empty() ? nullptr : device ? dindices.get<int32_t>() : indices.data();
  }
};

// Stores f32 K/V [total_kv, hk, d] in `fmt`, contiguous or in randomly permuted pages (runs of
// `page_run` consecutive pages, shuffled as units); token-major, or head-major within the buffer
// (contiguous) or each page.
KvData store_kv(const std::vector<float>& kf, const std::vector<float>& vf, const std::vector<int>& kv_lens, int hk,
                int d, DType fmt, int page_size, uint64_t seed, int page_run = 1, bool head_major = false) {
  KvData out;
  const size_t eb = dtype_size(fmt);
  const int64_t row = int64_t(hk) * d;
  const int batch = static_cast<int>(kv_lens.size());
  std::vector<int64_t> slot_of;  // slot of each (sequence-major) token
  int64_t num_slots = 0;
  if (page_size == 0) {
    num_slots = std::accumulate(kv_lens.begin(), kv_lens.end(), int64_t(0));
    slot_of.resize(num_slots);
    std::iota(slot_of.begin(), slot_of.end(), 0);
  } else {
    int64_t pages_needed = 0;
    for (int l : kv_lens) pages_needed += (l + page_size - 1) / page_size;
    const int64_t num_pages = pages_needed + 3;
    std::vector<int32_t> perm(num_pages);
    std::iota(perm.begin(), perm.end(), 0);
    std::mt19937_64 rng(seed);
    if (page_run <= 1) {
      std::shuffle(perm.begin(), perm.end(), rng);
    } else {
      std::vector<int32_t> starts;
      for (int32_t p0 = 0; p0 < num_pages; p0 += page_run) starts.push_back(p0);
      std::shuffle(starts.begin(), starts.end(), rng);
      perm.clear();
      for (int32_t p0 : starts)
        for (int32_t pg = p0; pg < std::min<int64_t>(p0 + page_run, num_pages); ++pg) perm.push_back(pg);
    }
    out.indptr.push_back(0);
    int64_t next = 0;
    for (int b = 0; b < batch; ++b) {
      const int np = (kv_lens[b] + page_size - 1) / page_size;
      for (int i = 0; i < np; ++i) out.indices.push_back(perm[next++]);
      out.indptr.push_back(static_cast<int32_t>(out.indices.size()));
      for (int t = 0; t < kv_lens[b]; ++t)
        slot_of.push_back(int64_t(out.indices[out.indptr[b] + t / page_size]) * page_size + t % page_size);
    }
    num_slots = num_pages * page_size;
    out.page_stride = int64_t(page_size) * row;
  }
  out.row_stride = head_major ? d : row;
  out.head_stride = head_major ? (page_size > 0 ? int64_t(page_size) * d : num_slots * d) : d;
  // Element offset of (slot, head, 0).
  auto row_at = [&](int64_t slot, int h) {
    if (!head_major) return slot * row + int64_t(h) * d;
    if (page_size == 0) return h * out.head_stride + slot * d;
    return (slot / page_size) * out.page_stride + h * out.head_stride + (slot % page_size) * d;
  };
  // Unused slots (past each sequence's end, spare pages) hold 0xff bytes, NaN in the 16-bit and fp8
  // formats: a kernel that lets them into a result fails.
  const uint8_t fill = page_size > 0 ? 0xff : 0;
  out.k.assign(num_slots * row * eb, fill), out.v.assign(num_slots * row * eb, fill);
  if (fmt == DType::kI8) out.ks.assign(num_slots * hk, 1.0f), out.vs.assign(num_slots * hk, 1.0f);
  if (fmt == DType::kFp8E4M3) {
    const int64_t num_pages = num_slots / page_size;
    out.ks.assign(num_pages * hk, 1.0f), out.vs.assign(num_pages * hk, 1.0f);
    // Scale per (page, head): the page's max |x| maps to 448.
    for (int pass = 0; pass < 2; ++pass) {
      const std::vector<float>& src = pass ? vf : kf;
      std::vector<float>& sc = pass ? out.vs : out.ks;
      std::vector<float> mx(sc.size(), 0.0f);
      for (size_t t = 0; t < slot_of.size(); ++t)
        for (int h = 0; h < hk; ++h)
          for (int c = 0; c < d; ++c) {
            float& m = mx[(slot_of[t] / page_size) * hk + h];
            m = std::max(m, std::fabs(src[(t * hk + h) * d + c]));
          }
      for (size_t i = 0; i < sc.size(); ++i) sc[i] = mx[i] > 0 ? mx[i] / 448.0f : 1.0f;
    }
  }
  for (int pass = 0; pass < 2; ++pass) {
    const std::vector<float>& src = pass ? vf : kf;
    std::vector<uint8_t>& dst = pass ? out.v : out.k;
    std::vector<float>& sc = pass ? out.vs : out.ks;
    for (size_t t = 0; t < slot_of.size(); ++t)
      for (int h = 0; h < hk; ++h) {
        const float* x = &src[(t * hk + h) * d];
        uint8_t* y = &dst[row_at(slot_of[t], h) * eb];
        if (fmt == DType::kI8) {
          float m = 0;
          for (int c = 0; c < d; ++c) m = std::max(m, std::fabs(x[c]));
          const float s = m > 0 ? m / 127.0f : 1.0f;
          sc[slot_of[t] * hk + h] = s;
          for (int c = 0; c < d; ++c)
            reinterpret_cast<int8_t*>(y)[c] = static_cast<int8_t>(std::clamp(std::lrint(x[c] / s), -127l, 127l));
        } else if (fmt == DType::kFp8E4M3) {
          const float s = sc[(slot_of[t] / page_size) * hk + h];
          for (int c = 0; c < d; ++c) y[c] = f32_to_fp8e4m3(x[c] / s);
        } else {
          for (int c = 0; c < d; ++c) attn::store_float(y, fmt, c, x[c]);
        }
      }
  }
  return out;
}

struct RunResult {
  std::vector<uint16_t> o;
  std::vector<float> lse;
};

// Runs the decode kernel on device data; poisons the outputs first.
RunResult run_gpu(const AttentionParams& g, int64_t tq, const DeviceBuffer& d_o, const DeviceBuffer& d_lse,
                  const attn::CudaOptions& opt) {
  RunResult r;
  GPU_CHECK(cudaMemset(d_o.get(), 0xff, d_o.bytes()));
  GPU_CHECK(cudaMemset(d_lse.get(), 0xff, d_lse.bytes()));
  const Status st = attn::attention_cuda(g, nullptr, opt);
  EXPECT_TRUE(st.ok()) << st.message();
  GPU_CHECK(cudaDeviceSynchronize());
  GPU_CHECK(cudaGetLastError());
  r.o.resize(tq * g.num_heads * g.head_dim), r.lse.resize(tq * g.num_heads);
  if (tq > 0) d_o.download(r.o), d_lse.download(r.lse);
  return r;
}

struct Problem {
  std::vector<int32_t> cu_q, cu_k;
  std::vector<uint16_t> q;
  std::vector<float> kf, vf, sinks;
  int64_t tq = 0, tk = 0;
};

Problem make_problem(const DecCase& c) {
  Problem pr;
  const int batch = static_cast<int>(c.q_lens.size());
  pr.cu_q.assign(batch + 1, 0), pr.cu_k.assign(batch + 1, 0);
  for (int b = 0; b < batch; ++b)
    pr.cu_q[b + 1] = pr.cu_q[b] + c.q_lens[b], pr.cu_k[b + 1] = pr.cu_k[b] + c.kv_lens[b];
  pr.tq = pr.cu_q[batch], pr.tk = pr.cu_k[batch];
  pr.q = random_half(pr.tq * c.h * c.d, c.dt, c.seed);
  std::mt19937_64 rng(c.seed + 7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  pr.kf.resize(pr.tk * c.hk * c.d), pr.vf.resize(pr.tk * c.hk * c.d);
  for (auto& x : pr.kf) x = nd(rng);
  for (auto& x : pr.vf) x = nd(rng);
  pr.sinks.resize(c.h);
  for (int h = 0; h < c.h; ++h) pr.sinks[h] = 0.5f * static_cast<float>(h % 5) - 0.5f;
  std::mt19937_64 poison_rng(c.seed + 3000);
  for (int k = 0; k < 2 && c.poison >= 0; ++k) {
    if (c.poison == 0 && !pr.q.empty())
      pr.q[poison_rng() % pr.q.size()] = c.dt == DType::kBF16 ? f32_to_bf16(c.poison_value) : f32_to_f16(c.poison_value);
    std::vector<float>& kv = c.poison == 1 ? pr.kf : pr.vf;
    if (c.poison > 0 && !kv.empty()) kv[poison_rng() % kv.size()] = c.poison_value;
  }
  return pr;
}

AttentionParams base_params(const DecCase& c, const Problem& pr) {
  AttentionParams p;
  p.q_dtype = p.o_dtype = c.dt;
  p.kv_dtype = c.kv;
  p.batch = static_cast<int>(c.q_lens.size());
  p.num_heads = c.h, p.num_kv_heads = c.hk, p.head_dim = c.d;
  p.causal = c.causal, p.window_left = c.wl, p.window_right = c.wr, p.num_sinks = c.sinks;
  p.softcap = c.softcap;
  p.q_row_stride = int64_t(c.h) * c.d, p.q_head_stride = c.d;
  p.o_row_stride = int64_t(c.h) * c.d, p.o_head_stride = c.d;
  p.sink_logits = c.sink_logits ? pr.sinks.data() : nullptr;
  p.q = pr.q.data();
  p.cu_seqlens_q = pr.cu_q.data(), p.cu_seqlens_k = pr.cu_k.data();
  return p;
}

// Reference on the dequantised values of `kv` (the exact numbers the kernel reads).
void reference(const DecCase& c, const Problem& pr, const KvData& kv, std::vector<float>& o_ref,
               std::vector<float>& lse_ref) {
  AttentionParams hp = base_params(c, pr);
  kv.bind(hp, c.page_size, false);
  reference_over_stored_kv(hp, o_ref, lse_ref);
}

struct DeviceProblem {
  DeviceBuffer dq, d_o, d_lse, dcq, dck, dsink;
  AttentionParams g;
};

void to_device(const DecCase& c, const Problem& pr, KvData& kv, DeviceProblem& dp) {
  dp.dq = DeviceBuffer(std::max<size_t>(16, pr.q.size() * 2));
  if (!pr.q.empty()) dp.dq.upload(pr.q);
  dp.d_o = DeviceBuffer(std::max<int64_t>(16, pr.tq * c.h * c.d * 2));
  dp.d_lse = DeviceBuffer(std::max<int64_t>(16, pr.tq * c.h * 4));
  dp.dcq = DeviceBuffer(pr.cu_q.size() * 4), dp.dck = DeviceBuffer(pr.cu_k.size() * 4);
  dp.dcq.upload(pr.cu_q), dp.dck.upload(pr.cu_k);
  dp.dsink = DeviceBuffer(c.h * 4), dp.dsink.upload(pr.sinks);
  kv.upload();
  dp.g = base_params(c, pr);
  kv.bind(dp.g, c.page_size, true);
  dp.g.q = dp.dq.get(), dp.g.o = dp.d_o.get(), dp.g.lse = dp.d_lse.get<float>();
  dp.g.cu_seqlens_q = dp.dcq.get<int32_t>(), dp.g.cu_seqlens_k = dp.dck.get<int32_t>();
  dp.g.sink_logits = c.sink_logits ? dp.dsink.get<float>() : nullptr;
}

// `impl`: kDecode forces the decode kernel; kAuto lets runs of more than 16 queries over paged
// 16-bit K/V go to the sm_90 prefill kernel on Hopper.
void check_case(const DecCase& c, attn::Impl impl = attn::Impl::kDecode) {
  SCOPED_TRACE(c.describe());
  const Problem pr = make_problem(c);
  KvData kv = store_kv(pr.kf, pr.vf, c.kv_lens, c.hk, c.d, c.kv, c.page_size, c.seed + 11, c.page_run, c.head_major);
  std::vector<float> o_ref, lse_ref;
  reference(c, pr, kv, o_ref, lse_ref);
  DeviceProblem dp;
  to_device(c, pr, kv, dp);
  attn::CudaOptions opt;
  opt.impl = impl;
  opt.num_splits = c.splits;
  opt.host_cu_seqlens_q = pr.cu_q.data(), opt.host_cu_seqlens_k = pr.cu_k.data();
  const RunResult a = run_gpu(dp.g, pr.tq, dp.d_o, dp.d_lse, opt);
  const RunResult b = run_gpu(dp.g, pr.tq, dp.d_o, dp.d_lse, opt);
  ASSERT_TRUE(a.o == b.o) << "two runs differ: a race?";
  ASSERT_EQ(std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * 4), 0) << "LSE differs between runs";
  const bool quant = c.kv == DType::kI8 || c.kv == DType::kFp8E4M3;
  const bool loose = quant || c.dt == DType::kBF16;
  compare_outputs(a.o, a.lse, o_ref, lse_ref, c.dt, loose ? kTolBf16 : kTolF16, loose ? 8e-3 : 2e-3, c.h, c.d);
}

const DType kHalfTypes[] = {DType::kBF16, DType::kF16};

TEST(DecodeCuda, HeadDimsDtypesGqa) {
  uint64_t seed = 1;
  for (int d : {64, 128, 256})
    for (DType dt : kHalfTypes)
      for (auto [h, hk] : {std::pair{8, 8}, {8, 2}, {16, 2}, {9, 3}}) {
        DecCase c;
        c.d = d, c.dt = dt, c.kv = dt, c.h = h, c.hk = hk, c.seed = seed++;
        c.q_lens = {1, 1, 1}, c.kv_lens = {1, 129, 1000};
        check_case(c);
      }
}

TEST(DecodeCuda, AppendRunsOfOneToSixteenTokens) {
  uint64_t seed = 100;
  for (int q : {2, 5, 9, 16, 33})
    for (auto [h, hk] : {std::pair{4, 4}, {32, 4}, {9, 3}}) {
      DecCase c;
      c.h = h, c.hk = hk, c.seed = seed++;
      c.q_lens = {q, 1, q}, c.kv_lens = {q + 7, 300, 4097};
      check_case(c);
    }
}

TEST(DecodeCuda, QuantizedAndPaged) {
  uint64_t seed = 200;
  for (DType kv : {DType::kBF16, DType::kI8, DType::kFp8E4M3})
    for (DType dt : kHalfTypes)
      for (int page : {0, 12, 16, 64})  // 12: pages that are not a multiple of 8 keys
        for (int d : {64, 128}) {
          if (kv == DType::kBF16 && dt == DType::kF16) continue;  // f16 K/V go with f16 queries
          if (kv == DType::kFp8E4M3 && page == 0) continue;       // fp8 scales are per page
          DecCase c;
          c.dt = dt, c.kv = kv == DType::kBF16 ? dt : kv, c.page_size = page, c.d = d, c.seed = seed++;
          c.h = 8, c.hk = 2;
          c.q_lens = {1, 3, 1}, c.kv_lens = {17, 129, 2000};
          check_case(c);
        }
}

TEST(DecodeCuda, MasksAndScoreOptions) {
  uint64_t seed = 300;
  struct M {
    bool causal;
    int wl, wr, sinks;
    bool sink_logits;
    float softcap;
  };
  const M masks[] = {{false, -1, -1, 0, false, 0.0f}, {true, 100, 0, 0, false, 0.0f}, {true, 100, 0, 4, false, 0.0f},
                     {true, 37, 0, 20, true, 0.0f},    {false, 50, 20, 0, false, 0.0f}, {true, -1, -1, 0, true, 30.0f},
                     {true, 0, 0, 0, false, 0.0f},     {true, 255, 0, 1, true, 5.0f}};
  // 4 x 16 rows per kv head: the 64-row form; 4 x 2: the 8-row columns form.
  const std::pair<DType, std::vector<int>> runs[] = {{DType::kBF16, {1, 4, 16}}, {DType::kI8, {1, 4, 16}},
                                                     {DType::kBF16, {1, 2, 1}},  {DType::kI8, {1, 2, 1}},
                                                     {DType::kFp8E4M3, {1, 2, 1}}};
  for (const M& m : masks)
    for (const auto& [kv, q_lens] : runs) {
      DecCase c;
      c.causal = m.causal, c.wl = m.wl, c.wr = m.wr, c.sinks = m.sinks, c.sink_logits = m.sink_logits;
      c.softcap = m.softcap, c.kv = kv, c.page_size = 16, c.seed = seed++;
      c.q_lens = q_lens, c.kv_lens = {7, 1000, 1000};
      check_case(c);
    }
}

// 8-bit K/V with at most 8 rows per kv head (the decode kernel's columns form: rows on the MMAs' N
// side) over every head dim and GQA shape, TMA boxes (16-token pages) and cp.async (12), splits.
TEST(DecodeCuda, EightBitColumnsForm) {
  uint64_t seed = 700;
  for (DType kv : {DType::kI8, DType::kFp8E4M3})
    for (int d : {64, 128, 256})
      for (auto [h, hk, q] : {std::tuple{8, 8, 1}, {8, 2, 2}, {16, 2, 1}, {9, 3, 2}}) {
        DecCase c;
        c.kv = kv, c.d = d, c.h = h, c.hk = hk, c.seed = seed++;
        c.dt = d == 64 ? DType::kF16 : DType::kBF16;
        c.page_size = (seed % 2) ? 16 : 12;
        c.splits = (seed % 3) == 0 ? 5 : 0;
        c.q_lens = {q, 1, 1}, c.kv_lens = {q + 6, 129, 1000};
        check_case(c);
      }
}

// Non-finite inputs propagate as attention.h states (the reference decides which outputs are NaN;
// compare_outputs wants exactly those), through one split and several (the merge, whose max skips
// a NaN LSE), contiguous and paged. Before, the epilogues read a NaN row sum as an empty row and
// wrote 0. 8-bit K/V hold no NaN (the quantizers'), so there only Q is poisoned; V only where every
// row sees every key of one sequence (a tile's masked keys multiply by 0, and 0 * NaN is NaN).
TEST(DecodeCuda, NonFiniteInputsPropagate) {
  const float kBad[] = {std::nanf(""), std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()};
  uint64_t seed = 1700;
  for (int d : {64, 128, 256})
    for (DType kv : {DType::kBF16, DType::kI8, DType::kFp8E4M3})
      for (int what = 0; what < 3; ++what)
        for (float bad : kBad) {
          if ((what == 2 && !std::isnan(bad)) || (kv != DType::kBF16 && what != 0)) continue;
          DecCase c;
          c.d = d, c.kv = kv, c.poison = what, c.poison_value = bad, c.seed = seed++;
          c.page_size = kv == DType::kFp8E4M3 || seed % 2 ? 16 : 0;
          c.splits = seed % 3 == 0 ? 1 : 0;
          if (what == 2) {
            c.causal = false, c.q_lens = {3}, c.kv_lens = {700};
          } else {
            c.q_lens = {1, 4, 1}, c.kv_lens = {129, 1000, 37};
            c.sink_logits = seed % 4 == 0, c.softcap = seed % 5 == 1 ? 20.0f : 0.0f;
          }
          check_case(c);
        }
}

TEST(DecodeCuda, SplitCountsAndEmptyRows) {
  uint64_t seed = 400;
  for (int splits : {0, 1, 3, 7, 64}) {
    DecCase c;
    c.splits = splits, c.seed = seed++;
    c.q_lens = {1, 1, 2, 1}, c.kv_lens = {0, 5, 1, 4097};  // kv 0: an empty row (O = 0, LSE = -inf)
    check_case(c);
    c.sink_logits = true, c.seed = seed++;
    check_case(c);
  }
}

// The split merge counts finished CTAs in the workspace: a caller's workspace full of garbage
// (zeroed by the launcher), and the library's own counters after many calls, give the same bits as
// a fresh run, call after call.
TEST(DecodeCuda, MergeCountersInCallerAndLibraryWorkspaces) {
  DecCase c;
  c.page_size = 16, c.h = 8, c.hk = 2, c.splits = 5, c.seed = 450;
  c.q_lens = {1, 1, 1}, c.kv_lens = {300, 2000, 1};
  Problem pr = make_problem(c);
  KvData kv = store_kv(pr.kf, pr.vf, c.kv_lens, c.hk, c.d, c.kv, c.page_size, 79);
  DeviceProblem dp;
  to_device(c, pr, kv, dp);
  attn::CudaOptions own;
  own.impl = attn::Impl::kDecode, own.num_splits = c.splits;
  const RunResult first = run_gpu(dp.g, pr.tq, dp.d_o, dp.d_lse, own);
  attn::CudaOptions theirs = own;
  const size_t ws_bytes = attn::decode_workspace_bytes(dp.g, 1, c.splits);
  DeviceBuffer ws(ws_bytes);
  theirs.workspace = ws.get(), theirs.workspace_bytes = ws_bytes;
  for (int round = 0; round < 3; ++round) {
    GPU_CHECK(cudaMemset(ws.get(), 0xab, ws_bytes));
    const RunResult a = run_gpu(dp.g, pr.tq, dp.d_o, dp.d_lse, theirs);
    const RunResult b = run_gpu(dp.g, pr.tq, dp.d_o, dp.d_lse, own);
    EXPECT_TRUE(a.o == first.o && b.o == first.o) << "round " << round;
    EXPECT_EQ(std::memcmp(a.lse.data(), first.lse.data(), first.lse.size() * 4), 0) << "round " << round;
    EXPECT_EQ(std::memcmp(b.lse.data(), first.lse.data(), first.lse.size() * 4), 0) << "round " << round;
  }
  // And the first result is right, not only repeatable.
  std::vector<float> o_ref, lse_ref;
  reference(c, pr, kv, o_ref, lse_ref);
  compare_outputs(first.o, first.lse, o_ref, lse_ref, c.dt, kTolBf16, 8e-3, c.h, c.d);
}

TEST(DecodeCuda, LongSequences) {
  DecCase c;
  c.h = 32, c.hk = 8, c.page_size = 16, c.seed = 500;
  c.q_lens = {1, 2}, c.kv_lens = {100000, 32771};
  check_case(c);
  c.kv = DType::kFp8E4M3, c.seed = 501;
  check_case(c);
}

// K/V rows head-major (each head's tokens one run, PyTorch's [B, h_kv, T, d] with B folded into T;
// or [page][h_kv][token] pages): every format, the three row forms, TMA rows and cp.async rows.
TEST(DecodeCuda, HeadMajorLayouts) {
  const struct {
    DType kv;
    int d, page;
  } layouts[] = {{DType::kBF16, 64, 0}, {DType::kBF16, 128, 0}, {DType::kBF16, 64, 16},  {DType::kBF16, 128, 16},
                 {DType::kI8, 128, 0},  {DType::kI8, 128, 16},  {DType::kFp8E4M3, 128, 16}, {DType::kFp8E4M3, 64, 32}};
  uint64_t seed = 900;
  for (const auto& l : layouts)
    for (const auto& gqa : {std::pair{8, 2}, std::pair{9, 3}, std::pair{32, 2}}) {
      DecCase c;
      c.kv = l.kv, c.d = l.d, c.page_size = l.page, c.head_major = true, c.seed = seed++;
      c.h = gqa.first, c.hk = gqa.second;
      c.q_lens = {1, 2, 1}, c.kv_lens = {1, 777, 4097};
      check_case(c);
      c.splits = 3, c.seed = seed++;
      check_case(c);
    }
}

// The same K/V, contiguous and paged, with the same split count: identical bits.
TEST(DecodeCuda, PagedEqualsContiguous) {
  for (DType kv : {DType::kBF16, DType::kI8}) {
    DecCase c;
    c.kv = kv, c.splits = 5, c.seed = 600, c.h = 9, c.hk = 3, c.d = 64;
    c.q_lens = {1, 3, 1}, c.kv_lens = {1, 999, 3000};
    const Problem pr = make_problem(c);
    RunResult res[2];
    for (int paged = 0; paged < 2; ++paged) {
      c.page_size = paged ? 16 : 0;
      KvData kvd = store_kv(pr.kf, pr.vf, c.kv_lens, c.hk, c.d, c.kv, c.page_size, 77);
      DeviceProblem dp;
      to_device(c, pr, kvd, dp);
      attn::CudaOptions opt;
      opt.impl = attn::Impl::kDecode, opt.num_splits = c.splits;
      res[paged] = run_gpu(dp.g, pr.tq, dp.d_o, dp.d_lse, opt);
    }
    EXPECT_TRUE(res[0].o == res[1].o) << "paged and contiguous differ for " << dtype_name(kv);
    EXPECT_EQ(std::memcmp(res[0].lse.data(), res[1].lse.data(), res[0].lse.size() * 4), 0);
  }
}

// Captured once with fixed bounds, replayed after the lengths in device memory change.
TEST(DecodeCuda, CudaGraphReplaysWithNewLengths) {
  DecCase c;
  c.page_size = 16, c.h = 8, c.hk = 2, c.seed = 700;
  c.q_lens = {1, 1, 1}, c.kv_lens = {500, 2000, 64};
  Problem pr = make_problem(c);
  KvData kv = store_kv(pr.kf, pr.vf, c.kv_lens, c.hk, c.d, c.kv, c.page_size, 78);
  DeviceProblem dp;
  to_device(c, pr, kv, dp);
  attn::CudaOptions opt;
  opt.impl = attn::Impl::kDecode;
  opt.max_q_len = 1, opt.max_kv_len = 2000, opt.num_splits = 4;
  const size_t ws_bytes = attn::decode_workspace_bytes(dp.g, opt.max_q_len, opt.num_splits);
  DeviceBuffer ws(ws_bytes);
  opt.workspace = ws.get(), opt.workspace_bytes = ws_bytes;
  cudaStream_t s;
  GPU_CHECK(cudaStreamCreate(&s));
  cudaGraph_t graph;
  GPU_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  const Status st = attn::attention_cuda(dp.g, s, opt);
  GPU_CHECK(cudaStreamEndCapture(s, &graph));
  ASSERT_TRUE(st.ok()) << st.message();
  cudaGraphExec_t exec;
  GPU_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  // Shorter sequences, same pages: only the device-side lengths change.
  for (const std::vector<int>& lens : {std::vector<int>{500, 2000, 64}, std::vector<int>{3, 1999, 17}}) {
    DecCase cc = c;
    cc.kv_lens = lens;
    Problem p2 = pr;
    for (int b = 0; b < 3; ++b) p2.cu_k[b + 1] = p2.cu_k[b] + lens[b];
    // The reference sees the same pages: keep the page table, shorten the lengths.
    std::vector<float> o_ref, lse_ref;
    reference(cc, p2, kv, o_ref, lse_ref);

    dp.dck.upload(p2.cu_k);
    GPU_CHECK(cudaMemset(dp.d_o.get(), 0xff, dp.d_o.bytes()));
    GPU_CHECK(cudaMemset(dp.d_lse.get(), 0xff, dp.d_lse.bytes()));
    GPU_CHECK(cudaGraphLaunch(exec, s));
    GPU_CHECK(cudaStreamSynchronize(s));
    RunResult out;
    out.o.resize(p2.tq * c.h * c.d), out.lse.resize(p2.tq * c.h);
    dp.d_o.download(out.o), dp.d_lse.download(out.lse);
    compare_outputs(out.o, out.lse, o_ref, lse_ref, c.dt, kTolBf16, 8e-3, c.h, c.d);
  }
  GPU_CHECK(cudaGraphExecDestroy(exec));
  GPU_CHECK(cudaGraphDestroy(graph));
  GPU_CHECK(cudaStreamDestroy(s));
}

// Cascade: B sequences sharing a P-token prefix (whole pages) give what plain decode over
// prefix + own tokens gives, with the prefix pages read once.
TEST(DecodeCuda, CascadeSharedPrefixEqualsFullSequences) {
  uint64_t seed = 800;
  for (DType kvt : {DType::kBF16, DType::kI8})
    for (bool sink_logits : {false, true}) {
      SCOPED_TRACE(std::string(dtype_name(kvt)) + (sink_logits ? " sink logits" : ""));
      const int P = 16 * 40, page = 16;
      const std::vector<int> own = {1, 17, 100, 3, 33};
      // 8 queries in all (the prefix pass on the decode kernel), or 25 (bf16: the prefill kernel on
      // Hopper). A sequence has at least as many own tokens as queries: its queries follow the prefix.
      const std::vector<int> q_lens = kvt == DType::kBF16 && sink_logits ? std::vector<int>{1, 9, 7, 1, 7}
                                                                         : std::vector<int>{1, 1, 2, 1, 3};
      const int B = int(own.size());
      // One store holds the prefix as "sequence 0" and each suffix as sequence b + 1.
      DecCase c;
      c.h = 8, c.hk = 2, c.d = 128, c.kv = kvt, c.page_size = page, c.seed = seed++, c.sink_logits = sink_logits;
      c.q_lens.assign(B + 1, 0), c.kv_lens.assign(B + 1, P);
      for (int b = 0; b < B; ++b) c.q_lens[b + 1] = q_lens[b], c.kv_lens[b + 1] = own[b];
      const Problem pr = make_problem(c);
      KvData kv = store_kv(pr.kf, pr.vf, c.kv_lens, c.hk, c.d, c.kv, page, c.seed + 1);
      kv.upload();
      // Full sequences: prefix pages, then own pages.
      std::vector<int32_t> cu_q(B + 1, 0), cu_full(B + 1, 0), cu_own(B + 1, 0), ind_full{0}, ind_own{0}, pages_full,
          pages_own;
      const std::vector<int32_t> prefix_pages(kv.indices.begin(), kv.indices.begin() + kv.indptr[1]);
      for (int b = 0; b < B; ++b) {
        cu_q[b + 1] = cu_q[b] + q_lens[b];
        cu_full[b + 1] = cu_full[b] + P + own[b], cu_own[b + 1] = cu_own[b] + own[b];
        pages_full.insert(pages_full.end(), prefix_pages.begin(), prefix_pages.end());
        for (int i = kv.indptr[b + 1]; i < kv.indptr[b + 2]; ++i)
          pages_full.push_back(kv.indices[i]), pages_own.push_back(kv.indices[i]);
        ind_full.push_back(int32_t(pages_full.size())), ind_own.push_back(int32_t(pages_own.size()));
      }
      const int64_t tq = cu_q[B];
      AttentionParams hp;
      hp.q_dtype = hp.o_dtype = c.dt, hp.kv_dtype = c.kv, hp.batch = B;
      hp.num_heads = c.h, hp.num_kv_heads = c.hk, hp.head_dim = c.d, hp.causal = true;
      hp.q_row_stride = hp.o_row_stride = int64_t(c.h) * c.d, hp.q_head_stride = hp.o_head_stride = c.d;
      hp.q = pr.q.data(), hp.sink_logits = sink_logits ? pr.sinks.data() : nullptr;
      hp.cu_seqlens_q = cu_q.data(), hp.cu_seqlens_k = cu_full.data();
      kv.bind(hp, page, false);
      hp.page_indptr = ind_full.data(), hp.page_indices = pages_full.data();
      std::vector<float> o_ref, lse_ref;
      reference_over_stored_kv(hp, o_ref, lse_ref);

      // Device: each sequence's own pages, plus the prefix.
      DeviceBuffer dq(tq * c.h * c.d * 2), d_o(tq * c.h * c.d * 2), d_lse(tq * c.h * 4), dcq((B + 1) * 4),
          dck((B + 1) * 4), dind((B + 1) * 4), dpages(pages_own.size() * 4), dprefix(prefix_pages.size() * 4),
          dsink(c.h * 4);
      GPU_CHECK(cudaMemcpy(dq.get(), pr.q.data(), tq * c.h * c.d * 2, cudaMemcpyHostToDevice));
      dcq.upload(cu_q), dck.upload(cu_own), dind.upload(ind_own), dpages.upload(pages_own), dprefix.upload(prefix_pages);
      dsink.upload(pr.sinks);
      AttentionParams g = hp;
      kv.bind(g, page, true);
      g.q = dq.get(), g.o = d_o.get(), g.lse = d_lse.get<float>();
      g.sink_logits = sink_logits ? dsink.get<float>() : nullptr;
      g.cu_seqlens_q = dcq.get<int32_t>(), g.cu_seqlens_k = dck.get<int32_t>();
      g.page_indptr = dind.get<int32_t>(), g.page_indices = dpages.get<int32_t>();
      attn::CudaOptions opt;
      opt.host_cu_seqlens_q = cu_q.data(), opt.host_cu_seqlens_k = cu_own.data();
      attn::CascadePrefix prefix;
      prefix.kv_len = P, prefix.page_indices = dprefix.get<int32_t>();
      GPU_CHECK(cudaMemset(d_o.get(), 0xff, d_o.bytes()));
      const Status st = attn::cascade_attention_cuda(g, prefix, nullptr, opt);
      ASSERT_TRUE(st.ok()) << st.message();
      GPU_CHECK(cudaDeviceSynchronize());
      RunResult out;
      out.o.resize(tq * c.h * c.d), out.lse.resize(tq * c.h);
      d_o.download(out.o), d_lse.download(out.lse);
      compare_outputs(out.o, out.lse, o_ref, lse_ref, c.dt, kTolBf16, 8e-3, c.h, c.d);
    }
}

// Prefill and chunked prefill over paged K/V (the sm_90 kernel's TMA boxes per page on Hopper):
// page sizes below, equal to and above its key tile, split-KV forced and by heuristic, GQA, masks.
TEST(DecodeCuda, PagedPrefill) {
  uint64_t seed = 1000;
  for (int d : {64, 128, 256})
    for (int page : {16, 64, 256})
      for (int splits : {0, 3}) {
        DecCase c;
        c.d = d, c.page_size = page, c.splits = splits, c.seed = seed++;
        c.h = 8, c.hk = 2, c.dt = d == 128 ? DType::kF16 : DType::kBF16, c.kv = c.dt;
        c.q_lens = {129, 17, 300}, c.kv_lens = {129, 1000, 700};
        c.causal = (seed % 2) == 0;
        check_case(c, attn::Impl::kAuto);
      }
  // Pages in runs of 8 and 13 consecutive ones: the sm_90 kernel reads a 128-key tile whose 16-key
  // pages follow each other as one box, others box by box (runs of 13 start mid-tile).
  for (int run : {8, 13})
    for (int d : {64, 128, 256}) {
      DecCase c;
      c.d = d, c.page_size = 16, c.page_run = run, c.splits = run == 8 ? 3 : 0, c.seed = seed++;
      c.h = 8, c.hk = 2, c.dt = DType::kBF16, c.kv = c.dt;
      c.q_lens = {129, 300}, c.kv_lens = {1000, 2100};
      c.causal = run == 13;
      check_case(c, attn::Impl::kAuto);
    }
  DecCase c;  // every option at once, SmolLM2's 9/3 heads, one long sequence split by the heuristic
  c.d = 64, c.h = 9, c.hk = 3, c.page_size = 16, c.seed = 1100;
  c.q_lens = {40}, c.kv_lens = {5000};
  c.wl = 1000, c.sinks = 4, c.sink_logits = true, c.softcap = 30.0f;
  check_case(c, attn::Impl::kAuto);
  c.wl = -1, c.sinks = 0, c.softcap = 0.0f, c.causal = false;
  check_case(c, attn::Impl::kAuto);
}

TEST(DecodeCuda, UnsupportedInputsAreErrors) {
  DecCase c;
  c.q_lens = {1}, c.kv_lens = {10};
  const Problem pr = make_problem(c);
  KvData kv = store_kv(pr.kf, pr.vf, c.kv_lens, c.hk, c.d, c.kv, 0, 1);
  DeviceProblem dp;
  to_device(c, pr, kv, dp);
  attn::CudaOptions opt;
  opt.impl = attn::Impl::kDecode;
  AttentionParams g = dp.g;
  g.kv_dtype = DType::kFp8E4M3;  // contiguous fp8: no per-page scale
  g.k_scale = g.v_scale = dp.dsink.get<float>();
  EXPECT_FALSE(attn::attention_cuda(g, nullptr, opt).ok());
  g = dp.g;
  g.kv_dtype = DType::kI8;  // no scales
  EXPECT_FALSE(attn::attention_cuda(g, nullptr, opt).ok());
  g = dp.g;
  g.page_size = 16;  // no page table
  EXPECT_FALSE(attn::attention_cuda(g, nullptr, opt).ok());
  g = dp.g;
  opt.num_splits = 4, opt.workspace = dp.d_o.get(), opt.workspace_bytes = 8;  // too small
  EXPECT_FALSE(attn::attention_cuda(g, nullptr, opt).ok());
}

// Small shapes for compute-sanitizer (memcheck, racecheck): every format, paged and split.
TEST(DecodeCudaSmall, AllPaths) {
  uint64_t seed = 900;
  for (DType kv : {DType::kBF16, DType::kI8, DType::kFp8E4M3}) {
    DecCase c;
    c.kv = kv, c.page_size = 16, c.splits = 3, c.seed = seed++, c.d = 64, c.h = 9, c.hk = 3;
    c.q_lens = {1, 2}, c.kv_lens = {33, 70};
    c.wl = 40, c.sinks = 2, c.sink_logits = true;
    check_case(c);
    c.q_lens = {1, 9}, c.kv_lens = {33, 70};  // 27 rows: the wide form
    check_case(c);
  }
  DecCase c;  // the sm_90 prefill kernel over pages, with splits
  c.page_size = 16, c.splits = 2, c.seed = seed++, c.d = 64, c.h = 4, c.hk = 2;
  c.q_lens = {20, 3}, c.kv_lens = {70, 40};
  check_case(c, attn::Impl::kAuto);
}

}  // namespace
}  // namespace escala::gputest

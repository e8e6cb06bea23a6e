// The CUDA prefill kernel against the double-precision reference on fresh random inputs: every
// feature alone and combined, odd lengths, GQA ratios, strided layouts, poisoned outputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "attention/cuda/dispatch.h"
#include "attention/reference.h"
#include "escala/attention_cuda.h"
#include "gpu_util.h"
#include "reference_util.h"

namespace escala::gputest {
namespace {

using attn::AttentionParams;

struct Case {
  std::vector<int> q_lens, kv_lens;
  int h = 4, hk = 4, d = 64;
  int dv = 0;  // head_dim_v; 0 means d
  DType dt = DType::kBF16;
  bool causal = false;
  int wl = -1, wr = -1, sinks = 0;
  bool sink_logits = false;
  float softcap = 0.0f;
  float scale = 0.0f;
  bool packed_qkv = false;    // Q, K, V interleaved in one [T, h + 2 hk, d] buffer
  bool host_seqlens = true;   // give the launcher host copies of cu_seqlens
  float k_ramp = 0.0f;        // K row j of n scaled by 1 + k_ramp (n - 1 - j) / 128 (not with packed_qkv)
  int num_splits = 0;         // CudaOptions::num_splits (0: the launcher's choice)
  bool garbage_workspace = false;  // the caller's workspace (256 bytes of 0x7f before every call)
  int tail_pairs = -1;             // Sm90Tuning::tail_pairs (-1: the launcher's choice)
  int poison = -1;                 // 0 / 1 / 2: two random elements of Q / K / V set to poison_value
  float poison_value = 0.0f;
  uint64_t seed = 1;

  int d_v() const { return dv ? dv : d; }

  std::string describe() const {
    std::ostringstream os;
    os << "q_lens={";
    for (int x : q_lens) os << x << ",";
    os << "} kv_lens={";
    for (int x : kv_lens) os << x << ",";
    os << "} h=" << h << " hk=" << hk << " d=" << d << " dv=" << d_v() << " " << dtype_name(dt) << " causal=" << causal
       << " window=(" << wl << "," << wr << ") sinks=" << sinks << " sink_logits=" << sink_logits
       << " softcap=" << softcap << " packed=" << packed_qkv << " k_ramp=" << k_ramp << " splits=" << num_splits
       << " garbage_workspace=" << garbage_workspace << " tail_pairs=" << tail_pairs;
    if (poison >= 0) os << " poison " << "QKV"[poison] << " = " << poison_value;
    return os.str();
  }
};

struct Outputs {
  std::vector<uint16_t> o;
  std::vector<float> lse;
};

void compare(const Case& c, const Outputs& out, const std::vector<float>& o_ref, const std::vector<float>& lse_ref) {
  compare_outputs(out.o, out.lse, o_ref, lse_ref, c.dt, c.dt == DType::kBF16 ? kTolBf16 : kTolF16,
                  c.dt == DType::kBF16 ? 8e-3 : 2e-3, c.h, c.d_v());
}

// The kernels this device can run: sm_80 everywhere, sm_90a on Hopper.
std::vector<attn::cuda::KernelArch> device_archs() {
  int dev = 0, major = 0, minor = 0;
  GPU_CHECK(cudaGetDevice(&dev));
  GPU_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  GPU_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  std::vector<attn::cuda::KernelArch> a{attn::cuda::KernelArch::kSm80};
  if (major == 9 && minor == 0) a.push_back(attn::cuda::KernelArch::kSm90);
  return a;
}

// Runs one case on the GPU, twice (the two results must be bit-identical: a moving result is a
// race), and checks it against the reference.
void check_case(const Case& c) {
  SCOPED_TRACE(c.describe());
  ASSERT_EQ(c.q_lens.size(), c.kv_lens.size());
  const int batch = static_cast<int>(c.q_lens.size());
  std::vector<int32_t> cu_q(batch + 1, 0), cu_k(batch + 1, 0);
  for (int b = 0; b < batch; ++b) cu_q[b + 1] = cu_q[b] + c.q_lens[b], cu_k[b + 1] = cu_k[b] + c.kv_lens[b];
  const int64_t tq = cu_q[batch], tk = cu_k[batch];
  const int d = c.d, d_v = c.d_v();

  AttentionParams p;
  p.q_dtype = p.kv_dtype = p.o_dtype = c.dt;
  p.batch = batch;
  p.num_heads = c.h, p.num_kv_heads = c.hk, p.head_dim = d, p.head_dim_v = c.dv;
  p.causal = c.causal, p.window_left = c.wl, p.window_right = c.wr, p.num_sinks = c.sinks;
  p.softcap = c.softcap, p.softmax_scale = c.scale;

  // Host inputs.
  std::vector<uint16_t> hq, hk_, hv, hqkv;
  if (c.packed_qkv) {
    EXPECT_EQ(tq, tk);
    const int64_t row = static_cast<int64_t>(c.h + c.hk) * d + static_cast<int64_t>(c.hk) * d_v;
    hqkv = random_half(tq * row, c.dt, c.seed);
    p.q = hqkv.data();
    p.k = hqkv.data() + static_cast<size_t>(c.h) * d;
    p.v = hqkv.data() + static_cast<size_t>(c.h + c.hk) * d;
    p.q_row_stride = p.k_row_stride = p.v_row_stride = row;
  } else {
    hq = random_half(tq * c.h * d, c.dt, c.seed);
    hk_ = random_half(tk * c.hk * d, c.dt, c.seed + 1000);
    hv = random_half(tk * c.hk * d_v, c.dt, c.seed + 2000);
    for (int b = 0; b < batch && c.k_ramp > 0.0f; ++b)
      for (int j = 0; j < c.kv_lens[b]; ++j) {
        const float f = 1.0f + c.k_ramp * static_cast<float>(c.kv_lens[b] - 1 - j) / 128.0f;
        uint16_t* row = hk_.data() + (cu_k[b] + j) * static_cast<int64_t>(c.hk) * d;
        for (int e = 0; e < c.hk * d; ++e) {
          const float x = half_to_float(row[e], c.dt) * f;
          row[e] = c.dt == DType::kBF16 ? f32_to_bf16(x) : f32_to_f16(x);
        }
      }
    if (c.poison >= 0) {
      std::vector<uint16_t>& t = c.poison == 0 ? hq : c.poison == 1 ? hk_ : hv;
      std::mt19937_64 r(c.seed + 3000);
      const uint16_t bad = c.dt == DType::kBF16 ? f32_to_bf16(c.poison_value) : f32_to_f16(c.poison_value);
      for (int k = 0; k < 2 && !t.empty(); ++k) t[r() % t.size()] = bad;
    }
    p.q = hq.data(), p.k = hk_.data(), p.v = hv.data();
    p.q_row_stride = static_cast<int64_t>(c.h) * d;
    p.k_row_stride = static_cast<int64_t>(c.hk) * d;
    p.v_row_stride = static_cast<int64_t>(c.hk) * d_v;
  }
  p.q_head_stride = p.k_head_stride = d;
  p.v_head_stride = d_v;
  p.o_row_stride = static_cast<int64_t>(c.h) * d_v, p.o_head_stride = d_v;
  std::vector<float> sinks(c.h);
  for (int h = 0; h < c.h; ++h) sinks[h] = 0.5f * static_cast<float>(h % 5) - 0.5f;  // -0.5 .. 1.5
  p.sink_logits = c.sink_logits ? sinks.data() : nullptr;
  p.cu_seqlens_q = cu_q.data(), p.cu_seqlens_k = cu_k.data();

  // Reference.
  std::vector<float> o_ref(tq * c.h * d_v), lse_ref(tq * c.h);
  parallel_reference(p, o_ref, lse_ref, tq);

  // Device copies.
  DeviceBuffer dq, dk, dv, dqkv, d_o(std::max<int64_t>(1, tq * c.h * d_v) * 2), d_lse(std::max<int64_t>(1, tq * c.h) * 4),
      dcq((batch + 1) * 4), dck((batch + 1) * 4), dsink(c.h * 4);
  AttentionParams g = p;
  if (c.packed_qkv) {
    dqkv = DeviceBuffer(hqkv.size() * 2);
    dqkv.upload(hqkv);
    g.q = dqkv.get<uint16_t>();
    g.k = dqkv.get<uint16_t>() + static_cast<size_t>(c.h) * d;
    g.v = dqkv.get<uint16_t>() + static_cast<size_t>(c.h + c.hk) * d;
  } else {
    dq = DeviceBuffer(std::max<size_t>(2, hq.size() * 2));
    dk = DeviceBuffer(std::max<size_t>(2, hk_.size() * 2));
    dv = DeviceBuffer(std::max<size_t>(2, hv.size() * 2));
    if (!hq.empty()) dq.upload(hq);
    if (!hk_.empty()) dk.upload(hk_), dv.upload(hv);
    g.q = dq.get(), g.k = dk.get(), g.v = dv.get();
  }
  dcq.upload(cu_q), dck.upload(cu_k), dsink.upload(sinks);
  g.cu_seqlens_q = dcq.get<int32_t>(), g.cu_seqlens_k = dck.get<int32_t>();
  g.sink_logits = c.sink_logits ? dsink.get<float>() : nullptr;
  g.o = d_o.get(), g.lse = d_lse.get<float>();
  attn::CudaOptions opt;
  if (c.host_seqlens) opt.host_cu_seqlens_q = cu_q.data(), opt.host_cu_seqlens_k = cu_k.data();
  opt.num_splits = c.num_splits;
  DeviceBuffer workspace(c.garbage_workspace ? 256 : 0);
  if (c.garbage_workspace) opt.workspace = workspace.get(), opt.workspace_bytes = 256;

  // Each kernel; at head dims <= 64 the sm_90 kernel in both query-tile heights (128 and 192 rows),
  // whichever its cost model would pick for this case.
  struct Kernel {
    attn::cuda::KernelArch arch;
    int tile_rows;
  };
  std::vector<Kernel> kernels;
  for (attn::cuda::KernelArch arch : device_archs()) {
    if (arch == attn::cuda::KernelArch::kSm90 && std::max(d, d_v) <= 64)
      kernels.push_back({arch, 128}), kernels.push_back({arch, 192});
    else
      kernels.push_back({arch, 0});
  }
  for (const Kernel& kernel : kernels) {
    const attn::cuda::KernelArch arch = kernel.arch;
    SCOPED_TRACE(arch == attn::cuda::KernelArch::kSm90 ? "kernel sm90, tile rows " + std::to_string(kernel.tile_rows)
                                                       : std::string("kernel sm80"));
    Outputs run[2];
    for (auto& r : run) {
      GPU_CHECK(cudaMemset(d_o.get(), 0xff, d_o.bytes()));    // NaN in f16 and bf16
      GPU_CHECK(cudaMemset(d_lse.get(), 0xff, d_lse.bytes()));  // NaN
      if (c.garbage_workspace) GPU_CHECK(cudaMemset(workspace.get(), 0x7f, 256));  // counters past every item
      const Status st = attn::cuda::attention_cuda_arch(g, nullptr, opt, arch, {kernel.tile_rows, c.tail_pairs});
      ASSERT_TRUE(st.ok()) << st.message();
      GPU_CHECK(cudaDeviceSynchronize());
      GPU_CHECK(cudaGetLastError());
      r.o.resize(tq * c.h * d_v), r.lse.resize(tq * c.h);
      if (tq > 0) d_o.download(r.o), d_lse.download(r.lse);
    }
    ASSERT_TRUE(run[0].o == run[1].o) << "two runs differ: a race?";
    ASSERT_EQ(std::memcmp(run[0].lse.data(), run[1].lse.data(), run[0].lse.size() * 4), 0)
        << "LSE differs between runs";
    compare(c, run[0], o_ref, lse_ref);
  }
}

const DType kDtypes[] = {DType::kBF16, DType::kF16};

TEST(AttentionCuda, DenseHeadDimsDtypesCausal) {
  for (int d : {64, 128, 256})
    for (DType dt : kDtypes)
      for (bool causal : {false, true}) {
        Case c;
        c.q_lens = c.kv_lens = {1, 7, 129, 1000};
        c.h = 4, c.hk = 1, c.d = d, c.dt = dt, c.causal = causal;
        c.seed = static_cast<uint64_t>(d * 10 + causal);
        check_case(c);
      }
}

TEST(AttentionCuda, GqaRatios) {
  for (int hk : {8, 2, 1})
    for (bool causal : {false, true}) {
      Case c;
      c.q_lens = c.kv_lens = {129, 300};
      c.h = 8, c.hk = hk, c.d = 128, c.causal = causal, c.seed = 100 + hk;
      check_case(c);
    }
}

TEST(AttentionCuda, AppendQueriesShorterThanKeys) {
  for (int d : {64, 128, 256})
    for (bool causal : {false, true}) {
      Case c;
      c.q_lens = {1, 7, 129, 64, 30};
      c.kv_lens = {1000, 130, 700, 64, 4097};
      c.h = 2, c.hk = 1, c.d = d, c.causal = causal, c.dt = d == 128 ? DType::kF16 : DType::kBF16;
      c.seed = 200 + d;
      check_case(c);
    }
}

// The sm_90 kernel's work counters: in the library's buffer the kernel leaves them zero for the
// next call (every case runs twice, and cases follow each other on one stream); a caller's
// workspace may hold anything, and each call zeroes its counters first.
TEST(AttentionCuda, CallersWorkspaceWithGarbage) {
  for (bool causal : {false, true}) {
    Case c;
    c.q_lens = c.kv_lens = {1000, 300, 129};
    c.h = 4, c.hk = 2, c.d = 128, c.causal = causal, c.num_splits = 1, c.garbage_workspace = true;
    c.seed = 1400 + causal;
    check_case(c);
  }
}

// The sm_90 work order without a causal mask or window: the partial last query tiles of the last
// `tail_pairs` (sequence, head) pairs come after every other item. None, one, some, all and more
// than all of the 12 pairs; sequences whose last tile is partial (1000, 129) and whole (256 at 128
// rows); the dense kernels and the split variant.
TEST(AttentionCuda, PartialTilesDeferredToTheEnd) {
  for (int tail : {0, 1, 5, 12, 100})
    for (int d : {64, 128}) {
      Case c;
      c.q_lens = c.kv_lens = {1000, 256, 129};
      c.h = 4, c.hk = 2, c.d = d, c.tail_pairs = tail, c.num_splits = tail == 5 ? 0 : 1;
      c.seed = 1500 + tail + d;
      check_case(c);
    }
}

// Non-finite inputs propagate as attention.h states, as on the CPU (the reference decides which
// outputs are NaN, compare_outputs wants exactly those): a NaN or inf in Q makes its row NaN, in K
// the rows that see that key; a NaN in V that column of the rows that see it. Before, the
// epilogues read a NaN row sum as an empty row and wrote 0. V is poisoned only where every row
// sees every key of one sequence: the kernels multiply whole tiles, so a masked key's NaN value
// (0 * NaN), or the next sequence's past a tile's end, may also reach a row.
TEST(AttentionCuda, NonFiniteInputsPropagate) {
  const float kBad[] = {std::nanf(""), std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity()};
  int n = 0;
  for (int d : {64, 128, 256})
    for (int what = 0; what < 3; ++what)
      for (float bad : kBad) {
        if (what == 2 && !std::isnan(bad)) continue;
        Case c;
        c.d = d, c.h = 4, c.hk = 2, c.poison = what, c.poison_value = bad, c.seed = 1600 + n++;
        if (what == 2) {
          c.q_lens = c.kv_lens = {300};
        } else {
          c.q_lens = {129, 1000, 7}, c.kv_lens = {129, 1000, 300};
          c.causal = n % 2 == 0, c.sink_logits = n % 3 == 0, c.softcap = n % 4 == 1 ? 20.0f : 0.0f;
          c.num_splits = n % 5 == 2 ? 0 : 1;  // 0: the launcher's split, here the split variant
        }
        check_case(c);
      }
}

TEST(AttentionCuda, EmptyRowsAndEmptySequences) {
  Case c;  // queries before the first key (q longer than kv), an empty kv run, an empty q run
  c.q_lens = {100, 5, 0, 10};
  c.kv_lens = {30, 0, 20, 20};
  c.h = 2, c.hk = 2, c.d = 64, c.causal = true;
  check_case(c);
  c.sink_logits = true;  // rows with no key still get the sink: O = 0, LSE = sink
  check_case(c);
  Case w;  // a window around the diagonal with q longer than kv: the first rows see no key
  w.q_lens = {200};
  w.kv_lens = {50};
  w.wl = 3, w.wr = 3, w.d = 128, w.h = 1, w.hk = 1;
  check_case(w);
}

TEST(AttentionCuda, SlidingWindows) {
  const int windows[][2] = {{16, 0}, {100, 50}, {-1, 20}, {37, -1}, {0, 0}, {200, 200}};
  for (auto& wnd : windows)
    for (bool causal : {false, true}) {
      Case c;
      c.q_lens = c.kv_lens = {1000, 129};
      c.h = 2, c.hk = 1, c.d = 64, c.causal = causal, c.wl = wnd[0], c.wr = wnd[1];
      c.seed = 300 + wnd[0] + causal;
      check_case(c);
    }
}

// Causal bands whose width is a multiple of the 128-key tile (window_left = 128 k - 1, as the usual
// 4096-key window): a query tile aligned to the key tiles then sees its diagonal tile at offsets
// <= r (row r) and its window's left-edge tile at offsets > r, the case an edge-tile optimisation
// would take (cuda_notes steps 152, 154). Widths of one to four tiles, appends whose offset is a
// multiple of 128 and one that is not, a soft-cap, fp16.
TEST(AttentionCuda, TileAlignedWindows) {
  struct W {
    int wl, wr;
    bool causal;
    int q_len, kv_len;
    DType dt;
    float softcap;
  };
  const W cases[] = {{255, 0, true, 1000, 1000, DType::kBF16, 0.0f},  {511, 0, false, 1000, 1000, DType::kF16, 0.0f},
                     {255, -1, true, 616, 1000, DType::kBF16, 0.0f},  {383, 0, true, 600, 1000, DType::kBF16, 0.0f},
                     {255, 0, true, 1000, 1000, DType::kBF16, 30.0f}, {127, 0, true, 1000, 1000, DType::kBF16, 0.0f}};
  for (const W& w : cases)
    for (int d : {64, 128}) {
      Case c;
      c.q_lens = {w.q_len, 129};
      c.kv_lens = {w.kv_len, 300};
      c.h = 4, c.hk = 2, c.d = d, c.dt = w.dt, c.causal = w.causal, c.wl = w.wl, c.wr = w.wr, c.softcap = w.softcap;
      c.seed = 450 + w.wl + d + w.q_len;
      check_case(c);
    }
}

TEST(AttentionCuda, SinksWithWindows) {
  struct S {
    int sinks, wl, wr;
    bool causal;
  };
  // Up to 16 sinks below the window the sm_90 d = 128 kernel reads them as a narrow tile (16 is its
  // width; 70 and 130 take whole tiles).
  const S cases[] = {{4, 64, 0, true},      {70, 10, 0, true}, {4, 10, 10, false},
                     {130, 300, -1, false}, {1, 0, 0, true},   {16, 200, 0, true}};
  for (const S& s : cases)
    for (int d : {64, 128, 256}) {
      Case c;
      c.q_lens = {1000, 7};
      c.kv_lens = {1000, 300};
      c.h = 4, c.hk = 2, c.d = d, c.causal = s.causal, c.wl = s.wl, c.wr = s.wr, c.sinks = s.sinks;
      c.seed = 400 + s.sinks + d;
      check_case(c);
    }
}

TEST(AttentionCuda, SinkLogitsSoftcapScale) {
  for (int d : {64, 128, 256})
    for (DType dt : kDtypes) {
      Case c;
      c.q_lens = {129, 500};
      c.kv_lens = {200, 500};
      c.h = 4, c.hk = 1, c.d = d, c.dt = dt, c.causal = true, c.sink_logits = true, c.softcap = 2.0f;
      c.scale = 0.3f;  // with softcap 2 the cap bites
      c.seed = 500 + d;
      check_case(c);
      c.softcap = 30.0f, c.scale = 0.0f, c.causal = false, c.wl = 64, c.wr = 64, c.sinks = 4;
      check_case(c);
    }
}

// The kernels visit an item's key tiles from the highest down. Keys scaled up towards the
// sequence's start make each tile's max exceed the running one: at ramp 3 by ~11 in log2 units, more
// than the 8 that the conditional rescale lets pass, so O is rescaled on most tiles; at ramp 0.5 by
// ~2, so the running max is kept over several tiles (p above 1) before O is rescaled. One split
// (the dense kernels) and the launcher's choice (here the split variant: too few query tiles to fill
// the GPU). Session 26: a build without the loop's conditional rescale failed every d = 128 / 256
// case of this test.
TEST(AttentionCuda, ScoresRisingAcrossKeyTiles) {
  for (int d : {64, 128, 256})
    for (float ramp : {0.5f, 3.0f})
      for (bool causal : {false, true})
        for (int splits : {1, 0}) {
          Case c;
          c.q_lens = c.kv_lens = {1000, 129};
          c.h = 4, c.hk = 2, c.d = d, c.causal = causal, c.k_ramp = ramp, c.num_splits = splits;
          c.dt = causal ? DType::kF16 : DType::kBF16;
          c.seed = 650 + d + static_cast<uint64_t>(ramp * 10) + causal;
          check_case(c);
        }
}

TEST(AttentionCuda, PackedQkvStridesAndDeviceSeqlens) {
  for (int d : {64, 128, 256}) {
    Case c;
    c.q_lens = c.kv_lens = {257, 33, 1};
    c.h = 4, c.hk = 2, c.d = d, c.causal = true, c.packed_qkv = true, c.host_seqlens = false;
    c.seed = 600 + d;
    check_case(c);
  }
}

TEST(AttentionCuda, LongSequences) {
  Case c;
  c.q_lens = c.kv_lens = {4097};
  c.h = 2, c.hk = 1, c.d = 128, c.causal = true, c.seed = 700;
  check_case(c);
  c.h = 1, c.d = 64, c.causal = false, c.dt = DType::kF16, c.seed = 701;
  check_case(c);
  c.d = 256, c.dt = DType::kBF16, c.causal = true, c.wl = 1000, c.wr = 0, c.sinks = 4, c.seed = 702;
  check_case(c);
  // Causal d = 256 without a window: items of 1 to 52 key tiles, so the sm_90 kernel's CTAs mix
  // items whose O is staged over the V stages (<= 32 tiles) with items stored from registers.
  c.wl = c.wr = -1, c.sinks = 0, c.seed = 703;
  check_case(c);
}

// Head dims below a kernel's tile width (zero-padded columns: 32, 80, 96, 160), the 192-wide
// kernel, and d_v != d_qk (192/128 has its own sm_90 kernel; 128/64 runs in the square one).
TEST(AttentionCuda, OtherHeadDimsAndUnequalDv) {
  const int dims[][2] = {{96, 96}, {192, 192}, {192, 128}, {32, 32}, {80, 80}, {160, 160}, {128, 64}};
  for (auto& dd : dims)
    for (bool causal : {false, true}) {
      Case c;
      c.q_lens = {1, 7, 129, 1000};
      c.kv_lens = {1, 30, 129, 1000};
      c.h = 8, c.hk = 2, c.d = dd[0], c.dv = dd[1], c.causal = causal;
      c.dt = causal ? DType::kBF16 : DType::kF16;
      c.seed = static_cast<uint64_t>(1100 + dd[0] + 7 * dd[1] + causal);
      check_case(c);
    }
  Case c;  // every option at once on the two new widths
  for (int d : {96, 192}) {
    c.q_lens = {300, 5};
    c.kv_lens = {700, 5};
    c.h = 4, c.hk = 1, c.d = d, c.causal = true, c.wl = 100, c.wr = 0, c.sinks = 4, c.sink_logits = true;
    c.softcap = 20.0f, c.seed = 1200 + d;
    check_case(c);
  }
}

TEST(AttentionCuda, UnsupportedInputsAreErrors) {
  AttentionParams p;
  int32_t cu[2] = {0, 4};
  DeviceBuffer buf(4096);
  p.q = p.k = p.v = p.o = buf.get();
  p.batch = 1, p.cu_seqlens_q = p.cu_seqlens_k = cu;
  p.num_heads = p.num_kv_heads = 1, p.head_dim = 68;
  p.q_dtype = p.kv_dtype = p.o_dtype = DType::kBF16;
  p.q_row_stride = p.k_row_stride = p.v_row_stride = p.o_row_stride = 72;
  p.q_head_stride = p.k_head_stride = p.v_head_stride = p.o_head_stride = 72;
  attn::CudaOptions opt;
  opt.host_cu_seqlens_q = cu, opt.host_cu_seqlens_k = cu;
  EXPECT_FALSE(attn::attention_cuda(p, nullptr, opt).ok());  // head dim 68: not a multiple of 8
  p.head_dim = 264;
  EXPECT_FALSE(attn::attention_cuda(p, nullptr, opt).ok());  // head dim above 256
  p.head_dim = 96;
  attn::CudaOptions forced_decode = opt;
  forced_decode.impl = attn::Impl::kDecode;
  EXPECT_FALSE(attn::attention_cuda(p, nullptr, forced_decode).ok());  // the decode kernel has no d = 96
  p.head_dim = 64;
  p.q_dtype = p.kv_dtype = p.o_dtype = DType::kF32;
  EXPECT_FALSE(attn::attention_cuda(p, nullptr, opt).ok());  // f32
  p.q_dtype = p.kv_dtype = p.o_dtype = DType::kBF16;
  p.q_row_stride = 68;
  EXPECT_FALSE(attn::attention_cuda(p, nullptr, opt).ok());  // misaligned stride
}

}  // namespace
}  // namespace escala::gputest

namespace escala::gputest {
namespace {
// Small shapes covering every kernel path, for compute-sanitizer memcheck/racecheck
// (gpu_check.sh runs `--gtest_filter=AttentionCudaSmall.*` under the sanitizer).
TEST(AttentionCudaSmall, AllPaths) {
  for (int d : {64, 96, 128, 192, 256}) {
    Case c;
    c.q_lens = {70, 3};
    c.kv_lens = {150, 3};
    c.h = 2, c.hk = 1, c.d = d, c.causal = true, c.wl = 40, c.wr = 0, c.sinks = 4, c.sink_logits = true;
    c.softcap = 20.0f, c.seed = 900 + d;
    check_case(c);
    c.causal = false, c.wl = c.wr = -1, c.sinks = 0, c.softcap = 0.0f, c.dt = DType::kF16;
    check_case(c);
  }
  Case u;  // d_v != d_qk
  u.q_lens = {70, 3};
  u.kv_lens = {150, 3};
  u.h = 2, u.hk = 1, u.d = 192, u.dv = 128, u.causal = true, u.seed = 990;
  check_case(u);
}
}  // namespace
}  // namespace escala::gputest

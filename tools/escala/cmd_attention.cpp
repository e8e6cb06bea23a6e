// `escala attention`: runs the attention API on Q, K, V read from .npy files and writes O (and the
// LSE). K/V can be laid out as randomly permuted pages (--block-size, --page-seed) and stored
// quantized (--kv-dtype int8|fp8), so the paged and quantized paths are checkable from the shell.
//
// Every bad input is one `escala: error: ...` line and exit 1, and no output file is left behind:
// O and LSE are written to temporary files and renamed into place only after both are complete.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "cli_args.h"
#include "commands.h"
#include "common/npy.h"
#include "common/numeric.h"
#include "escala/attention.h"

namespace escala::cli {

namespace {

using npy::NpyArray;
using npy::NpyDType;

struct AttentionArgs {
  std::string q, k, v, out, lse, sink_logits, cu_q, cu_k, impl = "auto", kv_dtype;
  bool causal = false;
  std::optional<std::string> window_left, window_right, sinks, softcap, scale, threads, block_size, page_seed;
};

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr int64_t kMaxPageSize = 1 << 16;

float element(const NpyArray& a, int64_t i) { return a.dtype == NpyDType::kF16 ? f16_to_f32(a.f16()[i]) : a.f32()[i]; }

// Reads a [tokens, heads, dim] float32/float16 tensor of finite values.
Result<NpyArray> read_tensor(const std::string& path, std::string_view what) {
  auto a = npy::read_npy(path);
  if (!a.ok()) return a.status();
  if (a->dtype != NpyDType::kF32 && a->dtype != NpyDType::kF16)
    return Status::error(
        fmt::format("{}: {} must be float32 or float16, not {}", path, what, npy::npy_type_name(a->dtype)));
  if (a->shape.size() != 3)
    return Status::error(
        fmt::format("{}: {} must have shape [tokens, heads, dim], got {}", path, what, a->shape_string()));
  if (a->shape[0] > kInt32Max || a->shape[1] > kInt32Max || a->shape[2] > kInt32Max)
    return Status::error(fmt::format("{}: {} shape {} is too large", path, what, a->shape_string()));
  // The kernels and the reference treat a NaN score as a masked key: a NaN would silently drop keys
  // (all of them: zeros out). Refused instead, inf too.
  const int64_t n = a->numel(), heads = a->shape[1], dim = a->shape[2];
  for (int64_t i = 0; i < n; ++i)
    if (const float x = element(*a, i); !std::isfinite(x))
      return Status::error(fmt::format("{}: {} holds {} at [{}, {}, {}]; attention needs finite inputs", path, what, x,
                                       i / (heads * dim), i / dim % heads, i % dim));
  return a;
}

// cu_seqlens from an int32 .npy file or a comma list ("0,5,12"); checked against the token count.
Result<std::vector<int32_t>> parse_cu_seqlens(const std::string& text, std::string_view flag, int64_t total,
                                              std::string_view tensor) {
  std::vector<int32_t> cu;
  if (text.empty()) return std::vector<int32_t>{0, int32_t(total)};
  if (text.size() >= 4 && text.compare(text.size() - 4, 4, ".npy") == 0) {
    auto a = npy::read_npy(text);
    if (!a.ok()) return a.status();
    if (a->dtype != NpyDType::kI32 || a->shape.size() != 1)
      return Status::error(fmt::format("{}: {} must be a 1-d int32 array, got {} {}", text, flag,
                                       npy::npy_type_name(a->dtype), a->shape_string()));
    cu.assign(a->i32(), a->i32() + a->numel());
  } else {
    size_t start = 0;
    while (true) {
      const size_t comma = text.find(',', start);
      const std::string_view item =
          std::string_view(text).substr(start, comma == std::string::npos ? std::string::npos : comma - start);
      auto v = parse_int(item, flag, 0, kInt32Max);
      if (!v.ok())
        return Status::error(
            fmt::format("{}: '{}' is not a list of offsets like 0,5,12 ({})", flag, text, v.message()));
      cu.push_back(int32_t(*v));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
  }
  if (cu.size() < 2) return Status::error(fmt::format("{}: needs at least two offsets (0 and the total)", flag));
  if (cu[0] != 0) return Status::error(fmt::format("{}: must start at 0 (starts at {})", flag, cu[0]));
  for (size_t i = 1; i < cu.size(); ++i)
    if (cu[i] < cu[i - 1])
      return Status::error(fmt::format("{}: offsets must be non-decreasing ({} follows {})", flag, cu[i], cu[i - 1]));
  if (cu.back() != total)
    return Status::error(fmt::format("{}: ends at {} but {} has {} tokens", flag, cu.back(), tensor, total));
  return cu;
}

// K or V as the kernels will read it: contiguous rows or a pool of pages, in the storage dtype.
struct KvStore {
  std::vector<uint8_t> data;
  std::vector<float> scale;  // int8: per (slot, head); fp8: per (page, head)
};

// Where token t of sequence b lives: a row of the contiguous tensor or a slot of a page.
struct KvLayout {
  int32_t page_size = 0;
  int64_t num_slots = 0;                // rows (contiguous) or pages * page_size
  std::vector<int32_t> page_indptr{0};  // paged only
  std::vector<int32_t> page_indices;    // paged only
  int64_t slot(const std::vector<int32_t>& cu_k, int b, int64_t t) const {
    if (page_size == 0) return cu_k[b] + t;
    return int64_t(page_indices[page_indptr[b] + t / page_size]) * page_size + t % page_size;
  }
};

KvLayout make_layout(const std::vector<int32_t>& cu_k, int32_t page_size, uint64_t seed) {
  KvLayout L;
  L.page_size = page_size;
  if (page_size == 0) {
    L.num_slots = cu_k.back();
    return L;
  }
  int64_t pages = 0;
  for (size_t b = 0; b + 1 < cu_k.size(); ++b) {
    pages += (cu_k[b + 1] - cu_k[b] + page_size - 1) / page_size;
    L.page_indptr.push_back(int32_t(pages));
  }
  // A random permutation of the pool: a sequence's neighbouring pages are never neighbours in memory.
  std::vector<int32_t> perm(static_cast<size_t>(pages));
  std::iota(perm.begin(), perm.end(), 0);
  std::mt19937_64 rng(seed);
  std::shuffle(perm.begin(), perm.end(), rng);
  L.page_indices = std::move(perm);
  L.num_slots = pages * page_size;
  return L;
}

// Converts a [tokens, heads, dim] tensor into the layout and dtype (int8: scale per (slot, head) =
// maxabs/127; fp8: scale per (page, head) = maxabs/448). Empty slots stay zero with scale 1.
KvStore store_kv(const NpyArray& src, const std::vector<int32_t>& cu_k, const KvLayout& L, DType dt) {
  const int64_t heads = src.shape[1], dim = src.shape[2];
  KvStore s;
  s.data.assign(size_t(std::max<int64_t>(L.num_slots * heads * dim, 1)) * dtype_size(dt), 0);
  const int batch = int(cu_k.size()) - 1;
  if (dt == DType::kFp8E4M3) {
    const int64_t pages = L.num_slots / L.page_size;
    s.scale.assign(size_t(std::max<int64_t>(pages * heads, 1)), 1.0f);
    for (int b = 0; b < batch; ++b) {
      const int64_t len = cu_k[b + 1] - cu_k[b];
      for (int64_t first = 0; first < len; first += L.page_size) {
        const int64_t last = std::min(len, first + L.page_size);
        const int64_t page = L.slot(cu_k, b, first) / L.page_size;
        for (int64_t h = 0; h < heads; ++h) {
          float mx = 0;
          for (int64_t t = first; t < last; ++t)
            for (int64_t c = 0; c < dim; ++c)
              mx = std::max(mx, std::fabs(element(src, ((cu_k[b] + t) * heads + h) * dim + c)));
          const float sc = mx > 0 ? mx / 448.0f : 1.0f;
          s.scale[page * heads + h] = sc;
          for (int64_t t = first; t < last; ++t)
            for (int64_t c = 0; c < dim; ++c)
              s.data[(L.slot(cu_k, b, t) * heads + h) * dim + c] =
                  f32_to_fp8e4m3(element(src, ((cu_k[b] + t) * heads + h) * dim + c) / sc);
        }
      }
    }
    return s;
  }
  if (dt == DType::kI8) s.scale.assign(size_t(std::max<int64_t>(L.num_slots * heads, 1)), 1.0f);
  for (int b = 0; b < batch; ++b)
    for (int64_t t = 0; t < cu_k[b + 1] - cu_k[b]; ++t) {
      const int64_t slot = L.slot(cu_k, b, t);
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t from = ((cu_k[b] + t) * heads + h) * dim, to = (slot * heads + h) * dim;
        if (dt == DType::kI8) {
          float mx = 0;
          for (int64_t c = 0; c < dim; ++c) mx = std::max(mx, std::fabs(element(src, from + c)));
          const float sc = mx > 0 ? mx / 127.0f : 1.0f;
          s.scale[slot * heads + h] = sc;
          for (int64_t c = 0; c < dim; ++c)
            reinterpret_cast<int8_t*>(s.data.data())[to + c] =
                int8_t(std::clamp<long>(std::lrint(element(src, from + c) / sc), -127, 127));
          continue;
        }
        for (int64_t c = 0; c < dim; ++c) {
          const float x = element(src, from + c);
          switch (dt) {
            case DType::kF16: reinterpret_cast<uint16_t*>(s.data.data())[to + c] = f32_to_f16(x); break;
            case DType::kBF16: reinterpret_cast<uint16_t*>(s.data.data())[to + c] = f32_to_bf16(x); break;
            default: reinterpret_cast<float*>(s.data.data())[to + c] = x; break;
          }
        }
      }
    }
  return s;
}

Result<std::optional<int64_t>> optional_int(const std::optional<std::string>& text, std::string_view flag, int64_t lo,
                                            int64_t hi) {
  if (!text) return std::optional<int64_t>{};
  auto v = parse_int(*text, flag, lo, hi);
  if (!v.ok()) return v.status();
  return std::optional<int64_t>{*v};
}

Status run(const AttentionArgs& a) {
  // Flags first: a typo should not cost reading large files.
  ESCALA_CHECK_ARG(!a.q.empty() && !a.k.empty() && !a.v.empty(), "--q, --k and --v are required");
  ESCALA_CHECK_ARG(!a.out.empty(), "--out is required");
  ESCALA_CHECK_ARG(a.lse.empty() || a.lse != a.out, "--out and --lse name the same file");
  attn::CpuOptions opt;
  if (a.impl == "reference")
    opt.impl = attn::Impl::kReference;
  else if (a.impl == "flash")
    opt.impl = attn::Impl::kFlash;
  else if (a.impl == "decode")
    opt.impl = attn::Impl::kDecode;
  else if (a.impl == "auto")
    opt.impl = attn::Impl::kAuto;
  else
    return Status::error(fmt::format("--impl: unknown '{}' (reference, flash, decode or auto)", a.impl));

  attn::AttentionParams p;
  auto wl = optional_int(a.window_left, "--window-left", -1, kInt32Max);
  auto wr = optional_int(a.window_right, "--window-right", -1, kInt32Max);
  auto sinks = optional_int(a.sinks, "--sinks", 0, kInt32Max);
  auto threads = optional_int(a.threads, "--threads", 1, 4096);
  auto block = optional_int(a.block_size, "--block-size", 0, kMaxPageSize);
  auto seed = optional_int(a.page_seed, "--page-seed", 0, std::numeric_limits<int64_t>::max());
  for (const Status& st : {wl.status(), wr.status(), sinks.status(), threads.status(), block.status(), seed.status()})
    ESCALA_RETURN_IF_ERROR(st);
  p.window_left = int32_t(wl->value_or(-1));
  p.window_right = int32_t(wr->value_or(-1));
  p.num_sinks = int32_t(sinks->value_or(0));
  opt.num_threads = int(threads->value_or(0));
  const int32_t page_size = int32_t(block->value_or(0));
  p.causal = a.causal;
  if (a.softcap) {
    auto v = parse_number(*a.softcap, "--softcap");
    if (!v.ok()) return v.status();
    ESCALA_CHECK_ARG(*v >= 0 && *v <= 3.4e38, "--softcap: must be >= 0 (0 turns it off), got {}", *a.softcap);
    p.softcap = float(*v);
  }
  if (a.scale) {
    auto v = parse_number(*a.scale, "--scale");
    if (!v.ok()) return v.status();
    ESCALA_CHECK_ARG(*v != 0 && std::fabs(*v) <= 3.4e38,
                     "--scale: must be non-zero and finite (omit it for 1/sqrt(dim))");
    p.softmax_scale = float(*v);
  }
  std::optional<DType> kv_dtype;
  if (!a.kv_dtype.empty()) {
    kv_dtype = parse_dtype(a.kv_dtype);
    ESCALA_CHECK_ARG(kv_dtype.has_value(), "--kv-dtype: unknown '{}' (f32, f16, bf16, int8 or fp8)", a.kv_dtype);
    ESCALA_CHECK_ARG(*kv_dtype != DType::kFp8E4M3 || page_size > 0,
                     "--kv-dtype fp8 keeps one scale per (page, head), so it needs --block-size > 0");
  }

  auto q = read_tensor(a.q, "Q");
  if (!q.ok()) return q.status();
  auto k = read_tensor(a.k, "K");
  if (!k.ok()) return k.status();
  auto v = read_tensor(a.v, "V");
  if (!v.ok()) return v.status();
  const int64_t total_q = q->shape[0], h = q->shape[1], d = q->shape[2];
  const int64_t total_kv = k->shape[0], h_kv = k->shape[1], dv = v->shape[2];
  ESCALA_CHECK_ARG(k->dtype == v->dtype, "K ({}) and V ({}) must have the same dtype", npy::npy_type_name(k->dtype),
                   npy::npy_type_name(v->dtype));
  ESCALA_CHECK_ARG(v->shape[0] == total_kv, "K has {} tokens but V has {}", total_kv, v->shape[0]);
  ESCALA_CHECK_ARG(v->shape[1] == h_kv, "K has {} heads but V has {}", h_kv, v->shape[1]);
  ESCALA_CHECK_ARG(k->shape[2] == d, "Q has head dim {} but K has {}", d, k->shape[2]);
  ESCALA_CHECK_ARG(h >= 1 && h_kv >= 1 && h % h_kv == 0, "Q's {} heads must be a multiple of K/V's {} heads", h, h_kv);

  auto cu_q = parse_cu_seqlens(a.cu_q, "--cu-seqlens-q", total_q, a.q);
  if (!cu_q.ok()) return cu_q.status();
  auto cu_k = parse_cu_seqlens(a.cu_k, "--cu-seqlens-k", total_kv, a.k);
  if (!cu_k.ok()) return cu_k.status();
  ESCALA_CHECK_ARG(cu_q->size() == cu_k->size(), "--cu-seqlens-q gives {} sequences but --cu-seqlens-k gives {}",
                   cu_q->size() - 1, cu_k->size() - 1);

  std::vector<float> sink_logits;
  if (!a.sink_logits.empty()) {
    auto s = npy::read_npy(a.sink_logits);
    if (!s.ok()) return s.status();
    ESCALA_CHECK_ARG(
        (s->dtype == NpyDType::kF32 || s->dtype == NpyDType::kF16) && s->shape.size() == 1 && s->shape[0] == h,
        "{}: sink logits must be a float32 or float16 array of shape ({},), got {} {}", a.sink_logits, h,
        npy::npy_type_name(s->dtype), s->shape_string());
    for (int64_t i = 0; i < h; ++i) {
      sink_logits.push_back(element(*s, i));
      ESCALA_CHECK_ARG(!std::isnan(sink_logits.back()), "{}: sink logit {} is NaN", a.sink_logits, i);
    }
    p.sink_logits = sink_logits.data();
  }

  // K/V in the requested layout and storage dtype (default: as read).
  const DType kv_dt = kv_dtype.value_or(k->dtype == NpyDType::kF16 ? DType::kF16 : DType::kF32);
  const KvLayout layout = make_layout(*cu_k, page_size, uint64_t(seed->value_or(0)));
  const KvStore ks = store_kv(*k, *cu_k, layout, kv_dt);
  const KvStore vs = store_kv(*v, *cu_k, layout, kv_dt);

  const DType q_dt = q->dtype == NpyDType::kF16 ? DType::kF16 : DType::kF32;
  const size_t o_elems = size_t(total_q * h * dv);
  std::vector<uint8_t> o(std::max<size_t>(o_elems, 1) * dtype_size(q_dt));
  std::vector<float> lse(std::max<size_t>(size_t(total_q * h), 1));
  static const uint8_t kEmpty[16] = {};  // stands in for a 0-token Q, so the pointer is not null
  p.q = q->data.empty() ? kEmpty : q->data.data();
  p.k = ks.data.data();
  p.v = vs.data.data();
  p.o = o.data();
  p.lse = a.lse.empty() ? nullptr : lse.data();
  p.q_dtype = q_dt;
  p.kv_dtype = kv_dt;
  p.o_dtype = q_dt;
  p.q_head_stride = d;
  p.q_row_stride = h * d;
  p.k_head_stride = d;
  p.k_row_stride = h_kv * d;
  p.v_head_stride = dv;
  p.v_row_stride = h_kv * dv;
  p.o_head_stride = dv;
  p.o_row_stride = h * dv;
  p.batch = int32_t(cu_q->size() - 1);
  p.cu_seqlens_q = cu_q->data();
  p.cu_seqlens_k = cu_k->data();
  p.num_heads = int32_t(h);
  p.num_kv_heads = int32_t(h_kv);
  p.head_dim = int32_t(d);
  p.head_dim_v = int32_t(dv);
  if (page_size > 0) {
    p.page_size = page_size;
    p.page_indptr = layout.page_indptr.data();
    p.page_indices =
        layout.page_indices.empty() ? reinterpret_cast<const int32_t*>(kEmpty) : layout.page_indices.data();
    p.k_page_stride = int64_t(page_size) * p.k_row_stride;
    p.v_page_stride = int64_t(page_size) * p.v_row_stride;
  }
  if (is_quantized(kv_dt)) {
    p.k_scale = ks.scale.data();
    p.v_scale = vs.scale.data();
  }
  ESCALA_RETURN_IF_ERROR(attn::validate(p));
  ESCALA_RETURN_IF_ERROR(attn::attention(p, opt));

  // Stage both outputs, then rename: a failure anywhere leaves neither behind.
  NpyArray o_arr;
  o_arr.dtype = q_dt == DType::kF16 ? NpyDType::kF16 : NpyDType::kF32;
  o_arr.shape = {total_q, h, dv};
  o.resize(o_elems * dtype_size(q_dt));
  o_arr.data = std::move(o);
  auto o_staged = npy::stage_npy(a.out, o_arr);
  if (!o_staged.ok()) return o_staged.status();
  std::optional<npy::StagedFile> lse_staged;
  if (!a.lse.empty()) {
    lse.resize(size_t(total_q * h));
    auto st = npy::stage_npy(a.lse, npy::make_f32({total_q, h}, lse));
    if (!st.ok()) return st.status();
    lse_staged = std::move(*st);
  }
  ESCALA_RETURN_IF_ERROR(o_staged->commit());
  if (lse_staged) {
    Status st = lse_staged->commit();
    if (!st.ok()) {
      std::remove(a.out.c_str());  // keep the all-or-nothing promise
      return st;
    }
  }
  return {};
}

}  // namespace

void add_attention_command(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<AttentionArgs>();
  CLI::App* cmd = app.add_subcommand("attention", "Attention over Q, K, V .npy files ([tokens, heads, dim])");
  cmd->add_option("--q", args->q, "queries .npy, float32/float16 [total_q, h, d]")->type_name("FILE");
  cmd->add_option("--k", args->k, "keys .npy, float32/float16 [total_kv, h_kv, d]")->type_name("FILE");
  cmd->add_option("--v", args->v, "values .npy, float32/float16 [total_kv, h_kv, d_v]")->type_name("FILE");
  cmd->add_option("--out", args->out, "output O .npy (dtype of Q) [total_q, h, d_v]")->type_name("FILE");
  cmd->add_option("--lse", args->lse, "also write the log-sum-exp .npy, float32 [total_q, h]")->type_name("FILE");
  cmd->add_flag("--causal", args->causal, "causal mask (diagonal aligned to the end of the keys)");
  cmd->add_option("--window-left", args->window_left, "keys at most N before the query (-1: unbounded)")
      ->type_name("N");
  cmd->add_option("--window-right", args->window_right, "keys at most N after the query (-1: unbounded)")
      ->type_name("N");
  cmd->add_option("--sinks", args->sinks, "the first N keys stay visible whatever the window")->type_name("N");
  cmd->add_option("--sink-logits", args->sink_logits, "per-head learned sink logit .npy, float32 [h]")
      ->type_name("FILE");
  cmd->add_option("--softcap", args->softcap, "soft-cap the scaled scores: cap * tanh(s / cap)")->type_name("X");
  cmd->add_option("--scale", args->scale, "softmax scale (default 1/sqrt(d))")->type_name("X");
  cmd->add_option("--cu-seqlens-q", args->cu_q, "query offsets: int32 .npy or a list like 0,5,12")
      ->type_name("LIST|FILE");
  cmd->add_option("--cu-seqlens-k", args->cu_k, "key offsets: int32 .npy or a list like 0,5,12")
      ->type_name("LIST|FILE");
  cmd->add_option("--impl", args->impl, "reference, flash, decode or auto (default)")->type_name("NAME");
  cmd->add_option("--threads", args->threads, "worker threads (default: all)")->type_name("N");
  cmd->add_option("--block-size", args->block_size, "lay K/V out as randomly permuted pages of N tokens")
      ->type_name("N");
  cmd->add_option("--page-seed", args->page_seed, "seed of the page permutation (default 0)")->type_name("S");
  cmd->add_option("--kv-dtype", args->kv_dtype, "store K/V as f32, f16, bf16, int8 or fp8 (fp8 needs --block-size)")
      ->type_name("DTYPE");
  cmd->callback([args, &exit_code] {
    const Status st = run(*args);
    exit_code = st.ok() ? 0 : report_error(st);
  });
}

}  // namespace escala::cli

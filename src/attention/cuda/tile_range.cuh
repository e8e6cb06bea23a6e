// Which K/V tiles one query tile visits, derived from the one Mask definition (variant.h): the
// sink tiles [0, sink_tiles) and the window tiles [first, end). Fully masked tiles are skipped;
// `tile_fully_visible` says when a visited tile needs no per-element mask.
#pragma once

#include <climits>
#include <cstdint>

#include "attention/variant.h"
#include "common/hd.h"

namespace escala::attn::cuda {

struct TileRange {
  int32_t sink_tiles = 0;  // tiles [0, sink_tiles) hold sink keys below the window
  int32_t first = 0;       // window tiles [first, end)
  int32_t end = 0;

  ESCALA_HD int32_t count() const { return sink_tiles + (end > first ? end - first : 0); }
  // The i-th visited tile, i in [0, count()).
  ESCALA_HD int32_t at(int32_t i) const { return i < sink_tiles ? i : first + (i - sink_tiles); }
  // How many visited tiles have a number below t >= 0 (the index at() gives the first tile >= t).
  ESCALA_HD int32_t count_below(int32_t t) const {
    const int32_t window = end > first ? end - first : 0;
    const int32_t in_window = t - first < window ? t - first : window;
    return (t < sink_tiles ? t : sink_tiles) + (in_window > 0 ? in_window : 0);
  }
};

// Query positions (aligned, i' = i + kv_len - q_len) of the tile are [qp_min, qp_max].
ESCALA_HD TileRange tile_range(const Mask& mask, int64_t qp_min, int64_t qp_max, int64_t kv_len, int32_t bn) {
  TileRange r;
  const int64_t kend = mask.key_end(qp_max, kv_len);
  if (kend <= 0) return r;
  r.end = static_cast<int32_t>((kend + bn - 1) / bn);
  r.first = static_cast<int32_t>(mask.window_begin(qp_min) / bn);
  if (r.first > 0 && mask.num_sinks > 0) {
    const int64_t sink_end = mask.num_sinks < kend ? mask.num_sinks : kend;
    const int32_t st = static_cast<int32_t>((sink_end + bn - 1) / bn);
    if (st >= r.first) {
      r.first = 0;  // sinks and window touch: one range
    } else {
      r.sink_tiles = st;
    }
  }
  return r;
}

// True when every key of [k_lo, k_lo + bn) is visible to every query position in [qp_min, qp_max]
// (a conservative test: false only costs a per-element mask).
ESCALA_HD bool tile_fully_visible(const Mask& mask, int64_t qp_min, int64_t qp_max, int64_t k_lo, int32_t bn,
                                  int64_t kv_len) {
  const int64_t k_hi = k_lo + bn - 1;  // inclusive
  if (k_hi >= kv_len) return false;
  if (mask.causal && k_hi > qp_min) return false;
  const bool window_all = (mask.window_left < 0 || k_lo >= qp_max - mask.window_left) &&
                          (mask.window_right < 0 || k_hi <= qp_min + mask.window_right);
  return window_all || k_hi < mask.num_sinks;
}

// tile_fully_visible for every bn-key tile of one query tile at once, as tile numbers: tile t needs
// no per-element mask iff lo <= t < hi or t < sinks. Computed once per query tile, it turns the
// per-tile test (~25 instructions of 64-bit compares in the sm_90 kernel's loop) into two
// compares. Requires bn > 0; the tile numbers of a sequence (< 2^31 tokens) fit in 32 bits.
struct VisibleTiles {
  int32_t lo = 0, hi = 0, sinks = 0;

  ESCALA_HD bool has(int32_t t) const {
    return static_cast<uint32_t>(t - lo) < static_cast<uint32_t>(hi - lo) || t < sinks;
  }
};

ESCALA_HD int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

ESCALA_HD VisibleTiles visible_tiles(const Mask& mask, int64_t qp_min, int64_t qp_max, int64_t kv_len, int32_t bn) {
  int64_t hi = kv_len / bn;                                          // k_hi < kv_len
  if (mask.causal && floor_div(qp_min + 1, bn) < hi) hi = floor_div(qp_min + 1, bn);  // k_hi <= qp_min
  const int64_t sinks = mask.num_sinks / bn < hi ? mask.num_sinks / bn : hi;          // and k_hi < num_sinks
  if (mask.window_right >= 0 && floor_div(qp_min + mask.window_right + 1, bn) < hi)
    hi = floor_div(qp_min + mask.window_right + 1, bn);  // k_hi <= qp_min + wr
  int64_t lo = mask.window_left >= 0 ? -floor_div(mask.window_left - qp_max, bn) : 0;  // k_lo >= qp_max - wl
  lo = lo < 0 ? 0 : (lo < INT32_MAX ? lo : INT32_MAX);
  VisibleTiles v;
  v.lo = static_cast<int32_t>(lo);
  v.hi = static_cast<int32_t>(hi > lo ? hi : lo);  // empty when hi <= lo
  v.sinks = static_cast<int32_t>(sinks > 0 ? sinks : 0);
  return v;
}

}  // namespace escala::attn::cuda

namespace escala::attn::cuda {

// Mask::visible(q_pos, k) && k < kv_len for one query row, with the bounds hoisted out of the
// per-element loop and narrowed to 32 bits (positions fit: sequences are < 2^31 tokens).
struct RowMask {
  int32_t end;      // keys >= end are invisible (causal and kv_len)
  int32_t win_lo;   // window, inclusive
  int32_t win_hi;
  int32_t sinks;

  ESCALA_HD RowMask(const Mask& m, int64_t q_pos, int64_t kv_len) {
    int64_t e = kv_len;
    if (m.causal && q_pos + 1 < e) e = q_pos + 1;
    end = static_cast<int32_t>(e < 0 ? 0 : e);
    const int64_t lo = m.window_left < 0 ? INT32_MIN : q_pos - m.window_left;
    const int64_t hi = m.window_right < 0 ? INT32_MAX : q_pos + m.window_right;
    win_lo = static_cast<int32_t>(lo < INT32_MIN ? INT32_MIN : lo);
    win_hi = static_cast<int32_t>(hi > INT32_MAX ? INT32_MAX : (hi < INT32_MIN ? INT32_MIN : hi));
    sinks = m.num_sinks;
  }
  ESCALA_HD bool visible(int32_t k) const { return k < end && ((k >= win_lo && k <= win_hi) || k < sinks); }
};

}  // namespace escala::attn::cuda

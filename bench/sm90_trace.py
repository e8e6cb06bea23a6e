#!/usr/bin/env python3
"""Reads the sm_90 prefill kernel's timeline (a build with ESCALA_SM90_TRACE defined, written to
ESCALA_SM90_TRACE_OUT; src/attention/cuda/sm90/trace.cuh) and prints where an item's time goes:
the median SM cycles between consecutive events of each consumer warpgroup, split into the item's
start (up to the first softmax), its key-tile loop (per iteration) and its end (the last P V and
the epilogue), the item's whole length, and how long the loads an item starts with (Q, K0, V0,
K1) took from their issue."""
import argparse
import statistics
import struct
import sys
from collections import defaultdict

CTAS, STREAMS, EVENTS = 4, 4, 8192
NAMES = {1: "item read", 2: "Q ready", 3: "K0 ready", 4: "turn taken", 5: "GEMMs issued",
         6: "Q K landed", 7: "softmax done", 8: "K/V ready", 9: "P V landed", 10: "last P V landed",
         11: "epilogue done", 12: "row factors done", 13: "O staged", 14: "stores fenced",
         20: "loader: item read", 21: "loader: K issued", 22: "loader: V issued",
         30: "sched: claimed", 31: "sched: published", 32: "sched: Q issued"}


def streams(path):
    raw = open(path, "rb").read()
    vals = struct.unpack(f"<{len(raw) // 8}Q", raw)
    for c in range(CTAS):
        for s in range(STREAMS):
            ev = vals[(c * STREAMS + s) * EVENTS:(c * STREAMS + s + 1) * EVENTS]
            yield c, s, [(v >> 56, v & ((1 << 56) - 1)) for v in ev if v]


def items(ev):
    cur = []
    for code, t in ev:
        if code == 1 and cur:
            yield cur
            cur = []
        cur.append((code, t))
    if cur:
        yield cur


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("trace")
    ap.add_argument("--skip", type=int, default=2, help="items skipped at each stream's start")
    a = ap.parse_args()
    start, loop, end = defaultdict(list), defaultdict(list), defaultdict(list)
    by_wg = defaultdict(list)  # (pair, stream) -> loop durations: the two warpgroups' differ
    length, tiles, offsets = [], [], []
    wg_first_turn = {}
    recorded = list(streams(a.trace))
    for c, s, ev in recorded:
        if s not in (1, 2):
            continue
        its = list(items(ev))
        for k, it in enumerate(its[a.skip:-1], start=a.skip):
            nxt = its[k + 1][0][1]
            length.append(nxt - it[0][1])
            codes = [x[0] for x in it]
            first_loop = codes.index(8) if 8 in codes else len(it)
            last_8 = len(codes) - 1 - codes[::-1].index(8) if 8 in codes else len(it)  # no key tiles
            tiles.append(codes.count(8))
            for j in range(1, len(it)):
                pair = (it[j - 1][0], it[j][0])
                d = it[j][1] - it[j - 1][1]
                section = start if j <= first_loop else end if j > last_8 else loop
                section[pair].append(d)
                if section is loop:
                    by_wg[(pair, s)].append(d)
            end[(it[-1][0], 1)].append(nxt - it[-1][1])
            wg_first_turn[(c, s, k)] = it[codes.index(4)][1] if 4 in codes else None
    for (c, s, k), t in wg_first_turn.items():
        if s == 1 and (c, 2, k) in wg_first_turn and t is not None and wg_first_turn[(c, 2, k)] is not None:
            offsets.append(wg_first_turn[(c, 2, k)] - t)
    med = statistics.median
    print(f"items {len(length)}, key tiles per item {med(tiles) if tiles else 0}, "
          f"item length median {med(length):.0f} cycles")
    for title, d in (("start", start), ("loop (per tile)", loop), ("end", end)):
        print(f"-- {title}")
        tot = 0
        for pair, v in d.items():
            m = med(v)
            n = len(v) / max(1, len(length))
            tot += m * n
            wgs = ""
            if d is loop:  # per warpgroup: a median over both can fall between two modes
                wgs = "  (wg0 / wg1 " + " / ".join(f"{med(by_wg[(pair, s)]):.0f}" if by_wg[(pair, s)] else "-"
                                                    for s in (1, 2)) + ")"
            print(f"  {NAMES.get(pair[0], pair[0]):>16} -> {NAMES.get(pair[1], pair[1]):<16} {m:8.0f}  x{n:.1f}{wgs}")
        print(f"  {'sum (median x count)':>34} {tot:8.0f}")
    if offsets:
        print(f"warpgroup 1's first turn after warpgroup 0's: median {med(offsets):.0f} cycles")
    loads(recorded, a.skip)


def loads(recorded, skip):
    """The loads at an item's start, from the scheduler's and the loader's stamps against consumer
    warpgroup 0's: when each was issued and how long after that the consumer found it ready (Q at
    "Q ready", K0 at "K0 ready", V0 and K1 at the loop's first "K/V ready": an upper bound, the
    time the consumer looked)."""
    rows = defaultdict(list)
    per_cta = defaultdict(dict)
    for c, s, ev in recorded:
        per_cta[c][s] = ev
    for c, st in per_cta.items():
        loader, cons, sched = st.get(0, []), st.get(1, []), st.get(3, [])
        litems = []
        for code, t in loader:
            if code == 20:
                litems.append({"K": [], "V": []})
            elif code in (21, 22) and litems:
                litems[-1]["K" if code == 21 else "V"].append(t)
        q_issued = [t for code, t in sched if code == 32]
        citems = list(items(cons))
        for k in range(skip, min(len(litems), len(citems), len(q_issued)) - 1):
            ev, li = citems[k], litems[k]
            first = {}
            for code, t in ev:
                first.setdefault(code, t)
            if not {2, 3, 8} <= first.keys() or len(li["K"]) < 2 or not li["V"]:
                continue
            read = ev[0][1]
            rows["Q: issued before item read"].append(read - q_issued[k])
            rows["Q: issue -> ready"].append(first[2] - q_issued[k])
            rows["K0: issue -> ready"].append(first[3] - li["K"][0])
            rows["V0: issued before item read"].append(read - li["V"][0])
            rows["V0: issue -> first loop K/V ready"].append(first[8] - li["V"][0])
            rows["K1: issued before item read"].append(read - li["K"][1])
            rows["K1: issue -> first loop K/V ready"].append(first[8] - li["K"][1])
    if rows:
        print("-- loads at an item's start (warpgroup 0), cycles: median [p10, p90]")
        for name, v in rows.items():
            v = sorted(v)
            print(f"  {name:<36} {statistics.median(v):8.0f}  [{v[len(v) // 10]:.0f}, {v[9 * len(v) // 10]:.0f}]")


if __name__ == "__main__":
    sys.exit(main())

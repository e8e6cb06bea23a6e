#!/usr/bin/env python3
"""bench/sm90_trace.py on a synthetic timeline (the layout trace.cuh writes: per CTA and stream a
row of 8192 little-endian u64, code << 56 | clock): the medians it prints must be the gaps the
file was built with, for the item's start, its loop (also per warpgroup) and its end, the second
warpgroup's offset, and the loads' issue-to-ready times.
Usage: test_sm90_trace.py PROJECT_SOURCE_DIR (no GPU)."""
import os
import struct
import subprocess
import sys
import tempfile

CTAS, STREAMS, EVENTS = 4, 4, 8192
TILES, ITEMS, ITEM_LEN = 3, 8, 20000
# (code, cycles after the previous event) for one consumer item of TILES key tiles.
START = [(1, 0), (2, 400), (3, 80), (4, 60), (5, 190), (6, 480), (7, 1200)]
LOOP = [(8, 450), (4, 60), (5, 790), (6, 95), (7, 1460), (9, 93)]
# The second warpgroup's loop: a shorter softmax, a longer wait for P V (the same tile length).
LOOP_WG2 = [(8, 450), (4, 60), (5, 790), (6, 95), (7, 1160), (9, 393)]
END = [(8, 390), (4, 46), (5, 204), (10, 520), (12, 300), (13, 400), (14, 250), (11, 400)]


def build(path):
    rows = [[0] * EVENTS for _ in range(CTAS * STREAMS)]

    def put(cta, stream, events):
        row = rows[cta * STREAMS + stream]
        for n, (code, t) in enumerate(events):
            row[n] = code << 56 | t

    for cta in range(CTAS):
        for wg, shift in ((1, 0), (2, 900)):
            ev = []
            for k in range(ITEMS):
                t = 10000 + k * ITEM_LEN + shift
                body = START + (LOOP if wg == 1 else LOOP_WG2) * (TILES - 1) + END
                for code, dt in body:
                    t += dt
                    ev.append((code, t))
            put(cta, wg, ev)
        loader, sched = [], []
        for k in range(ITEMS):
            read = 10000 + k * ITEM_LEN  # warpgroup 0's item read
            # Q issued 2800 before the read (START has it ready 400 after: 3200 from its issue).
            sched += [(30, read - 3000), (31, read - 2950), (32, read - 2800)]
            # K0, V0, K1, V1 issued 2400, 1300, 1000, 500 before the read.
            loader += [(20, read - 3500), (21, read - 2400), (22, read - 1300), (21, read - 1000), (22, read - 500)]
        put(cta, 0, sorted(loader, key=lambda e: e[1]))
        put(cta, 3, sorted(sched, key=lambda e: e[1]))
    with open(path, "wb") as f:
        for row in rows:
            f.write(struct.pack(f"<{EVENTS}Q", *row))


def main():
    src = sys.argv[1]
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.bin")
        build(path)
        out = subprocess.run([sys.executable, os.path.join(src, "bench", "sm90_trace.py"), path],
                             capture_output=True, text=True, check=True).stdout
    # Every section's pairs as (median, count per item), worked out from START, LOOP (LOOP_WG2) and
    # END: the loop's last "P V landed -> K/V ready" is the step into the end's K/V wait (390), so
    # that pair's median is (450 + 390) / 2; where the warpgroups differ, the median over both is
    # the mean of their two values.
    body = sum(dt for _, dt in START + LOOP * (TILES - 1) + END)
    want = {
        "start": {"item read -> Q ready": (400, 1), "Q ready -> K0 ready": (80, 1),
                  "K0 ready -> turn taken": (60, 1), "turn taken -> GEMMs issued": (190, 1),
                  "GEMMs issued -> Q K landed": (480, 1), "Q K landed -> softmax done": (1200, 1),
                  "softmax done -> K/V ready": (450, 1)},
        "loop (per tile)": {"K/V ready -> turn taken": (60, 2), "turn taken -> GEMMs issued": (790, 2),
                            "GEMMs issued -> Q K landed": (95, 2), "Q K landed -> softmax done": (1310, 2),
                            "softmax done -> P V landed": (243, 2), "P V landed -> K/V ready": (420, 2)},
        "end": {"K/V ready -> turn taken": (46, 1), "turn taken -> GEMMs issued": (204, 1),
                "GEMMs issued -> last P V landed": (520, 1), "last P V landed -> row factors done": (300, 1),
                "row factors done -> O staged": (400, 1), "O staged -> stores fenced": (250, 1),
                "stores fenced -> epilogue done": (400, 1),
                "epilogue done -> item read": (ITEM_LEN - body, 1)},
    }
    got, section, per_wg = {}, None, {}
    for line in out.splitlines():
        if line.startswith("-- ") and "loads" not in line:
            section = line[3:]
            got[section] = {}
        elif line.startswith("-- "):
            section = "loads"
            got[section] = {}
        elif section and "->" in line and section != "loads":
            line, _, wgs = line.partition("(wg0 / wg1 ")
            left, right = line.split("->")
            fields = right.split()
            key = f"{left.strip()} -> {' '.join(fields[:-2])}"
            if wgs:
                per_wg[key] = tuple(int(x) for x in wgs.rstrip(")").split(" / "))
            got[section][key] = (int(fields[-2]), float(fields[-1][1:]))
        elif section == "loads" and ":" in line:
            name, rest = line.split(":", 1)
            words = rest.split()
            value_at = next(i for i, w in enumerate(words) if w.lstrip("-").isdigit())
            got[section][f"{name.strip()}: {' '.join(words[:value_at])}"] = int(words[value_at])
    want["loads"] = {
        "Q: issued before item read": 2800, "Q: issue -> ready": 3200,
        "K0: issue -> ready": 2880,  # K0 ready 400 + 80 after the read, issued 2400 before it
        "V0: issued before item read": 1300, "V0: issue -> first loop K/V ready": 1300 + 400 + 80 + 60 + 190 + 480 + 1200 + 450,
        "K1: issued before item read": 1000, "K1: issue -> first loop K/V ready": 1000 + 400 + 80 + 60 + 190 + 480 + 1200 + 450,
    }
    ok = True
    for sec, pairs_want in want.items():
        g = got.get(sec, {})
        for key, value in pairs_want.items():
            if g.get(key) != value:
                print(f"{sec}: {key}: want {value}, got {g.get(key)}")
                ok = False
    for key, value in {"Q K landed -> softmax done": (1460, 1160), "softmax done -> P V landed": (93, 393),
                       "turn taken -> GEMMs issued": (790, 790)}.items():
        if per_wg.get(key) != value:
            print(f"per warpgroup: {key}: want {value}, got {per_wg.get(key)}")
            ok = False
    if "item length median 20000" not in out or "key tiles per item 3" not in out:
        print("item length / tiles wrong"); ok = False
    if "first turn after warpgroup 0's: median 900" not in out:
        print("warpgroup offset wrong"); ok = False
    if not ok:
        print(out)
        return 1
    print("sm90_trace.py reproduced the synthetic timeline's gaps")
    return 0


if __name__ == "__main__":
    sys.exit(main())

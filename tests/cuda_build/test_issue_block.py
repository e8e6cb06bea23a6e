#!/usr/bin/env python3
"""bench/ptxas_report.py's issue_block on synthetic SASS: it must take the key-tile loop (the
innermost predicated backward branch around wgmma), not a larger wgmma block at the item boundary
or a barrier-retry stub's jump back, and count the R2UR in that loop's wait-and-issue block; and
loop_range's instructions (what --loop-dir writes) must be that loop's, with register and
predicate numbers and control-flow targets (branches, reconvergence points) blanked.
Usage: test_issue_block.py PROJECT_SOURCE_DIR (no GPU, no cuobjdump)."""
import os
import sys


def sass(body):
    """cuobjdump-like text for one kernel from (opcode text) lines, 16 bytes each."""
    lines = [f"        /*{16 * i:04x}*/                   {op} ;" for i, op in enumerate(body)]
    return "\n\tFunction : k\n" + "\n".join(lines) + "\n"


def kernel(loop_r2ur):
    """An item loop holding a tile loop of 16 wgmma (with loop_r2ur R2UR before them), then an item
    boundary of 24 wgmma with 12 R2UR, then a retry stub jumping back into the boundary."""
    body = ["MOV R1, R2"] * 4                              # 0-3
    item_head = len(body)
    body += ["SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R4"]  # Q
    tile_head = len(body)
    body += ["SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4+0x10], R4",  # K tile i
             "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4+0x30], R4"]  # V tile i-1
    body += ["R2UR UR8, R8"] * loop_r2ur
    body += ["HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], R24"] * 16
    body += ["FMUL R1, R1, R2"] * 20
    body += [f"BSSY B0, 0x{16 * (len(body) + 2):x}", "FMUL R1, R1, R2"]  # a reconvergence point
    body += [f"@!P0 BRA 0x{16 * tile_head:x}"]               # the tile loop's latch
    boundary_wait = len(body)
    body += ["SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4+0x40], R4"]
    body += ["R2UR UR9, R9"] * 12
    body += ["HGMMA.64x128x16.F32.BF16 R88, R180, gdesc[UR9].tnspB, R88"] * 24
    body += [f"BRA 0x{16 * item_head:x}"]                   # the item loop (unconditional)
    body += ["EXIT"]
    body += ["SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4+0x40], R4", f"BRA 0x{16 * boundary_wait:x}"]  # stub
    return sass(body)


def main():
    sys.path.insert(0, os.path.join(sys.argv[1], "bench"))
    from ptxas_report import issue_block, kernel_ops, loop_range

    failures = []
    for loop_r2ur in (0, 5):
        (ops, back, text), = kernel_ops(kernel(loop_r2ur)).values()
        length, r2ur = issue_block(ops, back)
        want = (2 + loop_r2ur + 16, loop_r2ur)  # the two waits, the R2UR, the 16 wgmma
        if (length, r2ur) != want:
            failures.append(f"loop with {loop_r2ur} R2UR: issue_block gave {(length, r2ur)}, want {want}")
        # The tile loop runs from K tile i's wait (index 5) to its latch.
        lo, hi = loop_range(ops, back)
        want_range = (5, 5 + 2 + loop_r2ur + 16 + 22)
        if (lo, hi) != want_range:
            failures.append(f"loop with {loop_r2ur} R2UR: loop_range gave {(lo, hi)}, want {want_range}")
        loop = text[lo : hi + 1]
        want_ends = ("SYNCS.PHASECHK.TRANS64.TRYWAIT P, [R+0x10], R", "@!P BRA")
        if (loop[0], loop[-1]) != want_ends:
            failures.append(f"loop text ends {(loop[0], loop[-1])}, want {want_ends}")
        if "BSSY B0," not in loop:  # its target is an address that moves with any code before it
            failures.append(f"the loop's BSSY target not blanked: {[t for t in loop if t.startswith('BSSY')]}")
    for f in failures:
        print("FAIL:", f)
    if not failures:
        print("ok: the tile loop is found by its latch (the boundary and the retry stub are not taken for it), "
              "its text blanked")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The compiler's report on the CUDA kernels, without a GPU: for every kernel of the chosen source
files, its registers and spill bytes (ptxas -v), and with --sass how many spill instructions
(STL / LDL) sit between its first and last wgmma, i.e. in the consumers' loop rather than in the
per-item code or the producer, and how long the key-tile loop's wait-and-issue block is, with
how many R2UR in it (non-zero: the compiler moved the wgmma descriptors out of uniform
registers). docs/cuda_notes.md's "Compiler report" table is made from it.

Usage (from the repository root, after a CUDA build that wrote compile_commands.json):
  python3 bench/ptxas_report.py [--build build-cuda] [--sass] [--filter REGEX] FILE.cu ...
e.g. python3 bench/ptxas_report.py --sass fwd_sm90_hd128.cu fwd_sm90_hd256.cu
With --loop-dir DIR each kernel's key-tile loop goes to a file, registers and control-flow targets
blanked: `diff -r` of two builds' folders shows whether a change re-scheduled the loop. --sass also
gives the loop's first byte and that offset mod 128: with the loop's code unchanged, where it starts
moved the long shapes by up to 1.5% (docs/cuda_notes.md, step 157). --nvcc-flags adds flags to both
compiles, e.g. --nvcc-flags=-DESCALA_SM90_LOOP_PAD=2 (written with "=", as the value starts with
"-"): two 16-byte instructions before the sm_90 kernels' loops (src/attention/cuda/sm90/
fwd_kernel.cuh), to find the pad that puts a build's loop where another's is.

Each file is compiled once for sm_90a alone (its compile_commands.json line, other targets
dropped); --sass compiles it once more to a cubin for cuobjdump (PyPI's nvidia-cuda-cuobjdump
wheel has it, and it needs nvdisasm: nvidia-cuda-nvdisasm, if the CUDA install has neither).
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile


def sass_text(cuobjdump, path, *args):
    """cuobjdump -sass of `path`, or (None, its last error line). cuobjdump runs nvdisasm, looked up
    on the PATH: the folder of cuobjdump goes first (the wheels put both there). A failed run must
    not pass as empty SASS, which reads as zero counts."""
    env = dict(os.environ, PATH=os.path.dirname(cuobjdump) + os.pathsep + os.environ.get("PATH", ""))
    r = subprocess.run([cuobjdump, "-sass", *args, path], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        return None, (r.stderr.strip().splitlines() or ["no message"])[-1]
    return r.stdout, None


def sm90_command(entry, out, extra):
    cmd = entry["command"]
    cmd = cmd[: cmd.index(" -o ")]
    cmd = re.sub(r"--generate-code=arch=compute_\d+a?,code=\[[^\]]*\]", "", cmd)
    return f"{cmd} --generate-code=arch=compute_90a,code=[sm_90a] {extra} -o {out}"


def short_name(mangled):
    """The template arguments that tell kernels apart, from a mangled name."""
    demangled = subprocess.run(["c++filt", mangled], capture_output=True, text=True).stdout.strip() or mangled
    demangled = demangled.replace("escala::attn::cuda::", "")
    return re.sub(r"\(.*\)$", "", demangled)


def ptxas_info(entry, tmp, flags=""):
    out = os.path.join(tmp, "x.o")
    r = subprocess.run(sm90_command(entry, out, f"{flags} -Xptxas -v"), shell=True, cwd=entry["directory"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(r.stderr[-3000:])
    rows, name = {}, None
    for line in r.stderr.splitlines():
        m = re.search(r"Compiling entry function '(\w+)' for 'sm_90a'", line)
        if m:
            name = m.group(1)
            continue
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and name:
            rows.setdefault(name, {})["spills"] = (int(m.group(1)), int(m.group(2)))
        m = re.search(r"Used (\d+) registers", line)
        if m and name:
            rows.setdefault(name, {})["regs"] = int(m.group(1))
    return rows


def spills_in_wgmma_range(entry, tmp, flags=""):
    """Per kernel: (spill instructions, those inside the wgmma range, issue block length, its R2UR,
    the key-tile loop's first byte or -1), and the loop's blanked text."""
    cubin = os.path.join(tmp, "x.cubin")
    cmd = sm90_command(entry, cubin, f"{flags} -cubin").replace(" -c ", " ")
    r = subprocess.run(cmd, shell=True, cwd=entry["directory"], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(r.stderr[-3000:])
    sass, error = sass_text(shutil.which("cuobjdump"), cubin)
    if sass is None:
        sys.exit(f"cuobjdump -sass failed: {error}")
    result, loops = {}, {}
    for name, (ops, back, text) in kernel_ops(sass).items():
        gmma = [i for i, op in enumerate(ops) if op.startswith("HGMMA")]
        spill = [i for i, op in enumerate(ops) if op.startswith(("STL", "LDL"))]
        inside = [i for i in spill if gmma and gmma[0] <= i <= gmma[-1]]
        latch = loop_range(ops, back)
        result[name] = (len(spill), len(inside)) + issue_block(ops, back) + (16 * latch[0] if latch else -1,)
        loops[name] = text[latch[0] : latch[1] + 1] if latch else []
    return result, loops


def kernel_ops(sass):
    """cuobjdump -sass text -> {mangled kernel name: (its opcodes in order, predicates dropped; its
    predicated backward branches as (target index, branch index) pairs: loop latches (the
    unconditional ones are an endless loop's or a barrier-retry stub's jump back); and each
    instruction whole with its register and predicate numbers and control-flow targets blanked, so
    that two builds' schedules can be diffed). Instructions are 16 bytes; a branch's target is the
    kernel-relative byte offset after BRA."""
    kernels = {}
    insn = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")
    for block in re.split(r"\n\s*Function : ", sass)[1:]:
        name = block.split("\n", 1)[0].strip()
        ops, back, text = [], [], []
        for m in insn.finditer(block):
            i = int(m.group(1), 16) // 16
            ops.append(m.group(3))
            target = re.match(r"\s*0x([0-9a-f]+)", m.group(4)) if m.group(3).startswith("BRA") else None
            if m.group(2) and target and int(target.group(1), 16) // 16 <= i:
                back.append((int(target.group(1), 16) // 16, i))
            whole = (m.group(2) or "") + m.group(3) + m.group(4)
            whole = re.sub(r"\bU?P[0-6T]\b", "P", re.sub(r"\bU?R(\d+|Z)\b(\.reuse)?", "R", whole))
            # Every control-flow target (BRA with or without a predicate operand, BSSY's
            # reconvergence point, CALL): an absolute address that moves with any code before it.
            jumps = m.group(3).startswith(("BRA", "BSSY", "CALL", "JMP"))
            text.append((re.sub(r"\b0x[0-9a-f]+$", "", whole.rstrip()) if jumps else whole).rstrip())
        kernels[name] = (ops, back, text)
    return kernels


def loop_range(ops, back):
    """The key-tile loop as (first, last) instruction index: the innermost predicated backward
    branch around wgmma (so an item boundary with more wgmma than the loop, as a cross-item
    overlap has, is not taken for it); None where no such branch exists."""
    gmma = [i for i, op in enumerate(ops) if op.startswith("HGMMA")]
    loops = [(lo, hi) for lo, hi in back if any(lo <= i <= hi for i in gmma)]
    return min(loops, key=lambda r: r[1] - r[0]) if loops else None


def issue_block(ops, back):
    """The key-tile loop's wait-and-issue block: from the first of the two mbarrier waits (K tile i,
    V tile i-1) before the loop's first wgmma to its last wgmma. The loop is loop_range's, else
    the largest cluster of wgmma. Returns the block's instruction count and its R2UR count: a
    non-zero R2UR count means the compiler keeps the wgmma descriptors or ring counters in
    per-thread registers (it lost their uniformity), which cost 2-14% where it happened
    (docs/cuda_notes.md, step 74)."""
    gmma = [i for i, op in enumerate(ops) if op.startswith("HGMMA")]
    if not gmma:
        return (0, 0)
    latch = loop_range(ops, back)
    if latch:
        loop = [i for i in gmma if latch[0] <= i <= latch[1]]
    else:
        clusters = [[gmma[0]]]
        for i in gmma[1:]:
            if i - clusters[-1][-1] < 400:
                clusters[-1].append(i)
            else:
                clusters.append([i])
        loop = max(clusters, key=len)
    waits = [i for i in range(loop[0]) if ops[i].startswith("SYNCS.PHASECHK")]
    start = waits[-2] if len(waits) >= 2 else 0
    block = ops[start : loop[-1] + 1]
    return (len(block), sum(op.startswith("R2UR") for op in block))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", help="source file names (suffix match against compile_commands.json)")
    ap.add_argument("--build", default="build-cuda", help="the CUDA build directory")
    ap.add_argument("--sass", action="store_true", help="also count spill instructions inside the wgmma range")
    ap.add_argument("--filter", default="", help="only kernels whose demangled name matches this regex")
    ap.add_argument("--nvcc-flags", default="", help="extra nvcc flags for both compiles, as --nvcc-flags=-DNAME=VALUE")
    ap.add_argument("--loop-dir", help="with --sass: write each kernel's key-tile loop, registers and targets "
                                       "blanked, to DIR/<kernel>.sass, for `diff -r` against another build's "
                                       "(a change outside the loop can re-schedule it: cuda_notes step 152)")
    args = ap.parse_args()
    entries = json.load(open(os.path.join(args.build, "compile_commands.json")))
    if args.loop_dir and not args.sass:
        sys.exit("--loop-dir needs --sass")
    if args.loop_dir:
        os.makedirs(args.loop_dir, exist_ok=True)
    if args.sass and shutil.which("cuobjdump") is None:
        sys.exit("--sass needs cuobjdump on the PATH")
    print("| kernel | registers | spill stores / loads (bytes) |"
          + (" spill instructions (in wgmma range) | loop issue block (R2UR) | loop start (mod 128) |"
             if args.sass else ""))
    print("|---|---|---|" + ("---|---|---|" if args.sass else ""))
    for f in args.files:
        matches = [e for e in entries if e["file"].endswith(f)]
        if not matches:
            sys.exit(f"{f}: not in {args.build}/compile_commands.json")
        with tempfile.TemporaryDirectory() as tmp:
            info = ptxas_info(matches[0], tmp, args.nvcc_flags)
            sass, loops = spills_in_wgmma_range(matches[0], tmp, args.nvcc_flags) if args.sass else ({}, {})
        for mangled, row in info.items():
            name = short_name(mangled)
            if args.filter and not re.search(args.filter, name):
                continue
            stores, loads = row.get("spills", (0, 0))
            line = f"| `{name}` | {row.get('regs', '?')} | {stores} / {loads} |"
            if args.sass:
                total, inside, block, r2ur, start = sass.get(mangled, (0, 0, 0, 0, -1))
                where = f"0x{start:x} ({start % 128})" if start >= 0 else "-"
                line += f" {total} ({inside}) | {block} ({r2ur}) | {where} |"
                if args.loop_dir:
                    path = os.path.join(args.loop_dir, re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_") + ".sass")
                    with open(path, "w") as f:
                        f.write("\n".join(loops.get(mangled, [])) + "\n")
            print(line)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Checks that the sm_90a prefill kernels keep their key-tile loop in uniform registers.

The compiler can stop treating the loop's ring counters and wgmma descriptors as warp-uniform
after an unrelated change (a divergent store in the epilogue was enough) and then puts an R2UR
before each use: the kernel stays correct and 2-14% slower (docs/cuda_notes.md, step 74), which
only a GPU would show. This reads the SASS of the built sm_90 objects (no GPU) and compares each
kernel's R2UR count in its loop's wait-and-issue block (bench/ptxas_report.py's issue_block) with
the budget below. A kernel over its budget fails; one under it says so, so the budget can drop.

Usage: check_loop_uniform.py LIBESCALA_CUDA_A SOURCE_DIR
Exits 77 (skipped) without cuobjdump or the nvdisasm it runs (scripts/setup.sh installs PyPI's
nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm on machines with nvcc) or without sm_90a code in the
library.
"""
import glob
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile

# R2UR allowed in the issue block, by kernel (matched against the demangled name's config, element
# type aside). The dense d_qk = d_v >= 192 kernels keep the per-thread forms on purpose (the uniform
# ones raised their per-item spills: session 15), and the paged d = 256 kernel has not been brought
# to zero yet. The kernel's flags: paged/split, then sinks and soft-cap (false: d = 128's plain
# instantiation).
BUDGET = [
    (r"Sm90Config<\w+, 64, 64, 128, 2, [23]>, false(, (true|false))?>", 0),
    (r"Sm90Config<\w+, 64, 64, 128, 2, 2>, true(, (true|false))?>", 0),
    (r"Sm90Config<\w+, 128, 128, 128, 2, 2>, (false|true)(, (true|false))?>", 0),
    (r"Sm90Config<\w+, 192, 128, 128, 2, 2>, false(, (true|false))?>", 0),
    (r"Sm90Config<\w+, 192, 192, 112, 2, 2>, false(, (true|false))?>", 25),
    (r"Sm90Config<\w+, 256, 256, (64|80), 2, 2>, false(, (true|false))?>", 33),
    (r"Sm90Config<\w+, 256, 256, 80, 2, 2>, true(, (true|false))?>", 52),
]


def find_cuobjdump():
    found = shutil.which("cuobjdump")
    if found:
        return found
    # PyPI's nvidia-cuda-cuobjdump wheel puts it under site-packages/nvidia/cu*/bin.
    for site in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}:
        hits = sorted(glob.glob(os.path.join(site, "nvidia", "*", "bin", "cuobjdump")))
        if hits:
            return hits[-1]
    return None


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    library, source_dir = sys.argv[1], sys.argv[2]
    sys.path.insert(0, os.path.join(source_dir, "bench"))
    from ptxas_report import issue_block, kernel_ops, sass_text, short_name  # the report's parsing and names

    cuobjdump = find_cuobjdump()
    if cuobjdump is None:
        print("SKIPPED: no cuobjdump (pip install nvidia-cuda-cuobjdump)")
        sys.exit(77)
    members = subprocess.run(["ar", "t", library], capture_output=True, text=True, check=True).stdout.split()
    members = [m for m in members if re.match(r"fwd_sm90_hd\w*\.cu\.o$", m)]
    if not members:
        sys.exit(f"FAIL: no fwd_sm90_hd*.cu.o in {library}")
    kernels = {}
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["ar", "x", os.path.abspath(library)] + members, cwd=tmp, check=True)
        for m in members:
            sass, error = sass_text(cuobjdump, os.path.join(tmp, m), "-arch", "sm_90a")
            if sass is None:
                print(f"SKIPPED: cuobjdump -sass failed ({error}; pip install nvidia-cuda-nvdisasm)")
                sys.exit(77)
            for mangled, (ops, back, _) in kernel_ops(sass).items():
                if "fwd_sm90_kernel" in mangled:
                    kernels[mangled] = issue_block(ops, back)
    if not kernels:
        print("SKIPPED: no sm_90a kernels in the library (CMAKE_CUDA_ARCHITECTURES without 90a)")
        sys.exit(77)
    failed = False
    for mangled, (length, r2ur) in kernels.items():
        short = short_name(mangled)
        budget = next((b for pattern, b in BUDGET if re.search(pattern, short)), None)
        if budget is None:
            print(f"FAIL: {short}: no budget for this kernel (add it to BUDGET)")
            failed = True
        elif r2ur > budget:
            print(f"FAIL: {short}: {r2ur} R2UR in its loop's issue block ({length} instructions), budget {budget}")
            failed = True
        else:
            note = f" (under its budget {budget}: lower it)" if r2ur < budget else ""
            print(f"ok: {short}: {r2ur} R2UR, {length} instructions{note}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

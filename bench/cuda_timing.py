"""CUDA-event timing shared by the GPU benchmark scripts: the same protocol as the Escala side's
(tests/gpu/bench_timing.h), so that both sides of a ratio are timed alike:
- a warm-up of at least `warmup_s` seconds of calls, so that each shape is timed at the clocks its
  own load settles to (the H200's power controller keeps a heavy predecessor's lower clocks for a
  few hundred ms);
- samples of `inner` back-to-back calls replayed from one CUDA graph, so that the host's launch
  cost (~60 us per SDPA call on the 2026-11-30 machine) never sits between calls. A callable that
  cannot be captured is timed launched from the host, and `last_mode()` says so."""
import statistics
import time

_mode = "graph"


def add_timing_args(ap):
    """The timing flags every GPU benchmark script takes (both sides use them)."""
    ap.add_argument("--eager", action="store_true",
                    help="launch every timed call from the host instead of replaying a CUDA graph (both sides)")
    ap.add_argument("--warmup", type=float, default=0.25,
                    help="seconds of calls before each shape's samples (both sides), so that clocks settle")
    ap.add_argument("--inner", type=int, default=10, help="calls per sample (both sides)")


def binary_flags(args):
    """The same timing as escala_gpu_tests flags (tests/gpu/bench_timing.h)."""
    return (["--eager"] if args.eager else []) + ["--warmup", str(args.warmup), "--inner", str(args.inner)]


def timing_kwargs(args):
    """The same timing as time_cuda's keyword arguments."""
    return {"inner": args.inner, "warmup_s": args.warmup, "graph": not args.eager}


def describe(args):
    """How the samples were taken, for a table's header."""
    how = "host-launched" if args.eager else "CUDA-graph"
    return f"{how} samples of {args.inner} calls after {args.warmup:g} s of warm-up"


def last_mode():
    """'graph' or 'eager': how the last time_cuda call launched its samples."""
    return _mode


def time_cuda(fn, reps, inner=10, warmup_s=0.25, graph=True):
    """Median over `reps` samples of the milliseconds per call of `fn`."""
    global _mode
    import torch
    start, calls = time.perf_counter(), 0
    while calls < 3 or time.perf_counter() - start < warmup_s:
        for _ in range(inner):
            fn()
        calls += inner
        torch.cuda.synchronize()

    def eager():
        for _ in range(inner):
            fn()

    run, _mode = eager, "eager"
    if graph:
        try:
            g = torch.cuda.CUDAGraph()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                fn()  # the side stream's first call: allocator and library state outside the capture
            torch.cuda.current_stream().wait_stream(side)
            with torch.cuda.graph(g):
                for _ in range(inner):
                    fn()
            g.replay()
            torch.cuda.synchronize()
            run, _mode = g.replay, "graph"
        except Exception:  # not capturable: keep the host-launched samples
            torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        run()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / inner)
    return statistics.median(times)

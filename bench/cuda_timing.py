"""CUDA-event timing shared by the GPU benchmark scripts."""
import statistics


def time_cuda(fn, reps, inner=1):
    """Median over `reps` samples of the milliseconds per call; each sample times `inner`
    back-to-back calls with CUDA events, after 3 warm-up calls."""
    import torch
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(inner):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / inner)
    return statistics.median(times)

"""Timing, bandwidth and workload helpers shared by the benchmark scripts."""

from __future__ import annotations

import glob
import os
import platform
import statistics
import time
from collections.abc import Callable

import torch

# 2 threads is this project's reference machine; override with --threads.
DEFAULT_THREADS = 2


def machine_line(threads: int) -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    import inductor_lamb

    return (f"{cpu}; {os.cpu_count()} logical CPUs; caches {cache_sizes()}; {threads} torch threads; "
            f"torch {torch.__version__}; kernels: {inductor_lamb.cpu_capability()}")


def cache_sizes() -> str:
    """CPU 0's data and unified caches as the kernel reports them (a VM's may be its host's)."""
    out = []
    for index in sorted(glob.glob("/sys/devices/system/cpu/cpu0/cache/index*")):
        try:
            kind = open(f"{index}/type").read().strip()
            if kind in ("Data", "Unified"):
                out.append(f"L{open(f'{index}/level').read().strip()} {open(f'{index}/size').read().strip()}")
        except OSError:
            continue
    return ", ".join(out) or "unknown"


def bench(fn: Callable[[], object], min_time: float = 0.3, warmup: int = 3, max_iters: int = 200) -> float:
    """Median seconds per call over repeats filling about ``min_time``."""
    for _ in range(warmup):
        fn()
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-6)
    iters = int(min(max_iters, max(5, min_time / one)))
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def median_seconds(fn: Callable[[], object], sync: Callable[[], None], iters: int) -> float:
    """The median of ``iters`` timed calls of ``fn``, each followed by ``sync()`` (a device's)."""
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def stream_bandwidth(numel: int = 1 << 25) -> dict[str, float]:
    """STREAM-like bandwidth (GB/s) with torch ops on this many float32s (128 MiB arrays).

    copy a = b and triad a = b + s c count STREAM's bytes (8 and 12 per element; the
    write-allocate read of ``a`` is not counted). rmw a += s b (12 bytes, all of them
    real) is the access pattern of an in-place optimizer step.
    """
    a = torch.rand(numel)
    b = torch.rand(numel)
    c = torch.rand(numel)
    t_copy = bench(lambda: a.copy_(b))
    t_triad = bench(lambda: torch.add(b, c, alpha=1.5, out=a))
    t_rmw = bench(lambda: a.add_(b, alpha=1e-3))
    return {"copy": 8 * numel / t_copy / 1e9, "triad": 12 * numel / t_triad / 1e9, "rmw": 12 * numel / t_rmw / 1e9}


def bench_cuda(fn: Callable[[], object], min_time: float = 0.3, warmup: int = 3, max_iters: int = 500,
               calls: int = 1) -> float:
    """Median seconds per call, timed with CUDA events around each sample of ``calls`` calls.

    With ``calls=1`` the GPU is idle when a call starts, so the time includes the host's work before
    its first launch (a latency). With several calls back to back the host prepares each call while
    the GPU runs the last, as in a training loop: the time is the larger of the two (a throughput).
    """
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    one = max(time.perf_counter() - t0, 1e-6)
    iters = int(min(max_iters, max(10, min_time / (one * calls))))
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if calls > 1:
            fn()  # (untimed: the GPU is busy when the timed calls' host work starts)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / calls)
    return statistics.median(times)


def cuda_copy_bandwidth(numel: int = 1 << 28) -> float:
    """Device-to-device copy bandwidth (GB/s, bytes read + written) on 1 GiB float32 buffers."""
    a = torch.rand(numel, device="cuda")
    b = torch.rand(numel, device="cuda")
    return 8 * numel / bench_cuda(lambda: a.copy_(b)) / 1e9


def bert_like_shapes(hidden: int = 576, ffn: int = 2304, layers: int = 6, vocab: int = 4096) -> list[tuple[int, ...]]:
    """Parameter shapes of a small BERT encoder: about 104 tensors, 26.6M params by default."""
    shapes: list[tuple[int, ...]] = [(vocab, hidden), (512, hidden), (2, hidden), (hidden,), (hidden,)]
    for _ in range(layers):
        for _ in range(4):  # q, k, v, attention output
            shapes += [(hidden, hidden), (hidden,)]
        shapes += [(hidden,), (hidden,)]  # attention LayerNorm
        shapes += [(ffn, hidden), (ffn,), (hidden, ffn), (hidden,)]
        shapes += [(hidden,), (hidden,)]  # output LayerNorm
    shapes += [(hidden, hidden), (hidden,)]  # pooler
    return shapes


def numel(shapes) -> int:
    n = 0
    for s in shapes:
        k = 1
        for d in s:
            k *= d
        n += k
    return n


def timm_lamb_class():
    """timm's ``Lamb`` (the pure-PyTorch LAMB users switch from), or None when timm
    is not installed. Only its optimizer files are loaded: timm's package imports
    torchvision, which this project's machines lack."""
    import importlib
    import importlib.util
    import sys
    import types
    from pathlib import Path

    spec = importlib.util.find_spec("timm")
    if spec is None:
        return None
    if "_timm_optim" not in sys.modules:
        pkg = types.ModuleType("_timm_optim")
        pkg.__path__ = [str(Path(spec.submodule_search_locations[0]) / "optim")]
        sys.modules["_timm_optim"] = pkg
    return importlib.import_module("_timm_optim.lamb").Lamb


def torchao_low_bit():
    """torchao's low-bit AdamWs (name -> class), or {} when torchao is not installed."""
    try:
        from torchao.optim import AdamW4bit, AdamW8bit, AdamWFp8
    except ImportError:
        return {}
    return {"torchao AdamW8bit": AdamW8bit, "torchao AdamWFp8": AdamWFp8, "torchao AdamW4bit": AdamW4bit}


# The stages of a compile, from torch's own timers (torch._dynamo.utils.compilation_time_metrics),
# for this process so far: dynamo = bytecode tracing + guards; aot = AOT autograd outside Inductor;
# post_grad = Inductor's FX passes; lowering = GraphLowering.run; scheduling = Scheduler.__init__
# (fusion included); codegen = the code written (C++ or Triton), without the compiles; compile =
# the C++ or Triton compiles and loading the generated module.
COMPILE_STAGES = ("dynamo", "aot", "post_grad", "lowering", "scheduling", "codegen", "compile")


def compile_stages() -> dict[str, float]:
    from torch._dynamo.utils import compilation_time_metrics

    m = {k: sum(v) for k, v in compilation_time_metrics.items()}
    get = m.get
    inner = get("compile_fx.<locals>.fw_compiler_base", 0.0) + get("compile_fx.<locals>.bw_compiler", 0.0)
    compiled = get("compile_file", 0.0) + get("PyCodeCache.load_by_key_path", 0.0)
    return {"dynamo": get("bytecode_tracing", 0.0) + get("build_guards", 0.0),
            "aot": max(get("create_aot_dispatcher_function", 0.0) - inner, 0.0),
            "post_grad": get("_recursive_post_grad_passes", 0.0),
            "lowering": get("GraphLowering.run", 0.0),
            "scheduling": get("Scheduler.__init__", 0.0),
            "codegen": max(get("Scheduler.codegen", 0.0) - get("compile_file", 0.0), 0.0),
            "compile": compiled}

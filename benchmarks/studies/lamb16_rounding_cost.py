"""Cost of LAMB16's stochastic rounding: LAMB vs LAMB16 rounding to nearest vs LAMB16
rounding stochastically, eager kernels, same sizes, timed interleaved in one process (medians).

    PYTHONPATH=. python -m benchmarks.studies.lamb16_rounding_cost avx2 default
"""
import statistics
import sys
import time

import torch

import inductor_lamb

torch.set_num_threads(2)
def lists(n, k=1):
    sizes = [n // k] * k
    p = [torch.randn(s) for s in sizes]; g = [torch.randn(s) * 1e-2 for s in sizes]
    m8 = [torch.zeros(s, dtype=torch.float8_e4m3fn) for s in sizes]; v8 = [torch.zeros(s, dtype=torch.float8_e5m2) for s in sizes]
    one = lambda: [torch.tensor(1.0) for _ in sizes]
    return [p, g, m8, v8, one(), one(), [torch.tensor(0.0) for _ in sizes]]
def lamb_lists(n, k=1):
    sizes = [n // k] * k
    return [[torch.randn(s) for s in sizes], [torch.randn(s)*1e-2 for s in sizes], [torch.zeros(s) for s in sizes], [torch.zeros(s) for s in sizes], [torch.tensor(0.0) for _ in sizes]]
lr = torch.tensor(1e-3)
for cap in sys.argv[1:]:
    inductor_lamb.set_cpu_capability(cap)
    for n, k in ((262144, 1), (4 * 2**20, 1), (27 * 2**20, 64)):
        L = lists(n, k); LL = lamb_lists(n, k)
        fns = {"lamb": lambda: torch.ops.lamb.lamb_step_(*LL, lr, torch.tensor(0.9), torch.tensor(0.999)),
               "lamb16 nearest": lambda: inductor_lamb.ops.lamb16_step_(*L, lr=lr, stochastic_rounding=False),
               "lamb16 stochastic": lambda: inductor_lamb.ops.lamb16_step_(*L, lr=lr)}
        times = {k2: [] for k2 in fns}
        reps = 40 if n < 2**20 else (10 if n < 2**23 else 4)
        for f in fns.values(): f()
        for _ in range(reps):
            for name, f in fns.items():
                t = time.perf_counter(); f(); times[name].append(time.perf_counter() - t)
        med = {k2: statistics.median(v) * 1e3 for k2, v in times.items()}
        print(f"{cap} n={n} tensors={k}: " + ", ".join(f"{k2} {v:.3f} ms" for k2, v in med.items()),
              f"| SR/RN {med['lamb16 stochastic']/med['lamb16 nearest']:.2f} SR/LAMB {med['lamb16 stochastic']/med['lamb']:.2f}")

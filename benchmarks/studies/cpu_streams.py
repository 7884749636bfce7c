"""Where a CPU core's optimizer-step time goes: the cache lines it reads, not the bytes it moves.

    python -m benchmarks.studies.cpu_streams [--threads 1] [--total-mib 1024]

Hand-written element loops with LAMB's and fused AdamW's access patterns (the same math in AVX2
intrinsics, compiled here, independent of the package's kernels), over a list of tensors of
each size whose pass-1 data adds up to ``--total-mib`` (beyond the caches between steps, as in
training). Per param, side by side in one run:

    adamw        one pass: reads p, g, m, v; writes p, m, v (28 bytes)
    pass 1       reads p, g, m, v; writes m, v; computes u (24 bytes)
    pass 2       reads p, m, v; recomputes u; writes p (16 bytes)
    pass 2 plain pass 2 without the square root and division (what the math costs)
    LAMB         pass 1 then pass 2 on each tensor in turn (40 bytes; the step before the stash)
    LAMB stash   pass 1 also stores u into a buffer reused by every tensor; pass 2 reads p and u
    LAMB stream  the same with u streamed out (non-temporal stores)

If time followed bytes, LAMB would take 1.43x AdamW's; if it follows the lines read from beyond L2
(4 streams for AdamW, 4 + 3 for LAMB), 1.75x. docs/design.md ("The CPU engine") records what two
Xeons gave and why the package's one-call LAMB step stashes u.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
from torch.utils.cpp_extension import load_inline
from tqdm import tqdm

from benchmarks.common import machine_line

# One loop per pattern, AVX2 + FMA (every x86-64 host this package targets has them; the point is
# the access pattern, not the ISA), each stream prefetched 256 elements ahead (the package's distance when this study was made;
# it now prefetches 4 KB of each stream ahead).
SOURCE = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

namespace {
using V = __m256;
const V b1 = _mm256_set1_ps(0.9f), b3 = _mm256_set1_ps(0.1f), b2 = _mm256_set1_ps(0.999f),
        ob2 = _mm256_set1_ps(0.001f), ic1 = _mm256_set1_ps(1.1f), ic2 = _mm256_set1_ps(1.2f),
        eps = _mm256_set1_ps(1e-6f), wd = _mm256_set1_ps(0.01f), lr = _mm256_set1_ps(1e-3f), one = _mm256_set1_ps(1.f);

inline V ld(const float* p) { return _mm256_loadu_ps(p); }
inline void pf(const float* p) { _mm_prefetch(reinterpret_cast<const char*>(p + 256), _MM_HINT_T0); }
inline void moments(V g, V& m, V& v) {
  m = _mm256_fmadd_ps(m, b1, _mm256_mul_ps(g, b3));
  v = _mm256_fmadd_ps(v, b2, _mm256_mul_ps(_mm256_mul_ps(g, g), ob2));
}
inline V update(V p, V m, V v, bool math) {
  const V d = math ? _mm256_div_ps(one, _mm256_add_ps(_mm256_sqrt_ps(_mm256_mul_ps(v, ic2)), eps)) : _mm256_mul_ps(v, ic2);
  return _mm256_fmadd_ps(wd, p, _mm256_mul_ps(_mm256_mul_ps(m, ic1), d));
}
// Each thread's range in steps of 16 elements (two vectors: one cache line), the package's unit.
template <class F>
void over(int64_t n, const F& f) {
  at::parallel_for(0, n / 16, 1024, [&](int64_t b, int64_t e) {
    for (int64_t i = b * 16; i < e * 16; i += 16) f(i), f(i + 8);
  });
}
float* f(const torch::Tensor& t) { return t.data_ptr<float>(); }
}  // namespace

// What AdamW and pass 1 share: reads p, g, m, v at i (prefetching ahead), writes the new m, v;
// returns u (and p in pp).
inline V moments_update(const float* p, const float* g, float* m, float* v, int64_t i, V& pp) {
  if (i % 16 == 0) pf(p + i), pf(g + i), pf(m + i), pf(v + i);
  V mm = ld(m + i), vv = ld(v + i);
  pp = ld(p + i);
  moments(ld(g + i), mm, vv);
  _mm256_storeu_ps(m + i, mm);
  _mm256_storeu_ps(v + i, vv);
  return update(pp, mm, vv, true);
}

void adamw(float* p, const float* g, float* m, float* v, int64_t n) {
  over(n, [&](int64_t i) {
    V pp;
    const V uu = moments_update(p, g, m, v, i, pp);
    _mm256_storeu_ps(p + i, _mm256_fnmadd_ps(lr, uu, pp));
  });
}

// stash: 0 none, 1 plain stores, 2 non-temporal stores (u is 32-byte aligned: torch's allocations are).
void pass1(const float* p, const float* g, float* m, float* v, float* u, int64_t n, int stash) {
  over(n, [&](int64_t i) {
    V pp;
    const V uu = moments_update(p, g, m, v, i, pp);
    if (stash == 1) _mm256_storeu_ps(u + i, uu);
    if (stash == 2) _mm256_stream_ps(u + i, uu);
    // (the norms' sums are left out: a reduction's registers do not change which lines are read)
    asm volatile("" ::"x"(uu), "x"(pp));
  });
  if (stash == 2) _mm_sfence();
}

void pass2(float* p, const float* m, const float* v, const float* u, int64_t n, bool math) {
  over(n, [&](int64_t i) {
    const V pp = ld(p + i);
    if (u) {
      if (i % 16 == 0) pf(p + i), pf(u + i);
      _mm256_storeu_ps(p + i, _mm256_fnmadd_ps(lr, ld(u + i), pp));
    } else {
      if (i % 16 == 0) pf(p + i), pf(m + i), pf(v + i);
      _mm256_storeu_ps(p + i, _mm256_fnmadd_ps(lr, update(pp, ld(m + i), ld(v + i), math), pp));
    }
  });
}

// LAMB over a list, pass 1 then pass 2 on each tensor; mode 0 recomputes u, 1 stashes it, 2 streams it.
void lamb(std::vector<torch::Tensor> P, std::vector<torch::Tensor> G, std::vector<torch::Tensor> M,
          std::vector<torch::Tensor> Vs, torch::Tensor U, int64_t mode) {
  for (size_t t = 0; t < P.size(); ++t) {
    const int64_t n = P[t].numel();
    float* u = mode ? f(U) : nullptr;
    pass1(f(P[t]), f(G[t]), f(M[t]), f(Vs[t]), u, n, int(mode));
    pass2(f(P[t]), f(M[t]), f(Vs[t]), u, n, true);
  }
}

// One pattern over a list: 0 adamw, 1 pass 1, 2 pass 2, 3 pass 2 without the square root and division.
void each(std::vector<torch::Tensor> P, std::vector<torch::Tensor> G, std::vector<torch::Tensor> M,
          std::vector<torch::Tensor> Vs, int64_t which) {
  for (size_t t = 0; t < P.size(); ++t) {
    const int64_t n = P[t].numel();
    if (which == 0) adamw(f(P[t]), f(G[t]), f(M[t]), f(Vs[t]), n);
    else if (which == 1) pass1(f(P[t]), f(G[t]), f(M[t]), f(Vs[t]), nullptr, n, 0);
    else pass2(f(P[t]), f(M[t]), f(Vs[t]), nullptr, n, which == 2);
  }
}
"""

ROWS = ("adamw", "pass 1", "pass 2", "pass 2 plain", "LAMB", "LAMB stash", "LAMB stream")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--total-mib", type=int, default=1024, help="pass-1 bytes of each list (16 a param)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    mod = load_inline("cpu_streams", cpp_sources=SOURCE, functions=["lamb", "each"],
                      extra_cflags=["-O3", "-mavx2", "-mfma", "-fopenmp"],
                      extra_ldflags=["-fopenmp"])
    print(machine_line(args.threads))
    print(f"ns a param over {args.total_mib} MiB of pass-1 data; x: against adamw in the same round")
    print("| tensor | " + " | ".join(ROWS) + " |")
    print("|---|" + "---|" * len(ROWS))
    total = (args.total_mib << 20) // 16
    for n in tqdm([1 << 16, 1 << 18, 1 << 20, 1 << 22], desc="sizes", file=sys.stderr):
        k = total // n
        lists = [[torch.rand(n) + 0.5 for _ in range(k)] for _ in range(4)]
        u = torch.empty(n)
        runs = {
            "adamw": lambda: mod.each(*lists, 0), "pass 1": lambda: mod.each(*lists, 1),
            "pass 2": lambda: mod.each(*lists, 2), "pass 2 plain": lambda: mod.each(*lists, 3),
            "LAMB": lambda: mod.lamb(*lists, u, 0), "LAMB stash": lambda: mod.lamb(*lists, u, 1),
            "LAMB stream": lambda: mod.lamb(*lists, u, 2),
        }
        best = {}
        for _ in range(args.rounds):
            for name, run in runs.items():
                t0 = time.perf_counter()
                run()
                best[name] = min(best.get(name, float("inf")), time.perf_counter() - t0)
        cells = [f"{best[r] / total * 1e9:.3f} ({best[r] / best['adamw']:.2f}x)" for r in ROWS]
        print(f"| {n} ({16 * n >> 10} KiB) | " + " | ".join(cells) + " |")
        lists = u = None  # (frees them before the next size)


if __name__ == "__main__":
    main()

#!/usr/bin/env bash
# On a machine with an NVIDIA GPU and a CUDA torch (no internet needed): build the
# CUDA part, run the CUDA tests, then the GPU step benchmark. Output under $OUT if set.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-/tmp}"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv | tee "$out/gpu.txt"
pip install --no-build-isolation --no-deps -e . 2>&1 | tail -3
python -c "import torch, inductor_lamb; assert torch._C._dispatch_has_kernel_for_dispatch_key('lamb::lamb_step_', 'CUDA'), 'built without CUDA'"
python -m pytest -q tests/test_cuda.py 2>&1 | tee "$out/test_cuda.txt" | tail -30
python benchmarks/bench_step.py --device cuda --min-time 0.5 2>&1 | tee "$out/bench_step_cuda.txt"

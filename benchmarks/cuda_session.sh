#!/usr/bin/env bash
# On a machine with an NVIDIA GPU and a CUDA torch (no internet needed): build the
# CUDA part, run the CUDA tests, then the GPU step benchmark. Output under $OUT if set.
# A failing test does not stop the benchmark (device time is scarce: one call gets
# both); the script's exit status is the tests'. Arguments name the ops to benchmark
# (default: all four); split them over several calls if one would pass the device's
# 10-minute limit (torch.compile of the references takes most of it).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-/tmp}"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv | tee "$out/gpu.txt"
pip install --no-build-isolation --no-deps -e . > "$out/build.txt" 2>&1 || { tail -40 "$out/build.txt"; exit 1; }
python -c "import torch, inductor_lamb; assert torch._C._dispatch_has_kernel_for_dispatch_key('lamb::lamb_step_', 'CUDA'), 'built without CUDA'" || exit 1
python -m pytest -q tests/test_cuda.py > "$out/test_cuda.txt" 2>&1
tests=$?
tail -40 "$out/test_cuda.txt"
ops=("$@"); [ ${#ops[@]} -gt 0 ] || ops=(lamb lamb16 lars adagrad)
python benchmarks/bench_step.py --device cuda --min-time 0.5 --ops "${ops[@]}" 2>&1 | tee "$out/bench_step_cuda.txt"
exit $tests

#!/usr/bin/env bash
# On a machine with an NVIDIA GPU and a CUDA torch (no internet needed): build the
# CUDA part, run the CUDA tests, then the GPU step benchmark. Output under $OUT if set.
# A failing test does not stop the benchmark (device time is scarce: one call gets
# both); the script's exit status is the tests'. Arguments name the ops to benchmark
# (default: all four); split them over several calls if one would pass the device's
# 10-minute limit. The torch.compile(reference) rows are left out unless
# COMPILED_REFERENCE=1: compiling the reference for LAMB's BERT-large-like list
# alone took 7 minutes on an H100 (and it ran 7.25x slower than our op).
#
# The H100/H200 image this was first run on needs three things this script does:
# - its `pip` is another Python's: use `python3 -m pip` (python3 holds torch);
# - its CXX=/opt/gcc/bin/g++ links libstdc++ statically, which crashes the
#   extension (setup.py refuses such a build): build with the system gcc/g++;
# - it has no expecttest: tests/test_cuda.py imports no module that needs it.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-/tmp}"
py="${PYTHON:-python3}"
export CC="${INDUCTOR_LAMB_CC:-gcc}" CXX="${INDUCTOR_LAMB_CXX:-g++}"
# One GPU architecture: the lent machines are Hopper; the build takes a minute with it.
export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-$($py -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability())')}"
export MAX_JOBS="${MAX_JOBS:-$(nproc)}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv | tee "$out/gpu.txt"
$py -m pip install --no-build-isolation --no-deps -e . > "$out/build.txt" 2>&1 || { tail -40 "$out/build.txt"; exit 1; }
$py -c "import torch, inductor_lamb; assert torch._C._dispatch_has_kernel_for_dispatch_key('lamb::lamb_step_', 'CUDA'), 'built without CUDA'" || exit 1
# -n 4 (pytest-xdist, in the image): a crashing test loses its worker, not the run
$py -m pytest -q -n 4 --timeout 300 -p no:cacheprovider tests/test_cuda.py 2>&1 | grep -v "^DEBUG" > "$out/test_cuda.txt"
tests=${PIPESTATUS[0]}
tail -40 "$out/test_cuda.txt"
ops=("$@"); [ ${#ops[@]} -gt 0 ] || ops=(lamb lamb16 lars adagrad)
ref=(--no-compiled-reference); [ "${COMPILED_REFERENCE:-0}" = 1 ] && ref=()
$py benchmarks/bench_step.py --device cuda --min-time 0.5 "${ref[@]}" --ops "${ops[@]}" 2>&1 | tee "$out/bench_step_cuda.txt"
exit $tests

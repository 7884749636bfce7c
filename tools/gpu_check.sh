#!/usr/bin/env bash
# The whole GPU check on a machine with an NVIDIA GPU, a CUDA torch, nvcc and Triton (no
# internet needed), in two halves, the first the one to run when time is short; outputs under
# $OUT (or /tmp):
#
#   bash tools/gpu_check.sh 1        # build, tests/test_cuda.py, the four ops' step tables
#                                    # against their torch twins, an ncu profile of LAMB16's,
#                                    # LAMB's and Adagrad's kernels (about 3.5 minutes on an
#                                    # H100: build and tests 90 s each)
#   bash tools/gpu_check.sh 2        # build (kept when the machine is still warm), the step
#                                    # inside the backward's peak memory, FSDP2 + Lamb
#                                    # on NCCL (world size 1) against CPU/gloo, the compiled
#                                    # training recipes with reduce-overhead (bench_recipes), the
#                                    # GPT-2 training step, the step tables' peers (reference,
#                                    # timm, torchao): more than 10 minutes in all; what comes
#                                    # last is cut first
#   bash tools/gpu_check.sh 1 2      # both, one after the other
#
# Step tables: a BERT-large-like list and 1000 small tensors, GB/s at each method's
# bytes/param floor against a device copy measured in the same run, launches per step,
# peers (torch's fused twin; timm's Lamb and torchao's low-bit AdamWs when installed).
# The torch.compile(reference) rows are left out unless COMPILED_REFERENCE=1: compiling
# the reference for the BERT-large list alone took 7 minutes on an H100. A failing test
# does not stop the benchmarks (their numbers are wanted either way); the exit status is the
# tests'.
#
# Environments this handles: a `pip` that belongs to another Python than the one holding torch
# (it runs `python3 -m pip`); a CXX that links libstdc++ statically, which crashes the extension
# (setup.py refuses such a build; the system gcc/g++ is used); no expecttest (tests/test_cuda.py
# imports only torch, pytest and conftest).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-/tmp}"
py="${PYTHON:-python3}"
halves=("$@"); [ ${#halves[@]} -gt 0 ] || halves=(1 2)
export CC="${INDUCTOR_LAMB_CC:-gcc}" CXX="${INDUCTOR_LAMB_CXX:-g++}"
# This GPU's architecture only, built with every core: about a minute.
export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-$($py -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability())')}"
export MAX_JOBS="${MAX_JOBS:-$(nproc)}" PYTHONUNBUFFERED=1
ref=(--no-compiled-reference); [ "${COMPILED_REFERENCE:-0}" = 1 ] && ref=()
tests=0

build() {
  nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv | tee "$out/gpu.txt"
  if ! $py -c "import torch, inductor_lamb; assert torch._C._dispatch_has_kernel_for_dispatch_key('lamb::lamb_step_', 'CUDA')" 2>/dev/null; then
    $py -m pip install --no-build-isolation --no-deps -e . > "$out/build.txt" 2>&1 || { tail -40 "$out/build.txt"; exit 1; }
  fi
  $py -c "import torch, inductor_lamb; assert torch._C._dispatch_has_kernel_for_dispatch_key('lamb::lamb_step_', 'CUDA'), 'built without CUDA'" || exit 1
  # What this torch release cannot run, by name (inductor_lamb/_private.py, LIMITS): the tests
  # check that it is refused clearly, the tables leave out its rows and say so; nothing else is
  # left out for an older torch.
  $py -c "import torch; from inductor_lamb import _private; print(f'torch {torch.__version__}'); \
[print(f'note: left out on this torch: {f}: {_private.lacks(f)}') for f in _private.LIMITS if _private.lacks(f)]"
}

summary() {  # our op's rows of every step table, and the GPT-2 table
  echo; echo "== summary ($1) =="
  for f in "$out"/bench_step_cuda_*.txt; do
    [ -f "$f" ] && grep -E "^(LAMB|LAMB16|LARS|ADAGRAD), |^\| inductor_lamb op|^\| torch (AdamW|SGD|Adagrad)|LAMB op \(fp32" "$f"
  done
  [ -f "$out/train_step_gpt2.txt" ] && grep -E "^(GPT-2|\|)" "$out/train_step_gpt2.txt"
  [ -f "$out/in_backward_cuda.txt" ] && grep -E "^\|" "$out/in_backward_cuda.txt"
  for f in "$out"/train_fsdp_*.txt; do [ -f "$f" ] && { echo "$(basename "$f"):"; grep -i "loss" "$f"; }; done
}

for half in "${halves[@]}"; do
  build
  if [ "$half" = 1 ]; then
    # -n 8 (pytest-xdist): a crashing test loses its worker, not the run
    $py -m pytest -q -n 8 --timeout 300 -p no:cacheprovider tests/test_cuda.py 2>&1 | grep -v "^DEBUG" > "$out/test_cuda.txt"
    tests=${PIPESTATUS[0]}
    tail -40 "$out/test_cuda.txt"
    $py -m benchmarks.bench_step --device cuda --min-time 0.3 --no-peers --ops lamb lamb16 lars adagrad 2>&1 \
      | tee "$out/bench_step_cuda_1.txt"
    # LAMB16's, LAMB's and Adagrad's kernels of one BERT-large step, profiled (where ncu is
    # installed): op:kernels a call (two calls skipped, one profiled)
    if command -v ncu > /dev/null; then
      for spec in lamb16:3 lamb:3 adagrad:2; do
        op=${spec%:*} n=${spec#*:}
        timeout 120 ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis \
          -k regex:"pass|finish|update|increment" --launch-skip $((2 * n)) --launch-count $n \
          $py -m tools.profile_step $op > "$out/ncu_$op.txt" 2>&1
        grep -E "^  [a-z_0-9:<>]+.*\(|Duration|DRAM Throughput|Memory Throughput" "$out/ncu_$op.txt" | cut -c1-120
      done
    fi
  elif [ "$half" = 2 ]; then
    # What has run least first: on an H100 the GPT-2 table takes about 5 minutes (a compile of
    # 40-55 s a compiled row), so it comes after FSDP2 (seconds) and the recipes' table.
    # The step inside the backward: a training step's peak memory (max_memory_allocated) and time,
    # ordinary against in the backward, beside fused AdamW and the tutorial's pattern (20 fresh
    # processes: about 2 minutes)
    timeout 240 $py -m benchmarks.bench_in_backward --device cuda --model wide --rounds 2 2>&1 \
      | tee "$out/in_backward_cuda.txt"
    # FSDP2 + Lamb on NCCL at world size 1, eager and compiled, and the same run on CPU/gloo
    for args in "" "--compile"; do
      $py -m torch.distributed.run --nproc_per_node 1 examples/train_fsdp.py --steps 30 $args 2>&1 | tail -3 \
        | tee -a "$out/train_fsdp_nccl.txt"
      CUDA_VISIBLE_DEVICES= $py -m torch.distributed.run --nproc_per_node 1 examples/train_fsdp.py --steps 30 $args \
        2>&1 | tail -3 | tee -a "$out/train_fsdp_gloo.txt"
    done
    # The training-step recipes, reduce-overhead (CUDA graphs) included, beside fused AdamW; cold
    # compiles, each cell a fresh process
    timeout 300 $py -m benchmarks.bench_recipes --device cuda --opt lamb adamw --lists \
      --recipes compiled_opt_step_ro whole_step_ro \
      --json "$out/recipes_cuda.json" 2>&1 | tee "$out/recipes_cuda.txt"
    $py -m benchmarks.bench_train_step --model gpt2 --device cuda --batch 8 --context 512 --min-time 0.5 2>&1 \
      | tee "$out/train_step_gpt2.txt"
    $py -m benchmarks.bench_step --device cuda --min-time 0.5 "${ref[@]}" 2>&1 | tee "$out/bench_step_cuda_2.txt"
  else
    echo "unknown half '$half' (1 or 2)"; exit 2
  fi
  summary "half $half"
done
exit $tests

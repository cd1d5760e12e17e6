#!/usr/bin/env bash
# Check the CUDA backend on a GPU machine in one go, from the repository root, with the packages
# importable (installed, or on PYTHONPATH):
#
#   packages/tileinfer-backend-cuda/tools/gpu_check.sh OUT_DIR [tests|bench|all]
#
# tests: every kernel build of tests/tileinfer-backend-cuda/cuda_builds.py compiled into the disk
#        cache first (in parallel), then the conformance suite for the cuda backend, the GPU tests
#        of tests/tileinfer-backend-cuda/ (test_cuda_gpu_linear.py: GEMVs and GEMM, launch
#        configurations, row invariance; test_cuda_gpu_attention.py: both attention kernels, the
#        fused attention inputs; test_cuda_gpu_graphs.py and test_cuda_gpu_sampling.py: graph
#        replay, PDL, the cubin cache, sampling) and the greedy speculative identity tests for
#        cuda, one pytest process per group, so that a kernel fault (which poisons the CUDA
#        context) in one group cannot hide the results of the others;
# bench: python3 benchmarks/cuda_kernels.py (JSON in OUT_DIR/bench.json, saved after every
#        section; table and summary in OUT_DIR/bench.txt).
# About 6-8 minutes on an H200 for `all` (the benchmark sweeps two GEMV kernel families). Logs
# go to OUT_DIR/*.txt; a summary line per group is printed last, then the benchmark's table.
set -u
out=${1:?usage: gpu_check.sh OUT_DIR [tests|bench|all]}
what=${2:-all}
mkdir -p "$out"
export TILEINFER_CACHE=${TILEINFER_CACHE:-$HOME/.cache/tileinfer}
tests=tests/tileinfer-backend-cuda
summary=()

run_group() {  # name, timeout in seconds, then the pytest arguments
  local name=$1 limit=$2; shift 2
  local log="$out/$name.txt"
  timeout "$limit" python3 -m pytest -q -p no:cacheprovider -p no:randomly "$@" >"$log" 2>&1
  local rc=$?
  summary+=("$name (rc $rc): $(grep -E '(passed|failed|error|skipped|no tests ran)' "$log" | tail -1)")
}

CUDA_TESTS=$tests python3 - <<'PY' 2>&1 | tee "$out/info.txt"
import os, sys, time, multiprocessing
from concurrent.futures import ProcessPoolExecutor
sys.path.insert(0, os.environ["CUDA_TESTS"])
import torch, tileinfer_backend_cuda as c
from tileinfer_backend_cuda import compiler
from cuda_builds import builds
print(c.tileinfer_backend_info())
arch = compiler.device_arch(0)
print("nvrtc", compiler.nvrtc_version(), "arch", arch, torch.cuda.get_device_name())
t = time.time()
def build(b):
    compiler.compile_cubin(b[0], arch, b[1], b[2])
with ProcessPoolExecutor(max_workers=max(1, (os.cpu_count() or 2) - 1),
                         mp_context=multiprocessing.get_context("fork")) as pool:
    list(pool.map(build, builds()))
print(f"compiled {len(builds())} builds in {time.time() - t:.1f} s")
PY

if [[ $what == tests || $what == all ]]; then
  run_group conformance 120 --pyargs tileinfer.testing.conformance --tileinfer-backend cuda
  run_group gpu-linear 300 $tests/test_cuda_gpu_linear.py -m gpu
  run_group gpu-attention 300 $tests/test_cuda_gpu_attention.py -m gpu
  run_group gpu-graphs-sampling 180 $tests/test_cuda_gpu_graphs.py $tests/test_cuda_gpu_sampling.py -m gpu
  run_group speculative 45 tests/tileinfer-core/test_speculative.py -m gpu -k "cuda and greedy"
fi

if [[ $what == bench || $what == all ]]; then
  timeout 420 python3 benchmarks/cuda_kernels.py --out "$out/bench.json" >"$out/bench.txt" 2>&1
  rc=$?
  if [[ $rc != 0 && -f $out/bench.json ]]; then  # cut short: the table of what was saved
    python3 benchmarks/cuda_kernels.py --table "$out/bench.json" >>"$out/bench.txt" 2>&1
  fi
  summary+=("bench (rc $rc): see bench.txt, bench.json")
fi

echo
for line in "${summary[@]}"; do echo "$line"; done
for f in "$out"/conformance.txt "$out"/gpu-*.txt "$out"/speculative.txt; do
  [[ -f $f ]] && grep -E '^(FAILED|ERROR)' "$f" | head -5
done
[[ -f $out/bench.txt ]] && grep -v '^{' "$out/bench.txt" | tail -80
exit 0

#!/usr/bin/env bash
# Check the CUDA backend on a GPU machine in one go, from the repository root:
#
#   packages/tileinfer-backend-cuda/tools/gpu_check.sh OUT_DIR [tests|bench|all]
#
# tests: the conformance suite for the cuda backend and tests/test_cuda_backend_gpu.py, one pytest
#        process per op family, so that a kernel fault (which poisons the CUDA context) in one
#        family cannot hide the results of the others;
# bench: python -m tileinfer_backend_cuda.bench (JSON in OUT_DIR/bench.json).
# Logs go to OUT_DIR/*.txt; a summary line per group is printed last.
set -u
out=${1:?usage: gpu_check.sh OUT_DIR [tests|bench|all]}
what=${2:-all}
mkdir -p "$out"
export TILEINFER_CACHE=${TILEINFER_CACHE:-$HOME/.cache/tileinfer}
summary=()

run_group() {  # name, then the pytest arguments
  local name=$1; shift
  local log="$out/$name.txt"
  timeout 300 python3 -m pytest -q -p no:cacheprovider "$@" >"$log" 2>&1
  local rc=$?
  summary+=("$name (rc $rc): $(grep -E '(passed|failed|error|skipped|no tests ran)' "$log" | tail -1)")
}

python3 - <<'EOF' 2>&1 | tee "$out/info.txt"
import torch, tileinfer_backend_cuda as c
from tileinfer_backend_cuda import compiler
print(c.tileinfer_backend_info())
print("nvrtc", compiler.nvrtc_version(), "arch", compiler.device_arch(0), torch.cuda.get_device_name())
EOF

if [[ $what == tests || $what == all ]]; then
  conf=(--pyargs tileinfer.testing.conformance --tileinfer-backend cuda)
  run_group conf-elementwise "${conf[@]}" -k "test_embed or test_rmsnorm or test_add_rmsnorm or test_silu_mul or test_xielu or test_rope"
  run_group conf-linear "${conf[@]}" -k "test_linear"
  run_group conf-kv "${conf[@]}" -k "test_store_kv or test_attention_inputs"
  run_group conf-attention "${conf[@]}" -k "test_attention and not inputs"
  run_group conf-sampling "${conf[@]}" -k "test_sample_tokens or test_accept_tokens"
  gpu=(tests/test_cuda_backend_gpu.py -m gpu)
  run_group gpu-linear "${gpu[@]}" -k "gemv or swiglu or gemm"
  run_group gpu-attention "${gpu[@]}" -k "attention_model"
  run_group gpu-graph-cache "${gpu[@]}" -k "graph or cache or fallback"
  run_group gpu-sampling "${gpu[@]}" -k "sampling or sample_host or accept"
fi

if [[ $what == bench || $what == all ]]; then
  timeout 400 python3 -m tileinfer_backend_cuda.bench --out "$out/bench.json" >"$out/bench.txt" 2>&1
  summary+=("bench (rc $?): see bench.txt")
fi

echo
for line in "${summary[@]}"; do echo "$line"; done
for f in "$out"/conf-*.txt "$out"/gpu-*.txt; do
  [[ -f $f ]] && grep -E '^(FAILED|ERROR)' "$f" | head -5
done
[[ -f $out/bench.txt ]] && tail -25 "$out/bench.txt"

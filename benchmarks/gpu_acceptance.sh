#!/usr/bin/env bash
# The served path's acceptance figures on the GPU machine, several models in one run:
#   exports   build the op libraries once, then `gpu_serving.sh STAGES=export` for every case
#             side by side (each export's Inductor front end is single-threaded, so they share
#             the host's cores), the TorchCall `gpu` tests beside them;
#   served    `bench_served` per case, one at a time (timed stages run alone);
#   load      `load_serving` (REST + gRPC, 10% malformed, open-loop sweep, GPU utilisation)
#             for the cases that have a load target.
# The cases:
#   qwen2-0.5b, item-causal (the headline request: profile soft prompt, the history excluded),
#     prompt 1024, beam 256, top_k 300, batch 1 and 8; load target 200 req/s at P99 <= 100 ms;
#   qwen2-0.5b, causal: the same beside it;
#   qwen3-1.7b, item-causal, context 5000 (the export), batch 1 and 4, and context 1000 through
#     the same SavedModel (its prompt buckets take any shorter length); load target 20 req/s at
#     P99 <= 200 ms at context 5000;
#   qwen3-1.7b, item-causal, prompt 1024 (an export of its own), batch 1 and 8;
#   q2_item_lk (not in the default CASES): the qwen2-0.5b item-causal case with the fused layer
#     kernels inside the package, served beside the case without them.
# Usage: `gpu_acceptance.sh run` (everything, in the foreground), `gpu_acceptance.sh start`
# (the same in a new process session, so it outlives the command that started it) and
# `gpu_acceptance.sh wait SECONDS` (waits for a started run, then archives its logs and results
# into $OUT/results.tgz, done or not). XGR_COMMIT, PYTHONPATH (TensorFlow) and .whl/ as gpu_serving.sh wants.
# PHASES (default "exports served load"; "served_cache" adds `bench_served_cache` at qwen3-1.7b,
# context 5000, last: the prompt-KV cache through `xgr serve`, plain and cached SavedModels of
# its own under a session workload, target 1.8x the plain throughput at P99 <= 200 ms, with
# the large-pool `gpu` test beside its exports, `experiments.probe_spill_cost` and
# `experiments.probe_model_call` (a model call's time split, both exports) after it;
# SERVED_CACHE_RATES and SERVED_CACHE_RATE_SECONDS shorten its sweep for a short lease,
# SERVED_CACHE_WARMUP_SECONDS (default 20) is its uncounted warm-up per server;
# SERVED_CACHE_EXPORT_FLAGS (default --layer_kernels=on: the cached hit's fastest package)
# go to both of its exports; "served_cache_q2" runs the same benchmark at qwen2-0.5b, prompt
# 1024, P99 <= 100 ms (SERVED_CACHE_Q2_RATES, SERVED_CACHE_Q2_EXPORT_FLAGS);
# "prompt_cache" adds `gpu_prompt_cache.sh --timeline` after it, on the quiet card;
# "catalog" adds `bench_catalog_swap` at qwen2-0.5b,
# 1M items, beam 256, beside the exports when both are named) and CASES (default all) pick parts.
set +e
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 1
BASE=${BASE:-/tmp/xgr_acceptance}
OUT=${OUT:-$BASE/out}
PHASES=" ${PHASES:-exports served load} "
CASES=${CASES:-"q2_item q2_causal q3_ctx5000 q3_ctx1000"}
RUN_OUT=$BASE/run_out     # where a run writes; `wait` copies it to $OUT

case_env() {  # the environment of one case, as `env` arguments
  case "$1" in
    q2_item)    echo "PRESET=qwen2-0.5b CASE=qwen2-0.5b_item_causal BATCHES=1,8 \
RATES=200 RATE_FRACTIONS=0.6,0.8,1.0,1.2 P99_TARGET=100 LOAD_BATCH=16" ;;
    q2_causal)  echo "PRESET=qwen2-0.5b MASK=causal CASE=qwen2-0.5b_causal BATCHES=1,8" ;;
    q2_item_lk) echo "PRESET=qwen2-0.5b LAYER_KERNELS=on CASE=qwen2-0.5b_item_causal_layer_kernels \
BATCHES=1,8" ;;
    q3_ctx5000) echo "PRESET=qwen3-1.7b EVENTS=1420 KEEP=1249 WINDOW_DAYS=36500 MAX_BATCH=16 \
CASE=qwen3-1.7b_ctx5000 BATCHES=1,4 RATES=15,20,25 RATE_FRACTIONS=0.8,1.0 P99_TARGET=200 \
LOAD_BATCH=4" ;;
    q3_ctx1000) echo "PRESET=qwen3-1.7b CASE=qwen3-1.7b_ctx1000 BATCHES=1,8" ;;
    *) echo "unknown case $1" >&2; return 1 ;;
  esac
}

# REHEARSAL=1: the same run at test sizes on a CPU host (the sizes win over the cases').
TINY="DEVICE=cpu PRESET=tiny ITEMS=3000 USERS=24 EVENTS=60 KEEP=40 BEAM=16 TOPK=12 TOPN=8 \
MAX_BATCH=64 REQUEST_EVENTS=20 LOAD_BATCH=8 LABEL=cpu"

stage() {  # case, stages, extra env...
  local name=$1 stages=$2
  shift 2
  env $(case_env "$name") "$@" ${REHEARSAL:+$TINY} STAGES="$stages" WORK="$BASE/work/$name" \
      OUT="$RUN_OUT/$name" XGR_SITE_READY=1 bash benchmarks/gpu_serving.sh
}

# The served cache's pool: the stated 40 GiB on a card of 141 GB; on a smaller card (80 GB)
# 20 GiB, since 40 did not fit there beside the model (the benchmark halves it again if the
# server still does not load).
served_cache_pool_gb() {
  local mib
  mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
  if [ -n "$mib" ] && [ "$mib" -lt 120000 ]; then echo 20; else echo 40; fi
}

# What both served-cache sizes share: the catalog, the search, the workload's population.
SERVED_CACHE_COMMON=(--device=cuda:0 --dtype=bfloat16 --items=1000000 --paths=250000
                     --beam_width=256 --top_k=300 --population=300 --parallel_exports
                     --warmup_seconds="${SERVED_CACHE_WARMUP_SECONDS:-20}")

served_cache_run() {  # case label, then bench_served_cache's flags: one run and its logs
  local label=$1 work="$BASE/served_cache_$1"
  shift
  timeout "${SERVED_CACHE_LIMIT:-2400}" "${PY:-python3}" -m benchmarks.bench_served_cache \
      "$@" --work="$work" --out_dir="$RUN_OUT" > "$RUN_OUT/served_cache_$label.log" 2>&1
  note "served cache $label rc=$?"
  tail -8 "$RUN_OUT/served_cache_$label.log" >> "$log"
  # Each server's log (a refused pool's attempt kept apart), without TF's start-up chatter.
  for server_log in "$work"/*.log; do
    [ -f "$server_log" ] || continue
    grep -v "oneDNN\|absl::InitializeLog" "$server_log" | tail -300 \
        > "$RUN_OUT/server_${label}_$(basename "$server_log")"
  done
}

model_call_probe() {  # case label, then the world's flags: a model call's time split
  local label=$1 work="$BASE/served_cache_$1"
  shift
  for name in plain cached; do
    [ -d "$work/$name" ] || continue
    timeout 300 "${PY:-python3}" -m experiments.probe_model_call --saved_model="$work/$name" \
        "$@" --tag="${label}_$name" --out="$RUN_OUT" >> "$RUN_OUT/model_call_probe.log" 2>&1
  done
  note "model-call probe $label: $(grep -c '^result:' "$RUN_OUT/model_call_probe.log") results"
}

served_cache_phase() {
  # The cache through the server at the issue's size: 300 users of ~5,000-token prompts
  # (1,000 long-term items), Zipf 1.0; a 40 GiB pool (~87 users' frozen parts) and a 48 GiB
  # host tier beside it. From 3 req/s, 30 s a rate: at 15 s a P99 rested on one or two
  # answers, and the plain server's first rate (6) missed the bound on them.
  local sizes=(--preset=qwen3-1.7b "${SERVED_CACHE_COMMON[@]}" --long_items=1000
               --recent_items=245 --max_batch=4 --max_batch_size=4 --p99_target_ms=200
               --rates="${SERVED_CACHE_RATES:-3,6,9,12,15,18,24,30,36,44}"
               --rate_seconds="${SERVED_CACHE_RATE_SECONDS:-30}"
               --prompt_cache_gb="$(served_cache_pool_gb)" --prompt_cache_host_gb=48
               --client_processes=2
               --export_flags="${SERVED_CACHE_EXPORT_FLAGS---layer_kernels=on}"
               --label="$(gpu_label)_q3_ctx5000")
  [ -n "$REHEARSAL" ] && sizes=(--population=20 --rates=3 --rate_seconds=4 --label=cpu)
  # Beside the exports' compile: a tiny package read and written at the far end of a pool
  # past 2**31 elements, the size class the served pool is in, and the runtime's host tier
  # with its spills on a copy stream (a few minutes).
  local large_pool=""
  if [ -z "$REHEARSAL" ]; then
    "${PY:-python3}" -m pytest -p no:cacheprovider -m gpu tests/export/test_gpu_large_pool.py \
        tests/torch_call/test_prompt_cache_runtime.py > "$RUN_OUT/large_pool_test.log" 2>&1 &
    large_pool=$!
  fi
  served_cache_run q3_ctx5000 "${sizes[@]}"
  [ -z "$REHEARSAL" ] && model_call_probe q3_ctx5000 --items=1000000 --paths=250000 \
      --long_items=1000 --recent_items=245 --prompt_cache_gb=4
  if [ -n "$large_pool" ]; then
    wait "$large_pool"
    note "large-pool gpu test rc=$? ($(tail -1 "$RUN_OUT/large_pool_test.log"))"
  fi
  if [ -z "$REHEARSAL" ]; then   # one spill's parts, default pinning and registered pages
    for threads in 0 8; do
      timeout 300 "${PY:-python3}" -m experiments.probe_spill_cost --register_threads="$threads" \
          --out="$RUN_OUT" >> "$RUN_OUT/spill_probe.log" 2>&1
    done
    note "spill probe: $(grep -c '^{' "$RUN_OUT/spill_probe.log") results"
  fi
}

served_cache_q2_phase() {
  # The issue's other size: qwen2-0.5b at a 1,024-token prompt (192 long-term items frozen,
  # ~770 tokens, and 61 recent ones), beam 256, P99 <= 100 ms. 300 users' frozen parts take
  # about 3 GB, so an 8 GiB pool holds them all and no host tier is needed. Both exports
  # leave the layer to Inductor (the plain 0.5b package's faster build) unless
  # SERVED_CACHE_Q2_EXPORT_FLAGS says otherwise.
  local sizes=(--preset=qwen2-0.5b "${SERVED_CACHE_COMMON[@]}" --long_items=192
               --recent_items=61 --max_batch=8 --max_batch_size=8 --p99_target_ms=100
               --rates="${SERVED_CACHE_Q2_RATES:-20,40,80,120,160,200,240,280,320,360}"
               --rate_seconds="${SERVED_CACHE_RATE_SECONDS:-20}"
               --prompt_cache_gb=8 --prompt_cache_host_gb=0 --client_processes=4
               --export_flags="${SERVED_CACHE_Q2_EXPORT_FLAGS-}" --label="$(gpu_label)_q2_1024")
  [ -n "$REHEARSAL" ] && sizes=(--population=20 --rates=3 --rate_seconds=4 --label=cpu_q2)
  served_cache_run q2_1024 "${sizes[@]}"
  [ -z "$REHEARSAL" ] && model_call_probe q2_1024 --items=1000000 --paths=250000 \
      --long_items=192 --recent_items=61 --prompt_cache_gb=1
}

catalog_phase() {
  # A catalog refresh at the headline size: the compile once, the catalog-only version,
  # the swap under load (time, failures, latency, GPU memory).
  build_ops_once
  local sizes=(--preset=qwen2-0.5b --device=cuda:0 --dtype=bfloat16 --items=1000000
               --keep_last=255 --history_events=300 --beam_width=256 --top_k=300 --label="$(gpu_label)")
  [ -n "$REHEARSAL" ] && sizes=(--preset=tiny --device=cpu --items=3000 --label=cpu)
  timeout "${CATALOG_LIMIT:-900}" "${PY:-python3}" -m benchmarks.bench_catalog_swap \
      "${sizes[@]}" --max_batch=16 --clients=8 --out_dir="$RUN_OUT" \
      > "$RUN_OUT/catalog.log" 2>&1
  note "catalog swap rc=$?"
  tail -12 "$RUN_OUT/catalog.log" >> "$log"
}

run() {
  mkdir -p "$RUN_OUT"
  local log=$RUN_OUT/acceptance.log
  note() { echo "$(date +%T) $*" | tee -a "$log"; }
  note "start: phases${PHASES}cases $CASES"
  if ls .whl/*.whl >/dev/null 2>&1; then   # once: the cases run side by side
    "${PY:-python3}" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/xgr_site .whl/*.whl && export PYTHONPATH=/tmp/xgr_site:$PYTHONPATH
  fi
  if [[ "$PHASES" == *" exports "* ]]; then
    # One build of the op libraries, copied to every case (parallel builds in one tree clash).
    "${PY:-python3}" setup.py build_ext --inplace -j 8 > "$RUN_OUT/build.log" 2>&1
    note "build rc=$?"
    # The catalog benchmark compiles a package of its own: its compile runs beside the
    # exports' (single-threaded front ends), and the timed stages wait for its swap.
    catalog_pid=
    if [[ "$PHASES" == *" catalog "* ]]; then
      catalog_phase & catalog_pid=$!
    fi
    local pids=() first=1
    for name in $CASES; do
      mkdir -p "$BASE/work/$name/ops" && cp custom_ops/*.so "$BASE/work/$name/ops/"
      local stages="export"
      [ $first = 1 ] && stages="tests export" && first=0
      stage "$name" "$stages" EXPORT_LIMIT=${EXPORT_LIMIT:-900} PYTEST_LIMIT=${PYTEST_LIMIT:-600} \
          > "$RUN_OUT/$name.exports.log" 2>&1 &
      pids+=($!)
    done
    for pid in "${pids[@]}"; do wait "$pid"; done
    note "exports done"
    if [ -n "$catalog_pid" ]; then
      wait "$catalog_pid"
      note "catalog swap (beside the exports) done"
      catalog_pid=done
    fi
    for name in $CASES; do cat "$RUN_OUT/$name/summary.txt" >> "$log" 2>/dev/null; done
  fi
  if [[ "$PHASES" == *" served "* ]]; then
    for name in $CASES; do
      stage "$name" served SERVED_LIMIT=${SERVED_LIMIT:-300} > "$RUN_OUT/$name.served.log" 2>&1
      note "served $name done"
      if [ "$name" = q3_ctx5000 ]; then
        stage "$name" served CASE=qwen3-1.7b_ctx5000_at_1000 BATCHES=1,8 REQUEST_EVENTS=272 \
            SERVED_LIMIT=${SERVED_LIMIT:-300} > "$RUN_OUT/$name.served1000.log" 2>&1
        note "served $name at context 1000 done"
      fi
    done
  fi
  if [[ "$PHASES" == *" load "* ]]; then
    for name in $CASES; do
      case "$name" in q2_causal|q3_ctx1000) continue ;; esac   # no load target of their own
      stage "$name" load LOAD_LIMIT=${LOAD_LIMIT:-240} > "$RUN_OUT/$name.load.log" 2>&1
      note "load $name done"
    done
  fi
  if [[ "$PHASES" == *" served_cache "* ]]; then
    build_ops_once
    served_cache_phase
  fi
  if [[ "$PHASES" == *" served_cache_q2 "* ]]; then
    build_ops_once
    served_cache_q2_phase
  fi
  if [[ "$PHASES" == *" prompt_cache "* ]]; then
    # Last, on a quiet card: the engine's cache alone (no TensorFlow), tests then timings.
    OUT="$RUN_OUT/prompt_cache" bash benchmarks/gpu_prompt_cache.sh \
        "${PROMPT_CACHE_TEST_LIMIT:-240}" "${PROMPT_CACHE_LIMIT:-400}" --timeline \
        > "$RUN_OUT/prompt_cache.log" 2>&1
    note "prompt cache rc=$?"
    tail -30 "$RUN_OUT/prompt_cache.log" >> "$log"
  fi
  if [[ "$PHASES" == *" catalog "* ]] && [ -z "$catalog_pid" ]; then
    catalog_phase
  fi
  for name in $CASES; do cat "$RUN_OUT/$name/summary.txt" >> "$log" 2>/dev/null; done
  note "finished"
}

# shellcheck source=benchmarks/detached_run.sh
source "$ROOT/benchmarks/detached_run.sh"
detached_main acceptance.log "$0" "$@"

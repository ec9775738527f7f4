#!/usr/bin/env bash
# The GPU run of the embedded engine and its server, in one call on the GPU machine:
#   1. build the op libraries there (against that machine's torch and the carried TF);
#   2. `xgr export` qwen2-0.5b (random weights) over a 1M-item synthetic catalog, prompt 1024,
#      beam 256, compiled for CUDA in $DTYPE (bfloat16 by default), with --verify_requests: the
#      SavedModel reloaded in a fresh process (TF + custom_ops only) must return the Python
#      pipeline's items in the same dtype (exactly at float32; at 16 bits exactly but inside
#      score ties, the tolerance table's ranked-list rule);
#      meanwhile the `gpu` tests of tests/torch_call (CUDA packages, wrong-GPU errors,
#      concurrency, a small CUDA export);
#   3. benchmarks.bench_served: the SavedModel's call (its package replayed as CUDA graphs, and
#      with the graphs off) beside the pipeline over Engine.recommend, batch 1 and 8;
#      benchmarks.bench_torchcall --device=cuda (TorchCall per call, prompt hand-off);
#   4. benchmarks.load_serving against `xgr serve` on that SavedModel (batching, REST + gRPC,
#      10% malformed), open-loop rates sized from the closed loop's throughput.
# The tree there is a copy: XGR_COMMIT=<sha> names the commit every result records (over git)
# (the export's report is stamped with it too).
# Needs TF importable (PYTHONPATH) and the tensorflow-serving-api wheel in .whl/. Every stage
# runs whatever the previous one did (set +e); logs and JSON go to $OUT; a summary comes last.
# The sizes can be shrunk for a rehearsal on a CPU host: DEVICE=cpu PRESET=tiny ITEMS=3000 ...
# STAGES picks stages (default all: "tests export served bench load"), so the work can span calls
# on one warm machine: the SavedModel and the built op libraries stay under $WORK, and a later
# call copies the libraries back instead of building again. The export runs alone when
# "tests" is not in STAGES; its Inductor front end is single-threaded and takes minutes.
set +e
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 1
OUT=${OUT:-/tmp/xgr_gpu_out}
WORK=${WORK:-/tmp/xgr_gpu_work}
PY=${PY:-python3}
DEVICE=${DEVICE:-cuda:0}
PRESET=${PRESET:-qwen2-0.5b}
ITEMS=${ITEMS:-1000000}
USERS=${USERS:-64}            # the world's users: verify requests and the load test's pool
EVENTS=${EVENTS:-300}         # history events per user: enough for 255 kept items
KEEP=${KEEP:-255}             # 4 + 4 x 255 = 1024 prompt tokens
BEAM=${BEAM:-256}
TOPK=${TOPK:-300}
TOPN=${TOPN:-100}
VERIFY=${VERIFY:-16}
EXPORT_LIMIT=${EXPORT_LIMIT:-420}   # seconds; the stages after it still run
SERVED_LIMIT=${SERVED_LIMIT:-240}
PYTEST_LIMIT=${PYTEST_LIMIT:-260}
LOAD_LIMIT=${LOAD_LIMIT:-150}
BENCH_LIMIT=${BENCH_LIMIT:-120}
ATTENTION=${ATTENTION:-auto}   # the export's --attention_backend
LAYER_KERNELS=${LAYER_KERNELS:-off}  # the export's --layer_kernels
DTYPE=${DTYPE:-bfloat16}       # the export's --dtype (its verification follows the dtype's rule)
MASK=${MASK:-}                 # the export's --mask (empty: the preset's item-causal default)
MAX_BATCH=${MAX_BATCH:-64}     # the export's --max_batch
WINDOW_DAYS=${WINDOW_DAYS:-3650}  # the export's --window_days (older history events are dropped)
BATCHES=${BATCHES:-1,8}        # bench_served's batch sizes
REQUEST_EVENTS=${REQUEST_EVENTS:-}  # bench_served: shorter histories through the same SavedModel
CASE=${CASE:-}                 # names the served and serving result files
P99_TARGET=${P99_TARGET:-100}  # load_serving's latency target (ms)
RATES=${RATES:-}               # load_serving: open-loop rates (req/s) besides the fractions
RATE_FRACTIONS=${RATE_FRACTIONS:-0.5,0.8,1.0,1.2,1.5}
LOAD_BATCH=${LOAD_BATCH:-16}   # the server's --max_batch_size
LOAD_USERS=${LOAD_USERS:-$USERS}  # the load pool's users (at most the export's world)
STAGES=" ${STAGES:-tests export served bench load} "
has() { [[ "$STAGES" == *" $1 "* ]]; }
mkdir -p "$OUT" "$WORK"
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
started=$(date +%s)

gpu_label() {  # h200, h100, ...: the card that ran, for result file names
  local name
  name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
  if [[ $name =~ H([0-9]+) ]]; then echo "h${BASH_REMATCH[1]}"; else echo gpu; fi
}
note() { echo "$(( $(date +%s) - started ))s $*" | tee -a "$SUMMARY"; }

if [ -z "$XGR_SITE_READY" ] && ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/xgr_site .whl/*.whl && export PYTHONPATH=/tmp/xgr_site:$PYTHONPATH
fi
export PYTHONPATH=$ROOT:$PYTHONPATH
$PY -c "import tensorflow as tf, torch, tensorflow_serving.apis; print('tf', tf.__version__, \
'torch', torch.__version__, 'cuda', torch.cuda.is_available(), \
torch.cuda.get_device_name() if torch.cuda.is_available() else '')" 2>&1 | tail -1 | tee -a "$SUMMARY"

# Stage 1 first (the export reads the catalog into the feature graph's table, a custom op,
# before it compiles), then the gpu tests in the background beside the export.
if ls "$WORK"/ops/*.so >/dev/null 2>&1; then
  cp "$WORK"/ops/*.so custom_ops/ && note "op libraries of an earlier call reused"
else
  $PY setup.py build_ext --inplace -j 8 > "$OUT/build_and_tests.log" 2>&1
  note "build rc=$?"
  mkdir -p "$WORK/ops" && cp custom_ops/*.so "$WORK/ops/"
fi
(
  if [ "$DEVICE" != cpu ] && has tests; then
    # test_gpu_engine_package.py (the TF-free twin of the export below) is left to runs
    # without TensorFlow.
    timeout "$PYTEST_LIMIT" $PY -m pytest tests/torch_call/test_gpu.py \
        tests/torch_call/test_gpu_export.py tests/torch_call/test_beam_widths.py -m gpu -q \
        >> "$OUT/build_and_tests.log" 2>&1
    note "gpu tests rc=$? ($(grep -Eo '[0-9]+ (passed|failed|error)[^=]*' \
        "$OUT/build_and_tests.log" | tail -1))"
  fi
) &
background=$!

# The export's flags: bench_served rebuilds the same engine and requests from them.
EXPORT_FLAGS=(--out="$WORK/models/recs/1" --preset="$PRESET" --device="$DEVICE"
              --num_items="$ITEMS" --num_users="$USERS" --history_events="$EVENTS"
              --keep_last="$KEEP" --window_days="$WINDOW_DAYS" --beam_width="$BEAM" --top_k="$TOPK"
              --top_n="$TOPN" --max_batch="$MAX_BATCH" --dtype="$DTYPE" --cache_dir=)
[ -n "$MASK" ] && EXPORT_FLAGS+=(--mask="$MASK")
export_with() {  # attention backend, layer kernels, seconds
  rm -rf "$WORK/models"
  echo "$(date +%T) export with $1 attention, layer kernels $2" >> "$OUT/export.log"
  timeout "$3" $PY -m xgr_cli.main export "${EXPORT_FLAGS[@]}" --verify_requests="$VERIFY" \
      --attention_backend="$1" --layer_kernels="$2" --report_json="$OUT/export.json" \
      >> "$OUT/export.log" 2>&1
}
if has export; then
  export_started=$(date +%s)
  export_with "$ATTENTION" "$LAYER_KERNELS" "$EXPORT_LIMIT"
  rc=$?
  note "export (attention $ATTENTION, layer kernels $LAYER_KERNELS) rc=$rc ($(grep -E '^verify:' "$OUT/export.log" | cut -c1-150))"
  spent=$(( $(date +%s) - export_started ))
  if [ $rc -ne 0 ] && [ ! -f "$OUT/export.json" ] && [ $spent -lt $(( EXPORT_LIMIT / 2 )) ] \
      && { [ "$ATTENTION" != torch ] || [ "$LAYER_KERNELS" != off ]; }; then
    # A quick failure of a Triton path leaves time for the plain layer; the attention falls
    # back to plain torch only when the layer was already plain.
    fallback=$ATTENTION
    [ "$LAYER_KERNELS" = off ] && fallback=torch
    export_with "$fallback" off $(( EXPORT_LIMIT - spent ))
    note "export (attention $fallback, layer kernels off) rc=$? ($(grep -E '^verify:' "$OUT/export.log" | cut -c1-150))"
  fi
  if [ -f "$OUT/export.json" ]; then
    $PY -m benchmarks.results_file "$OUT/export.json" > /dev/null
    cp "$OUT/export.json" "$WORK/export.json"
  fi
fi
wait "$background"

# Timed stages run alone on the machine.
if has served && [ -d "$WORK/models/recs/1" ]; then
  # The anchor runs the attention the package holds (an export may have fallen back to torch).
  served_attention=$($PY -c "import json,sys; print(json.load(open(sys.argv[1]))['attention_backend'])" \
      "$WORK/export.json" 2>/dev/null || echo "$ATTENTION")
  timeout "$SERVED_LIMIT" $PY -m benchmarks.bench_served "${EXPORT_FLAGS[@]}" \
      --attention_backend="$served_attention" --verify_requests=8 --batches="$BATCHES" --repeats=30 \
      ${REQUEST_EVENTS:+--request_history_events="$REQUEST_EVENTS"} --label="$CASE" \
      --output_dir="$OUT" > "$OUT/served${CASE:+_$CASE}.log" 2>&1
  note "bench_served rc=$?"
  grep -A4 "^batch" "$OUT/served${CASE:+_$CASE}.log" | tee -a "$SUMMARY"
fi
if has bench; then
  timeout "$BENCH_LIMIT" $PY -m benchmarks.bench_torchcall --device="$DEVICE" --repeats=100 \
      --loop=50 --batches=8,1024 --cache_dir="$WORK/cache" --output_dir="$OUT" \
      > "$OUT/bench.log" 2>&1
  note "bench_torchcall rc=$?"   # the benchmark's own status (124: cut by BENCH_LIMIT)
fi

if has load && [ -d "$WORK/models/recs/1" ]; then
  timeout "$LOAD_LIMIT" $PY -m benchmarks.load_serving --model_base_path="$WORK/models/recs" \
      --num_items="$ITEMS" --num_users="$LOAD_USERS" --history_events="$EVENTS" --seed=0 \
      --users_per_request=1 --clients=32 --requests=1500 --max_seconds=12 \
      --rates="$RATES" --rate_fractions="$RATE_FRACTIONS" --rate_seconds=5 \
      --warmup_requests=8 --p99_target_ms="$P99_TARGET" \
      --max_batch_size="$LOAD_BATCH" --batch_timeout_micros=2000 \
      --label="${CASE:+${CASE}_}${LABEL:-$(gpu_label)}" --server_log="$OUT/server.log" \
      --score_dtype="$DTYPE" \
      --model_label="$PRESET random $DTYPE, prompt $(( 4 + 4 * KEEP )), beam $BEAM, $ITEMS items, top_k $TOPK, top_n $TOPN" \
      --out_dir="$OUT" >> "$OUT/bench.log" 2>&1
  note "load_serving rc=$?"
fi

if [ -f "$OUT/bench.log" ]; then
  grep -E "^(case|eager|function|saved_model|while_loop|own|hand-off)" "$OUT/bench.log" \
      | tee -a "$SUMMARY"
  sed -n '/^closed loop/,/^server exit/p' "$OUT/bench.log" | tee -a "$SUMMARY"
fi
note "done"

#!/usr/bin/env bash
# The multi-GPU benchmarks on a host with several GPUs (nvidia-h100-x2/-x4/-x8 and the H200
# kinds), in one run:
#   exports   bench_replicas and bench_batch export qwen2-0.5b (prompt 1024, beam 256, top_k
#             300, 1M items) side by side, while
#   tp        bench_tensor_parallel times a qwen2-7b shape at prompt 1024, beam 256, batch 1 on
#             1, 2 and 4 GPUs (those the host has): latency, the all-reduce's share, the same
#             items on every rank; again with the graphs off if the captured run fails;
#   replicas  bench_replicas: `xgr serve --replicas N` for N = 1, 2, 4, 8 (up to the GPUs), a
#             session workload with user keys from 8 client processes, the throughput at
#             P99 <= 100 ms per N and its scaling efficiency;
#   batch     bench_batch: `xgr batch` on a local Ray cluster, 1..N actors of one GPU each,
#             users per second per GPU beside the SavedModel called directly.
# NVLink multicast stays off (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1,
# NVSHMEM_DISABLE_NVLS=1), here and in every child.
# Needs: TensorFlow importable (PYTHONPATH; carried in parts) for replicas and batch, the
# wheels of wheels_for_device.sh (.whl/ and the parts in /tmp/xgr_parts or .whlparts/).
# Usage: `gpu_multi.sh run`, or `gpu_multi.sh start` (a new process session, outliving the
# call) then `gpu_multi.sh wait SECONDS` (archives $OUT/results.tgz, done or not).
# PHASES (default "exports tp replicas batch"); XGR_COMMIT names the commit in the results.
set +e
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 1
BASE=${BASE:-/tmp/xgr_multi}
OUT=${OUT:-$BASE/out}
PY=${PY:-python3}
PHASES=" ${PHASES:-exports tp replicas batch} "
RUN_OUT=$BASE/run_out
GPUS=$(nvidia-smi -L 2>/dev/null | grep -c "^GPU")
# The headline world: qwen2-0.5b, 200 long-term + 55 recent items = 1024-token prompts.
WORLD=(--preset=qwen2-0.5b --device=cuda:0 --items=1000000 --paths=250000 --long_items=200
       --recent_items=55 --beam_width=256 --top_k=300)

counts_upto() {  # the powers of two up to $1, comma-separated
  local n=1 out=1
  while [ $((n * 2)) -le "$1" ]; do n=$((n * 2)); out="$out,$n"; done
  echo "$out"
}

install_wheels() {  # joins the carried parts, installs every wheel into /tmp/xgr_site
  mkdir -p /tmp/xgr_parts /tmp/xgr_wheels
  cp .whlparts/* /tmp/xgr_parts/ 2>/dev/null
  for first in /tmp/xgr_parts/*.part00; do
    [ -e "$first" ] || continue
    cat "${first%.part00}".part?? > "/tmp/xgr_wheels/$(basename "${first%.part00}")"
  done
  cp .whl/*.whl /tmp/xgr_wheels/ 2>/dev/null
  ls /tmp/xgr_wheels/*.whl >/dev/null 2>&1 || return 0
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/xgr_site /tmp/xgr_wheels/*.whl
  export PYTHONPATH=/tmp/xgr_site:$PYTHONPATH
}

run() {
  mkdir -p "$RUN_OUT"
  local log=$RUN_OUT/multi.log label
  label="$(gpu_label)x$GPUS"  # h100x4, ...
  note() { echo "$(date +%T) $*" | tee -a "$log"; }
  note "start: $GPUS GPUs ($label), phases${PHASES}"
  install_wheels
  note "wheels: $(ls /tmp/xgr_wheels 2>/dev/null | tr '\n' ' ')"
  local export_pids=()
  if [[ "$PHASES" == *" exports "* ]]; then
    "$PY" setup.py build_ext --inplace -j 8 > "$RUN_OUT/build.log" 2>&1
    note "build rc=$?"
    "$PY" -m benchmarks.bench_replicas "${WORLD[@]}" --max_batch=16 --export_only \
        --work="$BASE/replicas" > "$RUN_OUT/replicas_export.log" 2>&1 & export_pids+=($!)
    "$PY" -m benchmarks.bench_batch "${WORLD[@]}" --max_batch=64 --export_only \
        --work="$BASE/batch" > "$RUN_OUT/batch_export.log" 2>&1 & export_pids+=($!)
  fi
  if [[ "$PHASES" == *" tp "* ]]; then
    local worlds
    worlds=$(counts_upto $(( GPUS < 4 ? GPUS : 4 )))
    timeout "${TP_LIMIT:-900}" "$PY" -m benchmarks.bench_tensor_parallel --worlds="$worlds" \
        --out="$RUN_OUT" --tag="$label" > "$RUN_OUT/tp.log" 2>&1
    local rc=$?
    note "tensor parallel (worlds $worlds) rc=$rc"
    if [ $rc != 0 ]; then
      timeout "${TP_LIMIT:-900}" "$PY" -m benchmarks.bench_tensor_parallel --worlds="$worlds" \
          --nocuda_graphs --out="$RUN_OUT" --tag="${label}_eager" > "$RUN_OUT/tp_eager.log" 2>&1
      note "tensor parallel, graphs off, rc=$?"
    fi
    tail -8 "$RUN_OUT/tp.log" >> "$log"
  fi
  for pid in "${export_pids[@]}"; do wait "$pid"; note "export $pid rc=$?"; done
  if [[ "$PHASES" == *" replicas "* ]]; then
    timeout "${REPLICAS_LIMIT:-1500}" "$PY" -m benchmarks.bench_replicas "${WORLD[@]}" \
        --max_batch=16 --saved_model="$BASE/replicas/saved" --work="$BASE/replicas_run" \
        --replica_counts="$(counts_upto "$GPUS")" --rates_per_replica="${RATES:-120,180,240,300}" \
        --rate_seconds=10 --population=20000 --prompt_cache_gb=20 --max_batch_size=16 \
        --client_processes=8 --workers=64 --label="$label" --out_dir="$RUN_OUT" \
        > "$RUN_OUT/replicas.log" 2>&1
    note "replicas rc=$?"
    tail -12 "$RUN_OUT/replicas.log" >> "$log"
  fi
  if [[ "$PHASES" == *" batch "* ]]; then
    timeout "${BATCH_LIMIT:-1200}" "$PY" -m benchmarks.bench_batch "${WORLD[@]}" --max_batch=64 \
        --saved_model="$BASE/batch/saved" --work="$BASE/batch_run" --users="${USERS:-20000}" \
        --rows_per_shard=1000 --batch_size=64 --actor_counts="$(counts_upto "$GPUS")" \
        --label="$label" --out_dir="$RUN_OUT" > "$RUN_OUT/batch.log" 2>&1
    note "batch rc=$?"
    tail -10 "$RUN_OUT/batch.log" >> "$log"
  fi
  note "finished"
}

# shellcheck source=benchmarks/detached_run.sh
source "$ROOT/benchmarks/detached_run.sh"
detached_main multi.log "$0" "$@"

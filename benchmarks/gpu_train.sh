#!/usr/bin/env bash
# From embeddings and logs to a trained model, at the issue's scale, on one GPU:
#   catalog   the `gpu` tests of tests/catalog_build, then bench_catalog_build: 10M items x 256
#             dims (a Gaussian mixture), residual k-means on CUDA (3 x 256 codes), the cap on
#             items per path, the quality report (target: at most 10 minutes end to end);
#   train     bench_train: a qwen2-0.5b-shape stand-in, a planted log of 1M events (50,000
#             users x 20) over 1,000 items, xgr train in bf16 for 2,000 steps of 64 at a
#             learning rate for random weights (5e-4), then xgr evaluate on the
#             held-out users beside popularity and co-occurrence; the loss curve beside the
#             result. The steps stop after TRAIN_SECONDS (default 900) so the run fits one
#             lease; the result records how many ran.
# Needs TensorFlow importable for train (PYTHONPATH; carried in parts: the feature graph builds
# the training examples); catalog needs no TF. faiss is not on the GPU host: the catalog run
# skips its side (its CPU comparison is in results/catalog_build_*_cpu.json).
# Usage: `gpu_train.sh run`, or `gpu_train.sh start` then `gpu_train.sh wait SECONDS`
# (archives $OUT/results.tgz, done or not). PHASES (default "catalog train").
set +e
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 1
BASE=${BASE:-/tmp/xgr_train}
OUT=${OUT:-$BASE/out}
PY=${PY:-python3}
PHASES=" ${PHASES:-catalog train} "
RUN_OUT=$BASE/run_out

run() {
  mkdir -p "$RUN_OUT"
  local log=$RUN_OUT/train.log label
  label=$(gpu_label)
  note() { echo "$(date +%T) $*" | tee -a "$log"; }
  note "start: phases${PHASES}on $label"
  if [[ "$PHASES" == *" catalog "* ]]; then
    "$PY" -m pytest -m gpu tests/catalog_build > "$RUN_OUT/catalog_tests.log" 2>&1
    note "catalog gpu tests rc=$? ($(tail -1 "$RUN_OUT/catalog_tests.log"))"
    timeout "${CATALOG_LIMIT:-1200}" "$PY" -m benchmarks.bench_catalog_build \
        --items="${ITEMS:-10000000}" --dim="${DIM:-256}" --device=cuda --nofaiss \
        --tag="$label" --out="$RUN_OUT" --work_dir="$BASE/catalog" \
        > "$RUN_OUT/catalog_build.log" 2>&1
    note "catalog build rc=$?"
    tail -15 "$RUN_OUT/catalog_build.log" >> "$log"
    rm -rf "$BASE/catalog"
  fi
  if [[ "$PHASES" == *" train "* ]]; then
    # The feature graph's C++ ops build the training examples: built once in this tree.
    build_ops_once
    note "op libraries: $(ls custom_ops/*.so 2>/dev/null | wc -l) built"
    rm -rf "$BASE/work"   # xgr extend_vocab writes into a new folder: a second run starts clean
    timeout "${TRAIN_LIMIT:-2400}" "$PY" -m benchmarks.bench_train --preset=qwen2-0.5b \
        --device=cuda --users="${USERS:-50000}" --events_per_user=20 \
        --catalog_items="${CATALOG_ITEMS:-1000}" --keep_last=50 --steps="${STEPS:-2000}" \
        --batch_size=64 --learning_rate=5e-4 \
        --warmup_steps=100 --mixed_precision=bf16 --max_requests=1000 --beam_width=64 \
        --top_k=50 --checkpoint_every=1000 --max_train_seconds="${TRAIN_SECONDS:-900}" \
        --work="$BASE/work" --label="$label" \
        --out_dir="$RUN_OUT" > "$RUN_OUT/bench_train.log" 2>&1
    note "train rc=$?"
    tail -10 "$RUN_OUT/bench_train.log" >> "$log"
  fi
  note "finished"
}

# shellcheck source=benchmarks/detached_run.sh
source "$ROOT/benchmarks/detached_run.sh"
detached_main train.log "$0" "$@"

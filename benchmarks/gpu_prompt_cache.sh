#!/usr/bin/env bash
# One GPU call for the prompt-KV cache: the `gpu` tests of the paged kernels and of the
# engine's cached search on CUDA (bf16, captured graphs), then benchmarks.bench_prompt_cache
# (a hit beside the uncached engine). Each stage runs even if the first failed; logs and the
# JSON go to $OUT.
# The tree there is a copy without .git: pass the commit it was copied from.
#   XGR_COMMIT=<sha> bash benchmarks/gpu_prompt_cache.sh [test timeout s] [bench timeout s] [flags...]
set +e
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/prompt_cache_out}
mkdir -p "$OUT"
TEST_LIMIT=${1:-360}
BENCH_LIMIT=${2:-360}
shift 2 2>/dev/null
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv | tee "$OUT/gpu.txt"
start=$(date +%s)
timeout "$TEST_LIMIT" python3 -m pytest -m gpu --timeout=150 -p no:cacheprovider \
  tests/kernels/test_paged_attention.py tests/torch_engine/test_prompt_cache.py 2>&1 \
  | tee "$OUT/tests.log" | tail -30
echo "tests: rc=${PIPESTATUS[0]} $(( $(date +%s) - start )) s"
start=$(date +%s)
timeout "$BENCH_LIMIT" python3 -m benchmarks.bench_prompt_cache --out="$OUT" "$@" 2>&1 \
  | grep -v "it/s]" | tee "$OUT/bench.log" | tail -40
echo "bench: rc=${PIPESTATUS[0]} $(( $(date +%s) - start )) s"

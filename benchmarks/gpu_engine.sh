#!/usr/bin/env bash
# One GPU call for the engine: GPU tests of the engine and the selection kernel, then
# benchmarks.bench_engine. Each stage runs even if an earlier one failed; logs and the JSON go
# to $OUT. The tree there is a copy without .git: pass the commit it was copied from.
#   XGR_COMMIT=<sha> bash benchmarks/gpu_engine.sh [test timeout s] [bench timeout s] [flags...]
set +e
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/engine_out}
mkdir -p "$OUT"
TEST_LIMIT=${1:-150}
BENCH_LIMIT=${2:-300}
shift 2 2>/dev/null
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)"
start=$(date +%s)
# TEST_K (optional): a pytest -k expression selecting a subset of the GPU tests.
timeout "$TEST_LIMIT" python3 -m pytest -m gpu --timeout=120 -p no:cacheprovider ${TEST_K:+-k "$TEST_K"} \
  tests/torch_engine tests/kernels/test_constrained_topk.py 2>&1 | tee "$OUT/tests.log" | tail -30
echo "tests: rc=${PIPESTATUS[0]} $(( $(date +%s) - start )) s"
start=$(date +%s)
timeout "$BENCH_LIMIT" python3 -m benchmarks.bench_engine --out="$OUT" "$@" 2>&1 \
  | grep -v "it/s]" | tee "$OUT/bench.log" | tail -80
echo "bench: rc=${PIPESTATUS[0]} $(( $(date +%s) - start )) s"

#!/usr/bin/env bash
# One device call for the attention kernels: their GPU tests, then benchmark parts.
#   bash benchmarks/gpu_kernels.sh sweep            # tests + tile variants at the targets
#   bash benchmarks/gpu_kernels.sh decode,prefill   # tests + the full grid with anchors
# Further arguments go to benchmarks.bench_attention (e.g. --flex_batches= to skip
# FlexAttention). Logs and the result JSON go to $OUT (default /tmp/attention_out); a summary
# prints last. The tree there is a copy: XGR_COMMIT=<sha> names its commit (it outranks git).
set +e
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/attention_out}
mkdir -p "$OUT"
parts=${1:-sweep}
shift
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
start=$(date +%s)
# Three workers: the float64 references of the largest grid cases take up to ~90 GB of the
# GPU's memory, and 8 workers over tests/kernels ran out of it.
python3 -m pytest tests/kernels/test_decode_attention.py tests/kernels/test_prefill_attention.py \
  tests/kernels/test_custom_ops.py tests/kernels/test_aoti_package.py -m gpu -n 3 -q \
  >"$OUT/gpu_tests.log" 2>&1
tests_rc=$?
tests_s=$(( $(date +%s) - start ))
python3 -m benchmarks.bench_attention --parts="$parts" --out="$OUT" "$@" >"$OUT/bench.log" 2>&1
bench_rc=$?
echo "== gpu tests: rc=$tests_rc in ${tests_s}s"
grep -iE "passed|failed|error" "$OUT/gpu_tests.log" | tail -30
echo "== bench ($parts): rc=$bench_rc in $(( $(date +%s) - start - tests_s ))s"
tr "\r" "\n" <"$OUT/bench.log" | grep -v "it/s]\|s/it]" | tail -90

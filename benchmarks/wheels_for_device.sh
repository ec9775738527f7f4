#!/usr/bin/env bash
# The Python wheels the multi-GPU benchmarks need on a GPU host that has no package registry:
# the TF Serving client (replicas), Ray and the parts of jsonschema it needs (the batch job).
# Run from the repository root on a machine that can download; it writes (git-ignored):
#   .whl/        the small wheels, carried in the last call;
#   .whlparts/   each wheel over 40 MB cut in parts (Ray's is ~79 MB), one part a call.
# On the GPU host, copy every part but those of the last call to /tmp/xgr_parts before the
# run (`mkdir -p /tmp/xgr_parts && cp .whlparts/P /tmp/xgr_parts/`, carrying P); the driver
# (gpu_multi.sh) joins /tmp/xgr_parts and .whlparts, then installs everything into
# /tmp/xgr_site. TensorFlow travels the same way, in parts of its own (see gpu_serving.sh).
# Extra wheels: WHEELS="name==version ..." bash benchmarks/wheels_for_device.sh
set -euo pipefail
cd "$(dirname "$0")/.."
for pattern in /.whl/ /.whlparts/; do
  grep -qx "$pattern" .git/info/exclude 2>/dev/null || printf '%s\n' "$pattern" >> .git/info/exclude
done
WHEELS=${WHEELS:-"tensorflow-serving-api==2.21.0 ray==2.58.0 jsonschema==4.26.0
jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1"}
plat=(--only-binary=:all: --python-version 3.12 --implementation cp
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
mkdir -p .whl .whlparts
# shellcheck disable=SC2086
python3 -m pip download -q --no-deps "${plat[@]}" -d .whl $WHEELS
for wheel in .whl/*.whl; do
  if [ "$(stat -c %s "$wheel")" -gt $((40 * 1024 * 1024)) ]; then
    split -b 40M -d "$wheel" ".whlparts/$(basename "$wheel").part"
    rm "$wheel"
  fi
done
echo "small wheels (carry .whl in the last call):"; ls -1 .whl
echo "parts (one a call, into /tmp/xgr_parts; the last may travel with the last call):"
ls -1 .whlparts

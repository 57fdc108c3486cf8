#!/usr/bin/env bash
# Issue 17 on the two-GPU host, from the repository root (logs and JSON in $OUT):
#   bash benchmarks/gpu_multi.sh scale   # llm-prefill: one GPU vs --gpus all, wall time and winners
#   bash benchmarks/gpu_multi.sh hosts   # two "hosts" (CUDA_VISIBLE_DEVICES=0 / 1) on one PostgreSQL
# The GPU machine has no PostgreSQL and no psycopg: put their wheels in .gpu-wheels/ first, e.g.
#   pip download --no-deps -d .gpu-wheels --only-binary=:all: --python-version 3.12 \
#       --platform manylinux2014_x86_64 pgserver psycopg psycopg-binary
# (pgserver bundles PostgreSQL's binaries; its own Python API is not used).
set -euo pipefail
mode=${1:?scale or hosts}
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu-wheels/*.whl 2>/dev/null || true
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpus.txt"
if [ "$mode" = hosts ]; then
    chmod -R a+rX /tmp/site
    eval "$(FA_AUTOTUNE_PG_BIN=/tmp/site/pgserver/pginstall/bin .ci/postgres.sh start)"
    trap 'FA_AUTOTUNE_PG_BIN=/tmp/site/pgserver/pginstall/bin .ci/postgres.sh stop "$FA_AUTOTUNE_TEST_PG_DIR"' EXIT
    python3 benchmarks/multi_gpu.py hosts --preset "${PRESET:-quick}" --trials "${TRIALS:-16}" --jobs 8 --out "$OUT"
else
    python3 benchmarks/multi_gpu.py scale --preset "${PRESET:-llm-prefill}" --trials "${TRIALS:-40}" --jobs 16 --out "$OUT"
fi

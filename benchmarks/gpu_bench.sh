#!/usr/bin/env bash
# GPU evidence for "fastest attention" and FP8, in steps that each fit one 10-minute device
# command (run on the GPU machine from the repository root, with $OUT set):
#   STEP=tutorial PART=d64   bash benchmarks/gpu_bench.sh   # tune the tutorial-list baseline, D=64 problems
#   STEP=tutorial PART=d128  bash benchmarks/gpu_bench.sh   # ... D=128 problems
#   STEP=retune              bash benchmarks/gpu_bench.sh   # resume tuning llm-prefill in the full space
#   STEP=bench               bash benchmarks/gpu_bench.sh   # every provider side by side, all 24 problems
#   STEP=fp8                 bash benchmarks/gpu_bench.sh   # FP8 recipes vs tuned fp16 and cuDNN
# Tuning state lives in .gpu-db/tune.sqlite (carry it between calls; every step resumes);
# a clean copy of it and every output land in $OUT.
set -uo pipefail
DB="sqlite:///$PWD/.gpu-db/tune.sqlite"
LIMIT=${LIMIT:-560}
mkdir -p .gpu-db "$OUT"
export FA_AUTOTUNE_DB="$DB"
case "${STEP:?set STEP to tutorial, retune, bench or fp8}" in
  tutorial)  # the bench answers its tutorial column from these studies afterwards
    timeout "$LIMIT" python3 -m fa_autotune bench --preset llm-prefill --providers tutorial,cudnn \
      --match "_${PART:?set PART to d64 or d128}_" --rep-ms 50 --out "$OUT/tutorial-$PART" 2>&1 | tail -40 ;;
  retune)
    timeout "$LIMIT" python3 -m fa_autotune tune --preset llm-prefill --trials "${TRIALS:-40}" --seed 0 \
      --jobs "${JOBS:-14}" --quiet 2>&1 | tail -32 ;;
  bench)
    timeout "$LIMIT" python3 -m fa_autotune bench --preset llm-prefill --rep-ms 100 --out "$OUT/bench" 2>&1 | tail -60 ;;
  fp8)
    timeout "$LIMIT" python3 benchmarks/fp8_bench.py --out "$OUT/fp8" 2>&1 | tail -60 ;;
  *) echo "unknown STEP=$STEP" >&2; exit 2 ;;
esac
status=$?
python3 - "$PWD/.gpu-db/tune.sqlite" "$OUT/tune.sqlite" <<'PY'
import sqlite3, sys
sqlite3.connect(sys.argv[1]).execute("VACUUM INTO ?", (sys.argv[2],))
PY
exit $status

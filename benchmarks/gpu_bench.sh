#!/usr/bin/env bash
# GPU evidence for "fastest attention" and FP8, in steps that each fit one 10-minute device
# command (run on the GPU machine from the repository root, with $OUT set). On a host with
# two GPUs, run the two parts of a step at once (CUDA_VISIBLE_DEVICES=0 / 1), then merge:
#   STEP=tutorial PART=d64   bash benchmarks/gpu_bench.sh   # tune the tutorial-list baseline, D=64 problems
#   STEP=tutorial PART=d128  bash benchmarks/gpu_bench.sh   # ... D=128 problems
#   STEP=retune              bash benchmarks/gpu_bench.sh   # resume tuning llm-prefill in the full space
#   STEP=bench  PART=d64     bash benchmarks/gpu_bench.sh   # every provider side by side, D=64 problems
#   STEP=bench  PART=d128    bash benchmarks/gpu_bench.sh   # ... D=128 (an interrupted part resumes: carry .gpu-db)
#     then: fa-autotune bench --merge OUT1/bench-d64 OUT2/bench-d128 --out results/
#   STEP=fp8    PART=4096    bash benchmarks/gpu_bench.sh   # FP8 recipes vs tuned fp16 and cuDNN, N=4096
#   STEP=fp8    PART=16384   bash benchmarks/gpu_bench.sh   # ... N=16384
#     then: python3 benchmarks/fp8_bench.py --merge OUT1/fp8-4096 OUT2/fp8-16384 --out results/
# Tuning state lives in .gpu-db/tune.sqlite (carry it between calls; every step resumes);
# a clean copy of it and every output land in $OUT. Parts running at once each need their
# own copy of the database (DB=path).
set -uo pipefail
DB_FILE=${DB:-$PWD/.gpu-db/tune.sqlite}
LIMIT=${LIMIT:-560}
mkdir -p "$(dirname "$DB_FILE")" "$OUT"
export FA_AUTOTUNE_DB="sqlite:///$DB_FILE"
case "${STEP:?set STEP to tutorial, retune, bench or fp8}" in
  tutorial)  # the bench answers its tutorial column from these studies afterwards
    timeout "$LIMIT" python3 -m fa_autotune bench --preset llm-prefill --providers tutorial,cudnn \
      --match "_${PART:?set PART to d64 or d128}_" --rep-ms 50 --out "$OUT/tutorial-$PART" 2>&1 | tail -40 ;;
  retune)
    timeout "$LIMIT" python3 -m fa_autotune tune --preset llm-prefill --trials "${TRIALS:-40}" --seed 0 \
      --jobs "${JOBS:-14}" --quiet 2>&1 | tail -32 ;;
  bench)  # kept in the carried .gpu-db folder so that the next command can --resume it
    timeout "$LIMIT" python3 -m fa_autotune bench --preset llm-prefill --match "_${PART:?set PART to d64 or d128}_" \
      --rep-ms 100 --resume --out ".gpu-db/bench-$PART" 2>&1 | tail -60
    cp -r ".gpu-db/bench-$PART" "$OUT/" ;;
  fp8)
    timeout "$LIMIT" python3 benchmarks/fp8_bench.py --seqlens "${PART:?set PART to 4096 or 16384}" --rounds 2 \
      --out "$OUT/fp8-$PART" 2>&1 | tail -60 ;;
  *) echo "unknown STEP=$STEP" >&2; exit 2 ;;
esac
status=$?
python3 - "$DB_FILE" "$OUT/tune.sqlite" <<'PY'
import sqlite3, sys
sqlite3.connect(sys.argv[1]).execute("VACUUM INTO ?", (sys.argv[2],))
PY
exit $status

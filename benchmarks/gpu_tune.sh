#!/usr/bin/env bash
# GPU evidence for the tuner (run on the GPU machine from the repository root):
#   1. exhaustive grids on two problems (for benchmarks/sample_efficiency.py),
#   2. the LLM-prefill preset with TPE; resumable: re-run to continue where a timeout stopped.
# DB: .gpu-db/tune.sqlite (carry it between calls); a clean copy and logs land in $OUT.
set -uo pipefail
DB="sqlite:///$PWD/.gpu-db/tune.sqlite"
JOBS=${JOBS:-12}
PRESET_TIMEOUT=${PRESET_TIMEOUT:-420}
mkdir -p .gpu-db "$OUT"
if [ "${SKIP_GRID:-0}" != 1 ]; then
  python3 -m fa_autotune tune --sampler grid --study grid --batch 4 --heads 16 --seqlen 4096 --head-dim 128 \
    --dtype float16 --db "$DB" --jobs "$JOBS" --quiet --retime-top 1 2>&1 | tee -a "$OUT/grid.log" | tail -6
  python3 -m fa_autotune tune --sampler grid --study grid --batch 4 --heads 32 --seqlen 4096 --head-dim 64 \
    --dtype bfloat16 --causal --db "$DB" --jobs "$JOBS" --quiet --retime-top 1 2>&1 | tee -a "$OUT/grid.log" | tail -6
fi
timeout "$PRESET_TIMEOUT" python3 -m fa_autotune tune --preset llm-prefill --trials "${TRIALS:-30}" --seed 0 \
  --db "$DB" --jobs "$JOBS" --quiet 2>&1 | tee -a "$OUT/prefill.log" | tail -32
python3 - "$PWD/.gpu-db/tune.sqlite" "$OUT/tune.sqlite" <<'PY'
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1])
conn.execute("VACUUM INTO ?", (sys.argv[2],))
PY

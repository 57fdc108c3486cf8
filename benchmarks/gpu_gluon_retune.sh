#!/usr/bin/env bash
# Re-tune the shipped H200 file's llm-prefill problems (MATCH, default d128; MATCH= for all)
# with Gluon in the search space, TRIALS trials each (default 4), and bench them against cuDNN
# with the new file, one device command from the repository root with $OUT set. Before it, on any machine (no GPU needed):
#   fa-autotune import tuning_db/nvidia-h200.attn_fwd.json --db sqlite:///.gpu-db/h200.sqlite
# and carry .gpu-db/. The warm start measures the Gluon default, the Triton default and the
# shipped winner of each problem first; the export keeps the other problems' entries as they
# were. Afterwards copy $OUT/export/nvidia-h200.attn_fwd.json over tuning_db/.
set -uo pipefail
mkdir -p /tmp/fa
export FA_AUTOTUNE_CACHE=/tmp/fa/kernels
DB=sqlite:///$PWD/.gpu-db/h200.sqlite
MATCH=${MATCH-d128}
match=()
[ -n "$MATCH" ] && match=(--match "$MATCH")
timeout "${TUNE_S:-200}" python3 -m fa_autotune tune --preset llm-prefill "${match[@]}" --trials "${TRIALS:-4}" --jobs 14 \
  --seed 0 --db "$DB" --quiet > "$OUT/tune.log" 2>&1
echo "tune exit $?" >> "$OUT/tune.log"
cp .gpu-db/h200.sqlite "$OUT/"
python3 -m fa_autotune export --db "$DB" --out "$OUT/export" >> "$OUT/tune.log" 2>&1
cp "$OUT/export/nvidia-h200.attn_fwd.json" tuning_db/nvidia-h200.attn_fwd.json  # on the device's copy
FA_AUTOTUNE_DB="sqlite:////tmp/fa/none.sqlite" timeout "${BENCH_S:-100}" python3 -m fa_autotune bench \
  --preset llm-prefill "${match[@]}" --providers tuned,cudnn --rep-ms 100 --out "$OUT/bench" > "$OUT/bench.log" 2>&1
echo "bench exit $?" >> "$OUT/bench.log"
tail -20 "$OUT/tune.log"; tail -22 "$OUT/bench.log"

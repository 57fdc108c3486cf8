#!/usr/bin/env bash
# The GQA set of issue 13, dispatched through the shipped file without re-tuning (none of
# these problems is in any preset): tuned (what attention() picks) against cuDNN, one
# device command from the repository root with $OUT set.
set -uo pipefail
export FA_AUTOTUNE_CACHE=/tmp/fa/kernels FA_AUTOTUNE_DB="sqlite:////tmp/fa/none.sqlite"
mkdir -p /tmp/fa
i=0
for problem in "--batch 2 --heads 32 --kv-heads 8 --seqlen 8192 --causal" \
               "--batch 4 --heads 28 --kv-heads 4 --seqlen 3000 --causal" \
               "--batch 1 --heads 32 --kv-heads 8 --seqlen 32768 --causal" \
               "--batch 8 --heads 32 --kv-heads 8 --seqlen 2048"; do
  i=$((i + 1))
  # shellcheck disable=SC2086
  timeout 60 python3 -m fa_autotune bench $problem --head-dim 128 --dtype bf16 --providers tuned,cudnn \
    --rep-ms 100 --out "$OUT/gqa$i" > "$OUT/gqa$i.log" 2>&1
  grep -E "^\| b" "$OUT/gqa$i/bench.md"; grep -E "tuned:" "$OUT/gqa$i/bench.md"
done

#!/usr/bin/env bash
# GPU evidence for the Gluon FlashAttention-3 forward (issue 13), one device command on one
# H200, from the repository root with $OUT set:
#   1. the GPU test suite (the Gluon matrix included);
#   2. the tuner end to end with Gluon in the space (warm start enqueues the Gluon default);
#   3. `bench --preset llm-prefill`: the shipped tuned winners (Triton), the built-in default
#      (Gluon at D=128) and cuDNN side by side, every output checked first.
# Each step has its own time limit (`bench --resume --out DIR` continues an interrupted step 3).
set -uo pipefail
mkdir -p "$OUT" /tmp/fa
export FA_AUTOTUNE_CACHE=/tmp/fa/kernels
timeout "${PYTEST_S:-170}" python3 -m pytest -m gpu -n 8 -q -p no:cacheprovider tests/ > "$OUT/pytest-gpu.log" 2>&1
echo "pytest exit $?" >> "$OUT/pytest-gpu.log"
timeout "${TUNE_S:-80}" python3 -m fa_autotune tune --batch 4 --heads 16 --kv-heads 4 --seqlen 4096 --head-dim 128 \
  --dtype bf16 --causal --trials 6 --jobs 8 --seed 0 --db "sqlite:///$OUT/tune.sqlite" --quiet > "$OUT/tune.log" 2>&1
echo "tune exit $?" >> "$OUT/tune.log"
python3 -m fa_autotune query trials --db "sqlite:///$OUT/tune.sqlite" >> "$OUT/tune.log" 2>&1
FA_AUTOTUNE_DB="sqlite:////tmp/fa/none.sqlite" timeout "${BENCH_S:-270}" python3 -m fa_autotune bench \
  --preset llm-prefill --providers tuned,default,cudnn --rep-ms 100 --out "$OUT/bench" > "$OUT/bench.log" 2>&1
echo "bench exit $?" >> "$OUT/bench.log"
tail -4 "$OUT/pytest-gpu.log"; tail -30 "$OUT/tune.log"; tail -40 "$OUT/bench.log"

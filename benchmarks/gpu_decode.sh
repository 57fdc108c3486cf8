#!/usr/bin/env bash
# Tune the decode `serving` preset on this GPU, export it, and bench attention_with_kvcache
# (dispatched) against SDPA cuDNN/flash: what produced tuning_db/nvidia-h200.attn_decode.json
# and benchmarks/results/2026-12-01-h200-decode-bench/results.md. Run from the repository root on the
# GPU machine; OUT defaults to ./decode-out.
set -euo pipefail
OUT=${OUT:-decode-out}
mkdir -p "$OUT/db"
python3 -m fa_autotune tune --space decode --preset serving --trials 28 --db "sqlite:///$OUT/db/decode.sqlite"
python3 -m fa_autotune export --db "sqlite:///$OUT/db/decode.sqlite" --out "$OUT/export"
FA_AUTOTUNE_CONFIG_DIR="$OUT/export" python3 benchmarks/decode_bench.py --out "$OUT/bench"
# The config sweep behind the decode defaults (benchmarks/results/2026-12-01-h200-decode-sweep/):
python3 benchmarks/decode_sweep.py --out "$OUT/sweep"

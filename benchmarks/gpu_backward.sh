#!/usr/bin/env bash
# The backward on the GPU: its correctness matrix, a tune of the backward presets, and the
# side-by-side bench against SDPA cuDNN / flash and FlexAttention. Run from the repository
# root on the GPU machine; OUT defaults to ./bwd-out.
set -euo pipefail
OUT=${OUT:-bwd-out}
mkdir -p "$OUT/db"
python3 -m pytest -q -m gpu tests/runtime/test_backward.py tests/runtime/test_training.py
python3 -m fa_autotune tune --space bwd --preset quick --trials 24 --db "sqlite:///$OUT/db/bwd.sqlite"
python3 -m fa_autotune export --db "sqlite:///$OUT/db/bwd.sqlite" --out "$OUT/export"
FA_AUTOTUNE_CONFIG_DIR="$OUT/export" python3 -m fa_autotune bench --space bwd --preset quick \
    --providers tuned,cudnn,flash,flex --out "$OUT/bench"

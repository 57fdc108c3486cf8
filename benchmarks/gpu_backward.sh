#!/usr/bin/env bash
# The backward on the GPU: its correctness matrix and training test, the per-pass sweep, the
# training check, a tune of the quick backward preset, and the side-by-side bench against SDPA
# cuDNN / flash and FlexAttention on llm-prefill. Run from the repository root on the GPU
# machine; OUT defaults to ./bwd-out. (About 9 minutes on an H200.)
set -euo pipefail
OUT=${OUT:-bwd-out}
mkdir -p "$OUT/db"
python3 -m pytest -q -m gpu tests/runtime/test_backward.py tests/runtime/test_training.py
python3 benchmarks/bwd_sweep.py --out "$OUT/sweep" --quick
python3 benchmarks/train_check.py --out "$OUT/train"
python3 -m fa_autotune tune --space bwd --preset quick --trials 8 --db "sqlite:///$OUT/db/bwd.sqlite"
python3 -m fa_autotune bench --space bwd --preset llm-prefill --providers tuned,cudnn,flash,flex --out "$OUT/bench"

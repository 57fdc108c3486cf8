#!/usr/bin/env bash
# GPU evidence that the package reorganisation changed no behaviour (issue 12), in one device
# command on a two-GPU host, from the repository root with $OUT set and the old tree (b99ad99)
# unpacked in .gpu-baseline/ (git archive b99ad99 fa_autotune templates search_spaces tuning_db
# benchmarks/dispatch_overhead.py pyproject.toml | tar -x -C .gpu-baseline):
#   GPU 0: the GPU test suite and a small tune on this tree, then dispatch overhead of both trees;
#   GPU 1: `bench --preset quick`, old and new tree alternating, twice each.
set -uo pipefail
mkdir -p "$OUT" /tmp/fa
BENCH="--preset quick --providers tuned,default,cudnn,flash --rep-ms 200"
export FA_AUTOTUNE_DB="sqlite:////tmp/fa/none.sqlite"  # no database: the shipped files answer
(
  export CUDA_VISIBLE_DEVICES=1
  for round in 1 2; do
    (cd .gpu-baseline && FA_AUTOTUNE_CACHE=/tmp/fa/k-old python3 -m fa_autotune bench $BENCH --out /tmp/fa/before$round)
    FA_AUTOTUNE_CACHE=/tmp/fa/k-new python3 -m fa_autotune bench $BENCH --out /tmp/fa/after$round
  done > /tmp/fa/bench.log 2>&1
) &
bench=$!
CUDA_VISIBLE_DEVICES=0 FA_AUTOTUNE_CACHE=/tmp/fa/k-test timeout 420 python3 -m pytest -m gpu -n 8 -q tests/ \
  > "$OUT/pytest-gpu.log" 2>&1
echo "pytest exit $?" >> "$OUT/pytest-gpu.log"
# The tuner end to end on the GPU (compile pool and device worker are child processes).
CUDA_VISIBLE_DEVICES=0 FA_AUTOTUNE_CACHE=/tmp/fa/k-test timeout 240 python3 -m fa_autotune tune --batch 2 --heads 8 \
  --seqlen 1024 --head-dim 64 --dtype bf16 --causal --trials 8 --jobs 8 --seed 0 --db sqlite:////tmp/fa/tune.sqlite \
  --quiet > /tmp/fa/tune.log 2>&1
echo "tune exit $?" >> /tmp/fa/tune.log
python3 -m fa_autotune query failures --db sqlite:////tmp/fa/tune.sqlite >> /tmp/fa/tune.log 2>&1
wait $bench
python3 benchmarks/before_after.py --run before /tmp/fa/before1 --run after /tmp/fa/after1 \
  --run before /tmp/fa/before2 --run after /tmp/fa/after2 --out /tmp/fa/ba \
  --note "before: b99ad99 (flat layout, host code rendered into each kernel); after: this tree" > /dev/null
for tree in old new; do  # host-bound: alone on the host, one after the other
  dir=.; [ $tree = old ] && dir=.gpu-baseline
  (cd $dir && CUDA_VISIBLE_DEVICES=0 FA_AUTOTUNE_CACHE=/tmp/fa/k-$tree python3 benchmarks/dispatch_overhead.py \
    --out /tmp/fa/overhead-$tree) >> /tmp/fa/overhead.log 2>&1
done
tar czf "$OUT/results.tgz" -C /tmp/fa ba before1 after1 before2 after2 overhead-old overhead-new bench.log overhead.log tune.log
cat /tmp/fa/ba/before_after.md /tmp/fa/overhead-old/dispatch_overhead.md /tmp/fa/overhead-new/dispatch_overhead.md
tail -5 "$OUT/pytest-gpu.log"; tail -25 /tmp/fa/tune.log

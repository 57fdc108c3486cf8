"""Issue 16's training check on the GPU: the GPT of tests/runtime/test_training.py (4 layers,
512 wide, 8 query / 2 KV heads of 64, 512 tokens, fp32 weights under bf16 autocast) trained
from one seed with fa_autotune's attention and with SDPA's cuDNN and flash kernels.

Usage: python3 benchmarks/train_check.py --out DIR [--steps 200]
Writes DIR/train_check.json and DIR/train_check.md (loss every 20 steps and the test's
comparison: early gap to the cuDNN curve against SDPA flash's, final losses).
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch
import triton
from torch.nn.attention import SDPBackend

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "runtime"))
from test_training import compare_curves, train  # noqa: E402  (the model and criterion the tests use)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    kwargs = dict(steps=args.steps, device="cuda", dim=512, heads=8, kv_heads=2, layers=4, tokens=513, batch=8,
                  lr=1e-3, autocast=torch.bfloat16)
    curves, seconds = {}, {}
    for name, use_ours, backend in (("fa_autotune", True, None), ("sdpa_cudnn", False, SDPBackend.CUDNN_ATTENTION),
                                    ("sdpa_flash", False, SDPBackend.FLASH_ATTENTION)):
        start = time.time()
        curves[name] = train(use_ours, sdpa_backend=backend, **kwargs)
        seconds[name] = time.time() - start
    ours = compare_curves(curves["fa_autotune"], curves["sdpa_cudnn"], curves["sdpa_flash"])
    meta = dict(date=time.strftime("%Y-%m-%d"), gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                triton=triton.__version__, python=platform.python_version(), model=dict(kwargs, autocast="bfloat16"))
    (args.out / "train_check.json").write_text(json.dumps(dict(meta=meta, curves=curves, comparison=ours,
                                                               seconds=seconds), indent=1))
    every = range(0, args.steps, 20)
    lines = [f"# Training check, {meta['date']}, {meta['gpu']} (torch {meta['torch']}, triton {meta['triton']})", "",
             "GPT of tests/runtime/test_training.py: 4 layers, 512 wide, 8/2 heads of 64, 512 tokens, batch 8, "
             "AdamW lr 1e-3, fp32 weights under bf16 autocast, seed 0. `python3 benchmarks/train_check.py --out DIR`.", "",
             "| step | " + " | ".join(curves) + " |", "|---" * (len(curves) + 1) + "|"]
    lines += [f"| {i} | " + " | ".join(f"{c[i]:.4f}" for c in curves.values()) + " |" for i in every]
    lines += [f"| {args.steps - 1} | " + " | ".join(f"{c[-1]:.4f}" for c in curves.values()) + " |", "",
              f"First 30 steps, largest relative gap to the SDPA cuDNN curve: fa_autotune {ours['early_gap']:.4f}, "
              f"SDPA flash {ours['early_noise']:.4f} (the bf16 noise floor). Median loss of the last 20 steps: "
              f"fa_autotune {ours['end']:.4f}, SDPA cuDNN {ours['end_ref']:.4f}, SDPA flash {ours['end_other']:.4f} "
              f"(from {ours['first']:.4f})."]
    (args.out / "train_check.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

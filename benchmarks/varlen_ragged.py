"""attention_varlen on 64 packed sequences: the varlen_bench lengths, the same rounded up to
128-row tiles, all 1024 and all 1088 tokens, against dense attention() on 64 x 1024 (bf16, 32/8
heads, D 128, lengths unchecked). Equal lengths isolate the varlen kernel from ragged tiles.
Every output is checked against float32 attention (per sequence) before it is timed.

Usage: python3 benchmarks/varlen_ragged.py   (prints one line per case)
"""
import torch

import fa_autotune
from fa_autotune.tune.measure import time_callable
from fa_autotune.tune.reference import compare, reference_attention

HQ, HKV, D = 32, 8, 128


def checked_ms(call, ref, what: str) -> float:
    """Median ms of ``call`` once its output is within bf16's tolerance of float32 ``ref``."""
    report = compare(call(), ref)
    if not report.passes("bfloat16"):
        raise SystemExit(f"{what} output off the float32 reference: {report}")
    return time_callable(call).median_ms


def check_varlen(out, q, k, v, lens, causal):
    """Each sequence's rows against float32 attention over that sequence alone."""
    refs, start = [], 0
    for n in lens:
        views = (t[start:start + n].unsqueeze(0).transpose(1, 2) for t in (q, k, v))
        refs.append(reference_attention(*views, causal=causal)[0][0].transpose(0, 1))
        start += n
    report = compare(out, torch.cat(refs))
    if not report.passes("bfloat16"):
        raise SystemExit(f"attention_varlen output off the float32 reference: {report}")


def main() -> None:
    gen = torch.Generator().manual_seed(0)
    torch.randint(256, 4097, (16,), generator=gen)  # varlen_bench draws its 16-sequence case first
    lengths = torch.randint(64, 2049, (64,), generator=gen).tolist()
    cases = {"as bench": lengths, "rounded up to 128": [-(-n // 128) * 128 for n in lengths],
             "all 1024": [1024] * 64, "all 1088": [1088] * 64}
    for causal in (False, True):
        for name, lens in cases.items():
            total = sum(lens)
            q = torch.randn(total, HQ, D, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(total, HKV, D, device="cuda", dtype=torch.bfloat16)
            v = torch.randn_like(k)
            cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), device="cuda", dtype=torch.int32)

            def call():
                return fa_autotune.attention_varlen(q, k, v, cu, cu, max(lens), max(lens), causal=causal,
                                                    check_lengths=False)

            check_varlen(call(), q, k, v, lens, causal)
            ms = time_callable(call).median_ms
            flops = sum(4.0 * HQ * n * n * D for n in lens) / (2 if causal else 1)
            print(f"causal={causal} {name}: {ms:.3f} ms {flops / ms / 1e9:.0f} TFLOPS", flush=True)
        qd = torch.randn(64, HQ, 1024, D, device="cuda", dtype=torch.bfloat16)
        kd = torch.randn(64, HKV, 1024, D, device="cuda", dtype=torch.bfloat16)
        vd = torch.randn_like(kd)

        def dense():
            return fa_autotune.attention(qd, kd, vd, causal=causal)

        ms = checked_ms(dense, reference_attention(qd, kd, vd, causal=causal)[0], "attention()")
        flops = 64 * 4.0 * HQ * 1024 * 1024 * D / (2 if causal else 1)
        print(f"causal={causal} dense 64x1024: {ms:.3f} ms {flops / ms / 1e9:.0f} TFLOPS", flush=True)


if __name__ == "__main__":
    main()

"""attention_varlen's Gluon kernel on each persistent grid, timed in interleaved rounds: the
config attention_varlen dispatches, on the dynamic grid (tiles from a counter, what it runs)
and the static one, beside the Gluon default on both (causal: also the dispatched config in
L2 sections of 8 heads, what dense dynamic grids use); varlen_bench's three length mixes,
causal and not (bf16, 32/8 heads, D 128, lengths unchecked). Each kernel's output is checked
against float32 attention (per sequence) before it is timed; a row prints the median of
three rounds' medians, in TFLOPS. One timing per grid in turn varied by 5-10% between
neighbours (benchmarks/results/2026-12-02-h200-varlen-grids/results.md): hence the rounds.

Usage: python3 benchmarks/varlen_grids.py   (prints one line per length mix and mask; needs a GPU)
"""
import argparse

import torch

import fa_autotune
from fa_autotune import KernelConfig
from fa_autotune.tune.measure import time_callable
from fa_autotune.tune.reference import compare, reference_attention
from varlen_bench import GLUON, D, HKV, HQ, length_mixes, packed_inputs


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


def dispatched_config(lens, causal: bool) -> KernelConfig:
    """What attention() dispatches for the dense problem attention_varlen looks up (batch =
    sequences, N = the longest, bottom-right causal), as fa_autotune.explain reports it."""
    q = torch.empty(len(lens), HQ, max(lens), D, device="cuda", dtype=torch.bfloat16)
    k = torch.empty(len(lens), HKV, max(lens), D, device="cuda", dtype=torch.bfloat16)
    info = fa_autotune.explain(q, k, k, causal, causal_align="bottom_right")
    return KernelConfig.from_mapping(info["config"])


def variants(lens, causal: bool) -> dict[str, dict]:
    """The dispatched config of the dense problem attention_varlen looks up (when it is a
    Gluon one) and the Gluon default, each on the dynamic and the static persistent grid."""
    out = {}
    dispatched = dispatched_config(lens, causal)
    for name, config in (("dispatched", dispatched), ("default", GLUON)):
        if config.language == "gluon":
            out[f"{name} dynamic"] = config.with_(persistent=1, dynamic=True).to_dict()
            out[f"{name} static"] = config.with_(persistent=1, dynamic=False).to_dict()
    if causal and dispatched.language == "gluon" and not dispatched.section:
        # the varlen launcher sizes causal sections by the L2 rule even on a dynamic grid, where
        # dense grids use DYNAMIC_SECTION (8 heads): the same config in sections of 8
        out["dispatched dynamic sec8"] = dispatched.with_(persistent=1, dynamic=True, section=8).to_dict()
    return out


def main() -> None:
    for name, lens in length_mixes().items():
        for causal in (True, False):
            q, k, v, cu = packed_inputs(lens)
            configs = variants(lens, causal)
            flops = sum(4.0 * HQ * n * n * D for n in lens) / (2 if causal else 1)
            times = {n: [] for n in configs}
            for round_ in range(3):
                for label, config in configs.items():
                    def run(config=config):
                        return fa_autotune.attention_varlen(q, k, v, cu, cu, max(lens), max(lens), causal=causal,
                                                            check_lengths=False, config=config)

                    if round_ == 0:
                        check_varlen(run(), q, k, v, lens, causal)
                    times[label].append(time_callable(run).median_ms)
            first = KernelConfig.from_mapping(next(iter(configs.values()))).name
            print(f"{name} causal={causal} [{first}]: "
                  + "; ".join(f"{label} {flops / sorted(t)[1] / 1e9:.0f}" for label, t in times.items()), flush=True)


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__.splitlines()[0],
                            formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__).parse_args()
    main()

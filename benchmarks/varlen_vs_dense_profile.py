"""One kernel to profile: the Gluon config m64x2n128_s2_r240_cband_ov_pers1 (static
persistent grid) on 64 x 1024 tokens (bf16, 32/8 heads, D 128, non-causal), either as dense
attention() on the packed storage viewed (B, H, N, D) (the same bytes) or as attention_varlen;
three calls (the third is the one to profile, after compiling). Under Nsight Compute:

  ncu --clock-control none --kernel-name regex:attn_fwd_gluon --launch-skip 2 --launch-count 1 \\
      --section SpeedOfLight --section WarpStateStats --section SourceCounters -o OUT/dense \\
      python3 benchmarks/varlen_vs_dense_profile.py dense      # then: varlen
  ncu --import OUT/dense.ncu-rep --page source --csv --print-source sass > dense.source.csv

Usage: python3 benchmarks/varlen_vs_dense_profile.py {dense,varlen}
"""
import sys

import torch

import fa_autotune
from varlen_bench import D, HKV, HQ, packed_inputs

B, N = 64, 1024
CONFIG = dict(language="gluon", access="tensor_desc", num_warps=4, BLOCK_M=64, BLOCK_N=128, num_stages=2, persistent=1)


def main(which: str) -> None:
    q, k, v, cu = packed_inputs([N] * B)
    for _ in range(3):
        if which == "dense":
            fa_autotune.attention(q.view(B, N, HQ, D).transpose(1, 2), k.view(B, N, HKV, D).transpose(1, 2),
                                  v.view(B, N, HKV, D).transpose(1, 2), config=CONFIG)
        else:
            fa_autotune.attention_varlen(q, k, v, cu, cu, N, N, check_lengths=False, config=CONFIG)
    torch.cuda.synchronize()


if __name__ == "__main__":
    if sys.argv[1:] not in (["dense"], ["varlen"]):
        sys.exit(__doc__)
    main(sys.argv[1])

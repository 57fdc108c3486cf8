import json, torch
from triton.testing import do_bench
from fa_autotune.fp8 import kernels, quantize as qz
from fa_autotune.fp8.kernels import BlockLaunch
dev = torch.device("cuda")
def graph_ms(fn):
    fn(); torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return do_bench(g.replay, warmup=25, rep=50)
orig = kernels.block_launch
from fa_autotune.fp8.hadamard import signed_hadamard
v = torch.randn(2, 16, 8192, 128, device=dev, dtype=torch.bfloat16)
m = signed_hadamard(128, 0, dev, torch.bfloat16)
for block in (256, 128):
    kernels.block_launch = orig
    ref_out = qz._fp8_like(v.shape, dev, torch.float8_e4m3fn, False)
    ref_s = kernels.quantize_blocks(v, m, block, 448.0, ref_out, False)
    for rows, warps, stages, pps in ((block, 16 if block == 256 else 8, 2, 1), (64, 4, 2, 4), (64, 4, 3, 4), (64, 8, 2, 2), (32, 4, 2, 4), (128, 8, 2, 2), (128, 4, 2, 4), (64, 2, 2, 8)):
        if rows > block: continue
        lv = BlockLaunch(rows=rows, warps=warps, stages=stages, programs_per_sm=pps)
        kernels.block_launch = lambda *a, _lv=lv, **kw: _lv
        out = qz._fp8_like(v.shape, dev, torch.float8_e4m3fn, False)
        try:
            s = kernels.quantize_blocks(v, m, block, 448.0, out, False)
            same = bool(torch.equal(out.view(torch.uint8), ref_out.view(torch.uint8)) and torch.equal(s, ref_s))
            ms = graph_ms(lambda: kernels.quantize_blocks(v, m, block, 448.0, out, False))
        except Exception as e:
            ms, same = repr(e)[:150], None
        print(json.dumps({"block": block, "launch": lv._asdict(), "ms": ms, "same_as_default": same,
                          "tb_s": v.numel() * 3 / ms / 1e9 if isinstance(ms, float) else None}), flush=True)

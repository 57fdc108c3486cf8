import json, torch
from triton.testing import do_bench
from fa_autotune.fp8 import kernels, quantize as qz
dev = torch.device("cuda")
def graph_ms(fn):
    fn(); torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return do_bench(g.replay, warmup=25, rep=50)
for d in (128, 256):
    v = torch.randn(2, 16, 8192, d, device=dev, dtype=torch.bfloat16)
    for block in (128, 256):
        for name, trans, wg in (("transposed+wgmma", True, True), ("transposed natural", True, False), ("row-major natural", False, False), ("row-major wgmma", False, True)):
            out = qz._fp8_like(v.shape, dev, torch.float8_e4m3fn, trans)
            try:
                ms = graph_ms(lambda: kernels.quantize_blocks(v, None, block, 448.0, out, wg))
            except Exception as e:
                ms = repr(e)[:150]
            print(json.dumps({"d": d, "block": block, "v": name, "ms": ms, "tb_s": v.numel() * 3 / ms / 1e9 if isinstance(ms, float) else None}), flush=True)

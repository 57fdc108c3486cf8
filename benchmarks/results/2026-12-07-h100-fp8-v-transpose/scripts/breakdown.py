"""Where the quantizer's time goes: do_bench vs CUDA graph vs host time; launch variants."""
import json, os, sys, time
import torch
from triton.testing import do_bench
import fa_autotune
from fa_autotune.runtime import api
from fa_autotune.fp8 import kernels, quantize as qz
from fa_autotune.fp8.hadamard import signed_hadamard, hadamard_halves

out_dir = os.environ.get("OUT", "/tmp") + "/qhost"; os.makedirs(out_dir, exist_ok=True)
res = {"rows": []}
dev = torch.device("cuda")

def graph_ms(fn):
    fn(); torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return do_bench(g.replay, warmup=25, rep=50)

def host_ms(fn, n=200):
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    h = (time.perf_counter() - t) / n * 1e3
    torch.cuda.synchronize()
    return h

for d, causal in ((128, False), (128, True), (256, False)):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 16, 8192, d, device=dev, dtype=torch.bfloat16) for _ in range(3))
    fa_autotune.attention_fp8(q, k, v, causal=causal)
    plan = next(p for p in api._PLANS.values() if p.quantize is not None)
    x = fa_autotune.quantize_fp8(q, k, v, **plan.quantize)
    calls = {"quantize_only": lambda: fa_autotune.quantize_fp8(q, k, v, **plan.quantize),
             "quantize_included": lambda: fa_autotune.attention_fp8(q, k, v, causal=causal),
             "prequantized": lambda: fa_autotune.attention_fp8(x, causal=causal)}
    row = {"d": d, "causal": causal, "config": plan.config.name, "quantize": {k_: str(v_) for k_, v_ in plan.quantize.items()}}
    for name, fn in calls.items():
        row[name] = {"do_bench": do_bench(fn, warmup=25, rep=50), "host": host_ms(fn)}
        try:
            row[name]["graph"] = graph_ms(fn)
        except Exception as e:
            row[name]["graph"] = repr(e)[:200]
    print(json.dumps(row), flush=True)
    res["rows"].append(row)
    api._PLANS.clear()

# launch variants for the per-tensor kernel at D=128 (graph-timed)
from fa_autotune.fp8.kernels import BlockLaunch
orig = kernels.block_launch
q = torch.randn(2, 16, 8192, 128, device=dev, dtype=torch.bfloat16)
m = signed_hadamard(128, 0, dev, torch.bfloat16)
for block, is_v in ((128, False), (256, False), (256, True)):
    out = qz._fp8_like(q.shape, dev, torch.float8_e4m3fn, is_v)
    base = orig(block, 128, not is_v)
    variants = [base] + [BlockLaunch(rows=base.rows, warps=w, stages=s, programs_per_sm=p, halves=False)
                         for w, s, p in ((4, 2, 4), (8, 2, 1), (8, 2, 2), (8, 3, 2), (8, 2, 4), (16, 2, 1), (16, 3, 1), (16, 2, 2), (4, 3, 8))]
    for lv in variants:
        kernels.block_launch = lambda *a, _lv=lv, **kw: _lv
        fn = lambda: kernels.quantize_blocks(q, None if is_v else m, block, 448.0, out, is_v)
        try:
            ms = graph_ms(fn)
        except Exception as e:
            ms = repr(e)[:200]
        r = {"block": block, "v": is_v, "launch": lv._asdict(), "graph_ms": ms,
             "tb_s": (q.numel() * 3 / ms / 1e9) if isinstance(ms, float) else None}
        print(json.dumps(r), flush=True)
        res["rows"].append(r)
    kernels.block_launch = orig
res["env"] = {"torch": torch.__version__, "device": torch.cuda.get_device_name()}
json.dump(res, open(out_dir + "/qhost.json", "w"), indent=1)

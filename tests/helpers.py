"""Small helpers shared by the tests."""
from __future__ import annotations

import torch

from fa_autotune.tune.reference import TOLERANCE, compare, reference_attention


def make_qkv(b, hq, hkv, nq, nk, d, dtype=torch.float16, device="cpu", layout="bhnd"):
    """Random q, k, v; layout "bnhd" returns transposed views of flash-attn's layout."""
    def one(h, n):
        if layout == "bnhd":
            return torch.randn(b, n, h, d, dtype=dtype, device=device).transpose(1, 2)
        return torch.randn(b, h, n, d, dtype=dtype, device=device)

    return one(hq, nq), one(hkv, nk), one(hkv, nk)


def assert_close_to_reference(out, q, k, v, causal=False, scale=None, causal_align="top_left", lse=None):
    ref, ref_lse = reference_attention(q, k, v, causal=causal, scale=scale, causal_align=causal_align)
    report = compare(out, ref)
    dtype = str(q.dtype).removeprefix("torch.")
    assert report.finite, "output has NaN/Inf"
    assert report.rel <= TOLERANCE[dtype], f"relative error {report.rel:.3e} > {TOLERANCE[dtype]}"
    if lse is not None:
        finite = torch.isfinite(ref_lse)
        assert torch.equal(finite, torch.isfinite(lse)), "LSE -inf rows differ"
        assert torch.allclose(lse[finite], ref_lse[finite], atol=2e-3, rtol=1e-3)


def hanging_server(conn, interpret, parent=None, work=None):
    """A device worker that never answers (a hung kernel)."""
    import time

    conn.recv()
    time.sleep(3600)


def crashing_server(conn, interpret, parent=None, work=None):
    """A device worker that dies mid-job (a fault that kills the process)."""
    import os

    conn.recv()
    os._exit(3)


def mode_probe(job, device):
    """Device work that reports the Triton mode its child process chose before importing it."""
    import os

    return {"status": "ok", "device": device, "interpret": os.environ.get("TRITON_INTERPRET")}


def shared_once(tmp_path_factory, name: str, produce):
    """``produce()`` once per test run, shared by the pytest-xdist workers through a pickle
    in their common temp root (made under a file lock): a fixture that compiles many kernels
    would otherwise run in every worker that takes one of its tests."""
    import os
    import pickle

    from filelock import FileLock

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    path = root / f"{name}.pickle"
    with FileLock(f"{path}.lock"):
        if path.exists():
            return pickle.loads(path.read_bytes())
        value = produce()
        partial = path.with_suffix(".partial")
        partial.write_bytes(pickle.dumps(value))
        os.replace(partial, path)  # whole or absent, even if this worker dies mid-write
        return value


def measurements(db_url):
    """(config hash, status, phase, problem key) of every measurement, in insertion order (any
    backend). A config may be measured once per problem: key duplicates on (problem, hash)."""
    from sqlalchemy import create_engine, text

    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.execute(text(
                "SELECT c.hash, m.status, m.phase, p.key FROM fa_measurements m "
                "JOIN fa_configs c ON c.id = m.config_id JOIN fa_problems p ON p.id = m.problem_id ORDER BY m.id"))]
    finally:
        engine.dispose()

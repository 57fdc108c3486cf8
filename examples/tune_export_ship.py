"""Tune, export, ship: `fa-autotune tune` into a temporary database, `export` the winners to
JSON files, and a fresh process that finds them through FA_AUTOTUNE_CONFIG_DIR, as another
machine with the same GPU would (explain() then reports source "exported").

    GPU: python examples/tune_export_ship.py
    CPU: TRITON_INTERPRET=1 python examples/tune_export_ship.py   (Triton's interpreter: slow, tiny shapes)

The CLI runs as `python -m fa_autotune`, which is `fa-autotune` without needing it on PATH.
"""
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from _device import pick_device

device, _ = pick_device()


def fa_autotune_cli(*args):
    command = [sys.executable, "-m", "fa_autotune", *args]
    print("$ fa-autotune " + " ".join(args), flush=True)
    subprocess.run(command, check=True)


# What a fresh process on this machine would run for the smoke preset's causal problem
# (B 1, H 2, N 64, D 32, fp16): explain() reports where its config comes from.
EXPLAIN = f"""
import json, torch
from fa_autotune import explain
q, k, v = (torch.randn(1, 2, 64, 32, device="{device}", dtype=torch.float16) for _ in range(3))
print(json.dumps(explain(q, k, v, causal=True)))
"""


def explain_in_fresh_process(tmp, **env):
    # FA_AUTOTUNE_DB names a database that does not exist, so your own tuning database
    # (~/.cache/fa_autotune) cannot answer before the exported files do.
    env = {**os.environ, "FA_AUTOTUNE_DB": f"sqlite:///{tmp / 'none.sqlite'}", **env}
    result = subprocess.run([sys.executable, "-c", EXPLAIN], env=env, check=True, capture_output=True, text=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


with tempfile.TemporaryDirectory(prefix="fa_autotune_example_") as directory:  # removed at the end
    tmp = Path(directory)
    database, configs = f"sqlite:///{tmp / 'tuning.sqlite'}", tmp / "configs"

    # 1. Tune: the "smoke" preset's two tiny problems (causal and not), 2 trials each, seeded.
    fa_autotune_cli("tune", "--preset", "smoke", "--trials", "2", "--seed", "0", "--db", database, "--quiet")
    # 2. Export the winners: one JSON file per GPU and kernel family, ready to commit or ship.
    fa_autotune_cli("export", "--db", database, "--out", str(configs))  # prints the files it wrote

    # 3. Ship: a fresh process without and then with FA_AUTOTUNE_CONFIG_DIR.
    before = explain_in_fresh_process(tmp)
    after = explain_in_fresh_process(tmp, FA_AUTOTUNE_CONFIG_DIR=str(configs))
    print(f"  without FA_AUTOTUNE_CONFIG_DIR: source '{before['source']}', {before['kernel']}")
    print(f"  with FA_AUTOTUNE_CONFIG_DIR:    source '{after['source']}', {after['kernel']} "
          f"(from {Path(after['origin']).name}, matched {after['matched_problem']})")

print(f"tune_export_ship: explain() reports source '{after['source']}' for {after['problem']} ({device})")
if after["source"] != "exported" or after["matched_problem"] != after["problem"]:
    sys.exit("tune_export_ship: FAILED (the exported config was not picked up)")

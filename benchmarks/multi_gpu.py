"""Issue 17's GPU evidence on a two-GPU host (run from the repository root; see gpu_multi.sh).

  scale: the same `tune` (a preset, --trials, --seed 0, --jobs) once on one GPU and once with
         `--gpus all`, each on a fresh SQLite database with cold Triton and kernel caches;
         reports both wall times, their ratio and the winners' times side by side.
  hosts: two `tune` processes with disjoint CUDA_VISIBLE_DEVICES, as two hosts would run them,
         against one PostgreSQL database (URL from FA_AUTOTUNE_TEST_PG_URL); checks no
         (problem, config) is measured twice in the search, one winner per problem, and that
         `query best` reads the same from either side.

Writes <out>/multi-gpu-<mode>.json and prints a markdown summary.
"""
from __future__ import annotations

import argparse
import collections
import datetime as dt
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def fa(args: list[str], env: dict[str, str], log: Path | None = None) -> tuple[float, str]:
    """Run `python -m fa_autotune ARGS`; its wall seconds and output (also appended to ``log``)."""
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "fa_autotune", *args], env=env, capture_output=True, text=True)
    seconds = time.monotonic() - start
    if log is not None:
        with log.open("a") as f:
            f.write(f"$ fa-autotune {' '.join(args)}\n{proc.stdout}{proc.stderr}\n(wall {seconds:.1f} s, exit "
                    f"{proc.returncode})\n\n")
    if proc.returncode != 0:
        raise SystemExit(f"fa-autotune {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return seconds, proc.stdout


def isolated_env(tmp: Path, name: str, **extra: str) -> dict[str, str]:
    """Cold caches of its own, as a fresh machine would have."""
    return dict(os.environ, TRITON_CACHE_DIR=str(tmp / name / "triton"), FA_AUTOTUNE_CACHE=str(tmp / name / "kernels"),
                **extra)


def best(url: str, env: dict[str, str]) -> list[dict]:
    _, out = fa(["query", "best", "--db", url, "--format", "json"], env)
    return json.loads(out)


def search_measurements(url: str) -> list[tuple[str, str]]:
    """(problem key, config hash) of every search-phase measurement."""
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.execute(text(
                "SELECT p.key, c.hash FROM fa_measurements m JOIN fa_configs c ON c.id = m.config_id "
                "JOIN fa_problems p ON p.id = m.problem_id WHERE m.phase = 'search'"))]
    finally:
        engine.dispose()


def duplicates(url: str) -> int:
    pairs = search_measurements(url)
    return len(pairs) - len(set(pairs))


def environment() -> dict:
    import torch
    import triton

    cuda = torch.cuda.is_available()
    return {"date": dt.date.today().isoformat(), "gpu": torch.cuda.get_device_name(0) if cuda else "none",
            "gpus": torch.cuda.device_count() if cuda else 0, "cpus": os.cpu_count(), "torch": torch.__version__,
            "triton": triton.__version__}


def scale(args, tmp: Path, out: Path) -> dict:
    tune = ["tune", "--preset", args.preset, "--trials", str(args.trials), "--seed", "0", "--jobs", str(args.jobs),
            "--quiet"]
    one_url, all_url = f"sqlite:///{tmp / 'one.sqlite'}", f"sqlite:///{tmp / 'all.sqlite'}"
    log = out / "multi-gpu-scale.log"
    one_s, _ = fa(tune + ["--db", one_url], isolated_env(tmp, "one", CUDA_VISIBLE_DEVICES="0"), log)
    all_s, _ = fa(tune + ["--db", all_url, "--gpus", "all"], isolated_env(tmp, "all"), log)
    env = dict(os.environ)
    one = {w["problem"]: w for w in best(one_url, env)}
    both = {w["problem"]: w for w in best(all_url, env)}
    rows = [{"problem": key, "one_gpu_ms": one[key]["median_ms"], "all_gpus_ms": both[key]["median_ms"],
             "ratio": both[key]["median_ms"] / one[key]["median_ms"], "one_gpu_config": one[key]["config_name"],
             "all_gpus_config": both[key]["config_name"]} for key in sorted(one) if key in both]
    return {"mode": "scale", "preset": args.preset, "trials": args.trials, "jobs": args.jobs,
            "one_gpu_s": one_s, "all_gpus_s": all_s, "wall_ratio": all_s / one_s,
            "problems": len(one), "problems_in_both": len(rows),
            "winner_ms_geomean_ratio": math.exp(sum(math.log(r["ratio"]) for r in rows) / max(1, len(rows))),
            "duplicate_search_measurements": duplicates(all_url), "rows": rows}


def hosts(args, tmp: Path, out: Path) -> dict:
    url = os.environ.get("FA_AUTOTUNE_TEST_PG_URL")
    if not url:
        raise SystemExit("hosts: start PostgreSQL first (eval \"$(.ci/postgres.sh start)\")")
    log = out / "multi-gpu-hosts.log"
    tune = ["tune", "--preset", args.preset, "--trials", str(args.trials), "--jobs", str(args.jobs), "--quiet",
            "--db", url]
    # HOST_DEVICES="0 0" runs both "hosts" on one GPU (where no two-GPU machine is lent: the
    # database behaviour is the same, the timings share the GPU).
    devices = os.environ.get("HOST_DEVICES", "0 1").split()
    sides = [isolated_env(tmp, f"host{n}", CUDA_VISIBLE_DEVICES=d) for n, d in enumerate(devices)]
    start = time.monotonic()
    procs = [subprocess.Popen([sys.executable, "-m", "fa_autotune", *tune, "--seed", str(n)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for n, env in enumerate(sides)]
    outputs = [p.communicate()[0] for p in procs]
    seconds = time.monotonic() - start
    with log.open("a") as f:
        for n, (p, text) in enumerate(zip(procs, outputs)):
            f.write(f"--- host {n} (CUDA_VISIBLE_DEVICES={devices[n]}, exit {p.returncode}) ---\n{text}\n")
    winners = [best(url, env) for env in sides]
    per_problem = collections.Counter(w["problem"] for w in winners[0])
    pairs = search_measurements(url)
    return {"mode": "hosts", "devices": devices, "preset": args.preset, "trials": args.trials, "jobs": args.jobs, "wall_s": seconds,
            "exit_codes": [p.returncode for p in procs],
            "search_measurements": len(pairs), "duplicate_search_measurements": len(pairs) - len(set(pairs)),
            "problems": len(per_problem), "winners_per_problem_max": max(per_problem.values(), default=0),
            "query_best_identical": winners[0] == winners[1], "winners": winners[0]}


def markdown(result: dict) -> str:
    if result["mode"] == "scale":
        lines = [f"`tune --preset {result['preset']} --trials {result['trials']} --seed 0 --jobs {result['jobs']}`: "
                 f"one GPU {result['one_gpu_s']:.1f} s, `--gpus all` {result['all_gpus_s']:.1f} s "
                 f"(**{result['wall_ratio']:.3f}x**); winners' time geomean ratio (all/one) "
                 f"{result['winner_ms_geomean_ratio']:.3f} over {result['problems_in_both']}/{result['problems']} "
                 f"problems; duplicate search measurements with --gpus: {result['duplicate_search_measurements']}.",
                 "", "| problem | one GPU ms | --gpus all ms | ratio | one-GPU winner | --gpus winner |",
                 "|---|---|---|---|---|---|"]
        lines += [f"| {r['problem']} | {r['one_gpu_ms']:.4f} | {r['all_gpus_ms']:.4f} | {r['ratio']:.3f} | "
                  f"{r['one_gpu_config']} | {r['all_gpus_config']} |" for r in result["rows"]]
        return "\n".join(lines)
    devices = result.get("devices", ["0", "1"])
    return (f"Two processes (CUDA_VISIBLE_DEVICES={devices[0]} and ={devices[1]}) `tune --preset {result['preset']} --trials "
            f"{result['trials']}` on one PostgreSQL database: {result['wall_s']:.1f} s, exit codes "
            f"{result['exit_codes']}; {result['search_measurements']} search measurements, "
            f"{result['duplicate_search_measurements']} duplicated; {result['problems']} problems, at most "
            f"{result['winners_per_problem_max']} winner per problem; `query best` identical from either side: "
            f"{result['query_best_identical']}.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["scale", "hosts"])
    parser.add_argument("--preset", default="llm-prefill")
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--jobs", type=int, default=16, help="compile processes in all (split by --gpus)")
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        result = scale(args, Path(tmp), args.out) if args.mode == "scale" else hosts(args, Path(tmp), args.out)
    result["environment"] = environment()
    (args.out / f"multi-gpu-{args.mode}.json").write_text(json.dumps(result, indent=1))
    print(markdown(result))


if __name__ == "__main__":
    main()

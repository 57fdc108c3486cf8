"""One table from `fa-autotune bench` runs of two code trees on the same GPU: each run's
providers are timed side by side (ratios to cuDNN in that run); runs of the two trees
alternate, so drift hits both alike.

    python3 benchmarks/before_after.py --run before A1 --run after B1 --run before A2 --run after B2 --out DIR

Writes DIR/before_after.json and DIR/before_after.md: per problem and provider, TFLOPS and
ratio to cuDNN of every run, and per tree the median over its runs.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", nargs=2, action="append", metavar=("LABEL", "DIR"), required=True,
                        help="a tree's label and one bench output directory (bench.json), in run order")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--note", default="", help="a line for the markdown (what the trees are)")
    args = parser.parse_args()
    runs = [(label, json.loads((Path(d) / "bench.json").read_text())) for label, d in args.run]
    labels = list(dict.fromkeys(label for label, _ in runs))
    providers = [p for p in runs[0][1]["providers"] if p != "cudnn"]
    table: dict[str, dict[str, dict[str, list[float]]]] = {}
    for label, run in runs:
        for row in run["rows"]:
            base = row["cells"].get("cudnn", {}).get("ms")
            for p in providers:
                cell = row["cells"].get(p, {})
                if cell.get("status") == "ok" and base:
                    entry = table.setdefault(row["problem"], {}).setdefault(f"{label}/{p}", [])
                    entry.append(base / cell["ms"])
    summary = {"environment": [run["environment"] for _, run in runs], "labels": labels, "providers": providers,
               "runs": [label for label, _ in runs], "ratio_to_cudnn": table}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "before_after.json").write_text(json.dumps(summary, indent=2) + "\n")
    env = runs[0][1]["environment"]
    lines = [f"# Before/after on {env.get('gpu')} ({env['date']})", "",
             f"torch {env['torch']}, triton {env['triton']}, cuDNN {env['cudnn']}; templates "
             + ", ".join(f"{label}: {run['environment']['template_hash']}" for label, run in runs[:len(labels)])
             + f". Runs in order: {', '.join(label for label, _ in runs)}.", ""]
    if args.note:
        lines += [args.note, ""]
    lines += ["Ratio to cuDNN timed in the same run (median over each tree's runs; every run's value in brackets):", "",
              "| problem | " + " | ".join(f"{label} {p}" for p in providers for label in labels)
              + " | " + " | ".join(f"{p} {labels[-1]}/{labels[0]}" for p in providers) + " |",
              "|---" * (1 + len(providers) * (len(labels) + 1)) + "|"]
    for problem, cells in table.items():
        values, changes = [], []
        for p in providers:
            medians = {label: statistics.median(cells.get(f"{label}/{p}", [float("nan")])) for label in labels}
            values += [f"{medians[label]:.3f}x [{', '.join(f'{v:.3f}' for v in cells.get(f'{label}/{p}', []))}]"
                       for label in labels]
            changes.append(f"{medians[labels[-1]] / medians[labels[0]]:.3f}")
        lines.append(f"| {problem} | " + " | ".join(values) + " | " + " | ".join(changes) + " |")
    (args.out / "before_after.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

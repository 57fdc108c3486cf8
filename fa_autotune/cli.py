"""``fa-autotune`` (also ``python -m fa_autotune``): the command-line front end.

Each subcommand is a thin layer over a pipeline module; argument errors and
:class:`FaAutotuneError` become one-line messages and exit status 2, never tracebacks.
Pipeline modules are imported inside the commands: this module is also what spawned child
processes import first (as ``python -m fa_autotune``'s main), and they must choose Triton's
interpreted or compiled mode before anything imports Triton (see :mod:`.processes`).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable, Sequence

from ._version import __version__
from .errors import ConfigError, FaAutotuneError, SearchSpaceError, one_line
from .errors import quote as _quote
from .spec.candidate import Candidate
from .spec.config import KernelConfig
from .spec.problem import Problem
from .spec.space import load_space
from .spec.target import detect_gpu, detect_software
from .spec.tuned import FrontPoint, Winner

Handler = Callable[[argparse.Namespace], int]
_COMMANDS: dict[str, Handler] = {}


def command(name: str) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        _COMMANDS[name] = fn
        return fn

    return register


def add_problem_flags(parser: argparse.ArgumentParser, required: bool = False) -> None:
    group = parser.add_argument_group("problem (SDPA's B, H, N, D)")
    group.add_argument("--batch", type=int, default=1, help="batch size B")
    group.add_argument("--heads", type=int, default=16, help="query heads")
    group.add_argument("--kv-heads", type=int, default=None, help="key/value heads (GQA); default: --heads")
    group.add_argument("--seqlen", type=int, required=required, default=None if required else 1024,
                       help="query length N")
    group.add_argument("--seqlen-k", type=int, default=None, help="key length; default: --seqlen")
    group.add_argument("--head-dim", type=int, default=128, help="head dimension D")
    group.add_argument("--dtype", default="float16", help="float16|bfloat16|float32 (fp16, bf16, fp32)")
    group.add_argument("--causal", action=argparse.BooleanOptionalAction, default=False,
                       help="a causal mask; --no-causal (the default): none")
    group.add_argument("--causal-align", default="top_left", choices=["top_left", "bottom_right"],
                       help="where the causal diagonal starts when the query and key lengths differ")
    group.add_argument("--page-size", type=int, default=0,
                       help="KV-cache problems (--space decode): rows per cache page; 0 = a contiguous cache")


def problem_from_args(args: argparse.Namespace, kind: str = "fwd"):
    """The problem the flags describe, of ``kind``: "decode" is a KV-cache problem (seqlen new
    tokens against seqlen_k cached keys, causal aligned bottom-right)."""
    decode = kind == "decode"
    page_size = getattr(args, "page_size", 0)
    if page_size and not decode:
        raise SearchSpaceError("--page-size describes a KV cache: use it with --space decode")
    return Problem(
        batch=args.batch, heads_q=args.heads, heads_kv=args.kv_heads or args.heads, seqlen_q=args.seqlen,
        seqlen_k=args.seqlen_k if args.seqlen_k is not None else args.seqlen, head_dim=args.head_dim,
        dtype=args.dtype, causal=args.causal, causal_align="bottom_right" if decode else args.causal_align,
        kind=kind, page_size=page_size,
    )


def config_from_args(args: argparse.Namespace) -> KernelConfig:
    """The kernel config of --config / --config-file (an FP8 recipe among its keys refused:
    no kernel reads it)."""
    return KernelConfig.from_mapping(_config_data(args))


def _config_data(args: argparse.Namespace) -> dict:
    text, where = args.config, "--config"
    if args.config_file:
        if args.config:
            raise ConfigError("--config-file", "give either --config or --config-file, not both")
        text, where = _read_text(args.config_file, "--config-file", 1024 * 1024), f"--config-file {args.config_file}"
    try:
        data = json.loads(text) if text else {}
    except json.JSONDecodeError as exc:
        raise ConfigError(where, f"not valid JSON ({exc})") from None
    except RecursionError:
        raise ConfigError(where, "not valid JSON (nested too deeply)") from None
    if not isinstance(data, dict):
        raise ConfigError(where, f"expected a JSON object of template parameters, got {type(data).__name__}")
    return data


def _read_text(path: str, flag: str, limit: int) -> str:
    """A small UTF-8 text file named on the command line: a missing file, a directory, a
    binary file or one past ``limit`` bytes is a one-line error naming ``flag``."""
    from .paths import read_small_text

    return read_small_text(path, limit, FaAutotuneError, f"{flag} {path}")


def _out_dir(path: str) -> Path:
    """--out, a directory (made if missing): an existing file there, or on the way there, is a
    one-line refusal before any work, and is never replaced."""
    out = Path(path)
    for candidate in (out, *out.parents):
        if candidate.exists() and not candidate.is_dir():
            where = f"--out {path} is a file" if candidate == out else f"--out {path}: {candidate} is a file"
            raise FaAutotuneError(f"{where}, not a directory; --out names the directory for the output files, "
                                  "and an existing file is never replaced")
        if candidate.exists():
            break
    return out


def _add_config_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=None, help='template parameters as JSON, e.g. \'{"BLOCK_M": 64}\'')
    parser.add_argument("--config-file", default=None, help="JSON file of template parameters")


@command("render")
def _render(args: argparse.Namespace) -> int:
    """Write a variant's Triton module into the kernel cache (or --out) and print its path."""
    from .kernels.render import render, write_module

    out = _out_dir(args.out) if args.out else None
    rendered = render(config_from_args(args))
    path = write_module(rendered, out)
    print(path)
    if args.show:
        print(rendered.source)
    return 0


@command("compile")
def _compile(args: argparse.Namespace) -> int:
    """Compile a variant for a GPU architecture without a GPU; report shared memory and wgmma."""
    from .kernels.aot import compile_many

    cap = args.arch
    data = _config_data(args)
    candidate = Candidate.from_mapping(data, fp8=True)  # an FP8 problem's recipe decides its descales' layout
    problem = problem_from_args(args, kind={"decode": "decode", "backward": "bwd"}.get(candidate.config.loop_order,
                                                                                    "fwd"))
    if not problem.is_fp8:
        candidate = Candidate(KernelConfig.from_mapping(data))  # a recipe named there is refused
    (result,) = compile_many([candidate.config], problem, capability=cap, jobs=1, recipe=candidate.recipe)
    report = {"variant": candidate.name, "status": result.status, "seconds": round(result.seconds, 2),
              "error": result.error,
              "kernels": [dict(k.__dict__, instructions=dict(k.instructions)) for k in result.kernels]}
    print(json.dumps(report, indent=2))
    return 0 if result.status == "ok" else 1


@command("tune")
def _tune(args: argparse.Namespace) -> int:
    """Search kernel configs for problems on this GPU; every trial lands in the database."""
    import dataclasses
    import time

    from rich.console import Console

    from .store import safe_url
    from .runtime.dispatch import shipped_baseline
    from .tune.progress import RichReporter, summary_line, summary_table, summary_total
    from .tune.search import SilentReporter, TuneOptions, Tuner

    if args.gpus and not args.dry_run:
        return _tune_on_gpus(args)
    gpu = detect_gpu()
    groups = _tune_groups(args, gpu)
    problems = [p for _, group in groups for p in group]
    if args.dry_run:
        print("\n".join(p.key for p in problems))
        print(f"{len(problems)} problem(s); nothing tuned (--dry-run)", file=sys.stderr)
        return 0
    _check_tunable(problems, gpu)
    options = TuneOptions(trials=args.trials, time_budget=args.time_budget, sampler=args.sampler, seed=args.seed,
                          jobs=args.jobs or TuneOptions().jobs, study=args.study, retime_top=args.retime_top,
                          trial_timeout=args.trial_timeout, warm_start=not args.no_warm_start,
                          max_error=args.max_error, worker=args.worker_slot)
    db = _connect_to_write(args.db)
    outcomes = []
    deadline = time.monotonic() + args.time_budget if args.time_budget else None
    for n, (space, group) in enumerate(groups):  # one search space per kernel family, in priority order
        if deadline is not None:  # each group its share of what is left, as Tuner shares it by problem
            left = deadline - time.monotonic()
            if left <= 0:
                print(f"Time budget spent: {sum(len(g) for _, g in groups[n:])} problem(s) not tuned",
                      file=sys.stderr)
                break
            share = left * len(group) / sum(len(g) for _, g in groups[n:])
            options = dataclasses.replace(options, time_budget=share)
        reporter = SilentReporter() if args.quiet else RichReporter()  # one progress display per family
        outcomes += Tuner(db, space, gpu, detect_software(), options, reporter, baseline=shipped_baseline).tune(group)
    console = Console()
    if console.is_terminal:
        console.print(summary_table(outcomes, gpu.is_interpreter))
    else:  # a log: one plain line per problem, nothing folded
        print("\n".join(summary_line(o, gpu.is_interpreter) for o in outcomes))
    total = summary_total(outcomes, gpu.is_interpreter)
    if total:
        print(total)
    if gpu.is_interpreter:
        print("Note: no GPU here; the timings above come from Triton's interpreter, not a GPU: they are not speeds, "
              "so TFLOPS are shown as '-'.")
    print(f"Results: {safe_url(db.url)}")
    return 0 if outcomes and all(o.best is not None for o in outcomes) else 1


def _connect_to_write(url: str | None):
    """The database a writing command opens (created if new); a new SQLite file at a relative
    path (``sqlite:///tmp/x``: three slashes) is announced with its absolute path, as four
    slashes were most likely meant."""
    import os

    from .store import connect, relative_sqlite_path

    path = relative_sqlite_path(url) if url else None
    if path is not None and not os.path.exists(path):
        print(f"Note: creating the SQLite database {path} (the URL's path is relative to the current directory; "
              f"an absolute path takes four slashes: {url.replace(':///', ':////', 1)})", file=sys.stderr)
    return connect(url)


def _gpu_ids(spec: str, count: int) -> list[int]:
    """GPU ids named by --gpus ('all' or a comma list), checked against the ``count`` visible."""
    ids = None
    if spec != "all":
        try:
            ids = [int(part) for part in spec.split(",") if part.strip()]
        except ValueError:
            raise FaAutotuneError(f"--gpus takes 'all' or GPU ids like 0,1, got {spec!r}") from None
        if not ids or len(set(ids)) != len(ids):
            raise FaAutotuneError(f"--gpus {spec!r}: name each GPU once, as ids like 0,1")
    if count == 0:
        raise FaAutotuneError("--gpus runs one worker per CUDA GPU, and this machine shows none")
    if ids is None:
        return list(range(count))
    if not all(0 <= i < count for i in ids):
        raise FaAutotuneError(f"--gpus {spec!r}: this machine has GPUs 0..{count - 1}")
    return ids


def _tune_on_gpus(args: argparse.Namespace) -> int:
    """One `tune` worker per GPU, each pinned with CUDA_VISIBLE_DEVICES, all on one database:
    they share each problem's Optuna study and claim configs, so no config is measured
    twice; the compile processes of the host are split between them. One progress display
    for all of them, read from the database; each worker's summary at the end."""
    import os
    import subprocess
    import threading
    import time

    import torch

    from .errors import DatabaseError
    from .paths import default_db_url
    from .store import queries, safe_url
    from .tune.progress import WorkersProgress
    from .tune.search import TuneOptions, settled, study_name, target_trials

    ids = _gpu_ids(args.gpus, torch.cuda.device_count())
    gpu = detect_gpu(ids[0])
    groups = _tune_groups(args, gpu)
    problems = [p for _, group in groups for p in group]
    _check_tunable(problems, gpu)
    # what a worker would refuse, refused once here, before any starts
    options = TuneOptions(trials=args.trials, time_budget=args.time_budget, sampler=args.sampler,
                          max_error=args.max_error)
    url = args.db or default_db_url()
    db = _connect_to_write(url)
    storage = db.optuna_storage()  # the schema, once, before the workers start
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    physical = [part.strip() for part in visible.split(",")] if visible else None  # --gpus ids index this mask
    base = _without_flag(args.argv, "--gpus")
    jobs = max(1, (args.jobs or options.jobs) // len(ids))
    workers = []
    try:
        for n, gpu_id in enumerate(ids):
            argv = _without_flag(_without_flag(base, "--jobs"), "--db") + ["--db", url, "--jobs", str(jobs), "--quiet"]
            argv += ["--worker-slot", f"{n}/{len(ids)}"]  # workers start on different problems
            if args.seed is not None:
                argv = _without_flag(argv, "--seed") + ["--seed", str(args.seed + n)]
            env = dict(os.environ, CUDA_VISIBLE_DEVICES=physical[gpu_id] if physical else str(gpu_id))
            workers.append((gpu_id, subprocess.Popen([sys.executable, "-m", "fa_autotune", *argv], env=env,
                                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                                     errors="replace")))
        print(f"Tuning {len(problems)} problem(s) with {len(ids)} worker(s) (GPUs {', '.join(map(str, ids))}) on "
              f"{safe_url(url)}", flush=True)
        outputs: dict[int, str] = {}
        readers = [threading.Thread(target=lambda g=gpu_id, p=proc: outputs.__setitem__(g, p.stdout.read()),
                                    daemon=True) for gpu_id, proc in workers]
        for reader in readers:
            reader.start()
        # configs per problem (a problem whose space holds fewer ends early); open-ended for a
        # grid search without --trials
        target = None if args.sampler == "grid" and not args.trials else target_trials(
            options, gpu.is_interpreter, sys.maxsize)
        studies = {p.key: study_name(args.study, gpu, space.for_arch(gpu.arch), p) for space, group in groups
                   for p in group}
        names = list(studies.values())

        def poll(finished: bool = False) -> str | None:
            try:
                counts = settled(storage, names)
                failed = sum(r.failed for r in queries.live(db, names))
            except DatabaseError:  # busy or unreachable for a moment: the next poll shows it
                return None
            return progress.update({key: counts[name] for key, name in studies.items()}, failed, finished)

        reported: set[int] = set()
        with WorkersProgress(list(studies), target, len(ids)) as progress:
            while any(proc.poll() is None for _, proc in workers):
                time.sleep(1.0)
                poll()
                for gpu_id, proc in workers:
                    if proc.returncode not in (None, 0) and gpu_id not in reported:
                        reported.add(gpu_id)
                        print(f"worker on GPU {gpu_id} exited with {proc.returncode}; the others go on",
                              file=sys.stderr, flush=True)
            line = poll(finished=all(proc.returncode == 0 for _, proc in workers))
        for reader in readers:
            reader.join()
    finally:  # Ctrl-C (which the workers got too: they stop cleanly) or an error here: no
        # worker is left running on its own
        for _, proc in workers:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.terminate()
                proc.wait()
    print(f"Done: {line}" if line else "Done.")
    for gpu_id, proc in workers:
        print(f"--- GPU {gpu_id} (exit {proc.returncode}) ---")
        print(outputs.get(gpu_id, "").rstrip())
    return max(proc.returncode for _, proc in workers)


def _worker_slot(text: str) -> tuple[int, int]:
    """'k/n' (worker k of n, as `tune --gpus` starts them)."""
    try:
        k, n = (int(part) for part in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected k/n, got {text!r}") from None
    if not 0 <= k < n:
        raise argparse.ArgumentTypeError(f"expected k/n with 0 <= k < n, got {text!r}")
    return k, n


def _without_flag(argv: list[str], flag: str) -> list[str]:
    """``argv`` without ``flag`` and its value (``--flag V`` or ``--flag=V``)."""
    out, skip = [], False
    for item in argv:
        if skip:
            skip = False
        elif item == flag:
            skip = True
        elif not item.startswith(flag + "="):
            out.append(item)
    return out


# Flags that describe one problem or a preset's: --model and --recorded bring their own.
_SHAPE_FLAGS = {"preset": "--preset", "match": "--match", "seqlen": "--seqlen", "seqlen_k": "--seqlen-k",
                "heads": "--heads", "kv_heads": "--kv-heads", "head_dim": "--head-dim", "space": "--space"}
_MODEL_FLAGS = {"seqlens": "--seqlens", "training": "--training", "serving": "--serving"}


def _tune_groups(args: argparse.Namespace, gpu) -> list:
    """What `tune` tunes, as (search space, problems) in order: the problems of --model's
    config, of a --recorded workload (untuned and most-called first), or of a preset or
    --seqlen; consecutive problems of one kind share their family's search space."""
    from .runtime.record import load_record, priority
    from .tune.workload import load_model, model_problems, parse_seqlens

    source = "--model" if args.model else "--recorded" if args.recorded else None
    if args.model and args.recorded:
        raise FaAutotuneError("give either --model or --recorded, not both")
    if source is None:
        given = [flag for name, flag in _MODEL_FLAGS.items() if getattr(args, name)]
        if given:
            raise FaAutotuneError(f"{', '.join(given)} describe(s) a model's problems: use with --model CONFIG")
        for name, value in (("batch", 1), ("heads", 16), ("head_dim", 128), ("dtype", "float16"), ("causal", False),
                            ("causal_align", "top_left")):
            if getattr(args, name) is None:
                setattr(args, name, value)
        space = load_space(args.space or "fwd")
        return [(space, _tune_problems(args, space, gpu))]
    given = [flag for name, flag in _SHAPE_FLAGS.items() if getattr(args, name) is not None]
    if source == "--recorded":
        given += [flag for name, flag in _MODEL_FLAGS.items() if getattr(args, name)]
        given += [flag for flag, value in (("--batch", args.batch), ("--dtype", args.dtype)) if value is not None]
        given += [flag for flag, value in (("--page-size", args.page_size),) if value]
        given += ["--causal" if args.causal else "--no-causal"] if args.causal is not None else []
    given += ["--causal-align"] if args.causal_align is not None else []  # the model's or the record's alignment
    if given:
        raise FaAutotuneError(f"{source} brings its own problems (and search spaces, one per kernel family): drop "
                              f"{', '.join(given)}")
    if source == "--model":
        model = load_model(args.model)
        workload = model_problems(model, seqlens=parse_seqlens(args.seqlens) if args.seqlens else None,
                                  batch=args.batch, dtype=_canonical(args.dtype), training=args.training,
                                  serving=args.serving, page_size=args.page_size, interpreter=gpu.is_interpreter,
                                  causal=args.causal)
        print(f"{model.name}: {model.heads} heads, {model.kv_heads} KV heads, head dim {model.head_dim}, "
              f"{'causal' if workload.problems[0].causal else 'full'} attention; {len(workload.problems)} problem(s)",
              file=sys.stderr)
        for note in workload.notes:
            print(f"Note: {note}", file=sys.stderr)
        problems = list(workload.problems)
    else:
        recorded = priority(load_record(args.recorded))
        if not recorded:
            raise FaAutotuneError(f"--recorded {args.recorded}: the record holds no problems")
        untuned = sum(r.untuned for r in recorded)
        print(f"{args.recorded}: {len(recorded)} recorded problem(s), {untuned} without a tuned entry of their own; "
              "tuning untuned and most-called first", file=sys.stderr)
        problems = [r.problem for r in recorded]
    groups: list = []
    for problem in problems:
        if groups and groups[-1][0] == problem.kind:
            groups[-1][1].append(problem)
        else:
            groups.append((problem.kind, [problem]))
    spaces = {kind: load_space(kind) for kind in {kind for kind, _ in groups}}
    return [(spaces[kind], group) for kind, group in groups]


def _canonical(dtype: str | None) -> str | None:
    from .spec.problem import canonical_dtype

    return None if dtype is None else canonical_dtype(dtype)


def _tune_problems(args: argparse.Namespace, space, gpu) -> list:
    if args.seqlen is not None:
        if args.preset:
            raise SearchSpaceError("give either --preset or a problem (--seqlen ...), not both")
        return [problem_from_args(args, kind=space.kind)]
    name = args.preset or ("smoke" if gpu.is_interpreter else "quick")
    if name not in space.presets:
        raise SearchSpaceError(f"unknown preset {_quote(name)} in {space.path}; available: "
                               f"{', '.join(sorted(space.presets))}{_preset_elsewhere(name, args.space or 'fwd')}")
    problems = list(space.presets[name].problems)
    return _matching(problems, args) if args.match else problems


# Interpreter work per trial grows with B * H * N_q * N_k * D; above this a trial takes minutes.
_INTERPRETER_WORK = 2 * 4 * 256 * 256 * 64


def _check_tunable(problems: list, gpu) -> None:
    """Refuse what a tune cannot measure (an empty problem; bf16 in the interpreter, whose
    bf16 dot is wrong) before any trial runs, and warn where the interpreter will crawl."""
    for p in problems:
        if p.is_empty:
            raise FaAutotuneError(f"{p.key}: an empty problem (no query rows or keys) has nothing to tune")
        if gpu.is_interpreter and p.dtype == "bfloat16":
            raise FaAutotuneError(f"{p.key}: bfloat16 cannot be tuned in Triton's interpreter (its bf16 dot products "
                                  "are wrong, every trial would fail as wrong_result); use --dtype fp16 here, or a GPU")
        if gpu.is_interpreter and p.batch * p.heads_q * p.seqlen_q * p.seqlen_k * p.head_dim > _INTERPRETER_WORK:
            print(f"Warning: no GPU here, and {p.key} is large for Triton's interpreter (minutes per trial); "
                  "try e.g. --batch 1 --heads 2 --seqlen 64 --head-dim 32", file=sys.stderr)


def _preset_elsewhere(name: str | None, space_name: str) -> str:
    """"; it belongs to --space X" when another shipped search space has preset ``name``
    (e.g. `serving`, a decode preset, asked of the default forward space), else ""."""
    from .paths import data_dir

    if not name:
        return ""
    homes = []
    for path in sorted(data_dir("search_spaces").glob("*.yaml")):
        if path.stem == space_name:
            continue
        try:
            if name in load_space(path.stem).presets:
                homes.append(path.stem)
        except FaAutotuneError:
            continue
    return f"; preset {_quote(name)} belongs to {' and '.join(f'--space {h}' for h in homes)}" if homes else ""


def _matching(problems: list, args: argparse.Namespace) -> list:
    """The problems whose key contains each comma-separated part of --match."""
    wanted = [w.strip() for w in args.match.split(",") if w.strip()]
    kept = [p for p in problems if all(w in p.key for w in wanted)]
    if not kept:
        raise FaAutotuneError(f"no problem of preset {args.preset!r} matches {args.match!r}")
    return kept


@command("query")
def _query(args: argparse.Namespace) -> int:
    """Read the results database: best config per problem, or every trial with its status."""
    from .store import STATUSES, connect, queries, safe_url
    from .store.filters import Filters

    if args.status is not None and args.status not in STATUSES:  # else an empty table, as if none failed so
        raise FaAutotuneError(f"--status {_quote(args.status)} is not a measurement status; one of "
                              f"{', '.join(STATUSES)}")
    db = connect(args.db, readonly=True)
    filters = Filters(gpu=args.gpu, dtype=args.dtype, head_dim=args.head_dim, causal=args.causal,
                              status=args.status, problem=args.problem)
    if args.status is not None and args.what not in ("trials", "failures"):
        raise FaAutotuneError(f"--status filters measurements: it applies to 'trials' and 'failures', not {args.what!r}")
    if args.what == "best":
        rows, row_type = queries.best(db, filters), Winner
    elif args.what == "trials":
        rows, row_type = queries.trials(db, filters, limit=args.limit), queries.TrialRow
    elif args.what == "failures":
        rows, row_type = queries.failures(db, filters), queries.FailureRow
    elif args.what == "pareto":
        rows, row_type = queries.pareto(db, filters), FrontPoint
    elif args.what == "compare":
        if not (args.a and args.b):
            raise FaAutotuneError("compare needs --a and --b, e.g. --a gpu=H100 --b gpu=H200 or --a triton=3.5.1 "
                                  "--b triton=3.6.0")
        try:
            rows = queries.compare(db, _selector(args.a), _selector(args.b), filters)
        except ValueError as exc:
            raise FaAutotuneError(str(exc)) from None
        row_type = queries.CompareRow
    else:
        space = load_space(args.space)
        if not args.preset or args.preset not in space.presets:
            asked = f"no preset {_quote(args.preset)} in --space {args.space}" if args.preset else "coverage needs --preset"
            raise FaAutotuneError(f"{asked}; --space {args.space} has {', '.join(sorted(space.presets))}"
                                  f"{_preset_elsewhere(args.preset, args.space)}")
        rows, row_type = queries.coverage(db, list(space.presets[args.preset].problems), filters), queries.CoverageRow
    if args.limit is not None:
        rows = rows[:args.limit]
    emit(queries.as_dicts(rows), queries.columns(row_type), args.format, title=f"{args.what} ({safe_url(db.url)})")
    return 0


def _selector(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not value:
        raise FaAutotuneError(f"expected KEY=VALUE (gpu, triton, torch, template_hash, fa_autotune), got {text!r}")
    return key.strip(), value.strip()


@command("export")
def _export(args: argparse.Namespace) -> int:
    """Write the database's winners as one JSON file per GPU and kernel family."""
    from .runtime.files import export
    from .store import connect

    out = _out_dir(args.out)  # refused before the database is opened
    paths = export(connect(args.db, readonly=True), out, args.gpu)
    if not paths:
        print("nothing to export: the database has no tuned winners" + (f" for GPU {args.gpu!r}" if args.gpu else ""),
              file=sys.stderr)
        return 1
    for path in paths:
        print(path)
    return 0


@command("import")
def _import(args: argparse.Namespace) -> int:
    """Load exported config files into a database (all validated before anything is written)."""
    from .runtime.files import load
    from .store.tuned import import_tuned

    def progress(done: int, total: int) -> None:
        print(f"importing: {done}/{total} configs", file=sys.stderr, flush=True)

    loaded = [load(path) for path in args.files]  # a refused file leaves the database unopened, uncreated
    count = import_tuned(_connect_to_write(args.db), loaded, progress)
    print(f"imported {count} tuned configs from {len(args.files)} file(s)")
    return 0


@command("report")
def _report(args: argparse.Namespace) -> int:
    """Draw PNG plots: TFLOPS per problem, and best-so-far against trial number."""
    from .report import write_report
    from .store import connect
    from .store.filters import Filters

    filters = Filters(gpu=args.gpu, dtype=args.dtype, head_dim=args.head_dim, causal=args.causal)
    out = _out_dir(args.out)  # refused before the database is opened
    paths = write_report(connect(args.db, readonly=True), out, filters)
    for path in paths:
        print(path)
    return 0 if paths else 1


def emit(rows: list[dict], columns: list[str], fmt: str, title: str = "") -> None:
    """Print rows as JSON (a list of objects), CSV (nested values as JSON) or a table."""
    import csv

    if fmt == "json":
        print(json.dumps(rows, indent=2, sort_keys=False, default=str))
        return
    flat = [{c: json.dumps(r[c], sort_keys=True) if isinstance(r[c], (dict, list)) else r[c] for c in columns}
            for r in rows]
    if fmt == "csv":
        writer = csv.DictWriter(sys.stdout, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(flat)
        return
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    # Every cell and the title (a path) is database or user text: escaped, a "[/]" in a GPU
    # name is shown, not read as rich markup.
    table = Table(title=escape(title))
    shown = [c for c in columns if c != "config"]
    for c in shown:
        table.add_column(c, overflow="fold")
    speeds = [c for c in shown if "tflops" in c.lower()]
    interpreted = False
    for r in flat:
        cells = {c: _cell(r[c]) for c in shown}
        if speeds and _interpreted(r):  # as the tune summary shows them: not speeds
            cells.update({c: "-" for c in speeds})
            interpreted = True
        table.add_row(*(escape(cells[c]) for c in shown))
    Console(width=max(120, 14 * len(shown))).print(table)
    if interpreted:
        print(INTERPRETER_SPEEDS)


# One rendering of a speed timed in Triton's interpreter, wherever a table shows it.
INTERPRETER_SPEEDS = ("Note: TFLOPS are shown as '-' for timings from Triton's interpreter (no GPU): they are not "
                      "speeds; --format json or csv gives the stored numbers.")


def _interpreted(row: dict) -> bool:
    """A row measured in Triton's interpreter (its GPU is the interpreter's stand-in)."""
    return row.get("capability") == "interpreter" or str(row.get("gpu") or "").startswith("Triton interpreter")


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


_CAUSAL_WORDS = {"1": True, "true": True, "yes": True, "causal": True,
                 "0": False, "false": False, "no": False, "full": False}


def _causal_spelling(argv: list[str]) -> list[str]:
    """``--causal`` is a flag (``--no-causal`` its opposite) in every command; the older
    ``--causal true|false`` (and ``--causal=false``) of query and report still means the same."""
    out, i = [], 0
    while i < len(argv):
        item = argv[i]
        value = None
        if item.startswith("--causal="):
            value = item.partition("=")[2]
        elif item == "--causal" and i + 1 < len(argv) and argv[i + 1].lower() in _CAUSAL_WORDS:
            value, i = argv[i + 1], i + 1
        if value is None:
            out.append(item)
        elif value.lower() in _CAUSAL_WORDS:
            out.append("--causal" if _CAUSAL_WORDS[value.lower()] else "--no-causal")
        else:
            out.append(item)  # argparse says what is wrong with it
        i += 1
    return out


@command("bench")
def _bench(args: argparse.Namespace) -> int:
    """Time every attention provider side by side on the GPU (each output checked first)."""
    import torch

    from .bench import Bench, default_providers, markdown, matmul_ceiling, merge, resume, write

    if args.merge:
        if args.resume or args.match or args.with_forward or args.seqlen is not None or args.rounds != 1:
            raise FaAutotuneError("--merge only reads earlier outputs: it takes no --resume, --match, --with-forward, "
                                  "--rounds or problem flags")
        summary = merge([Path(p) for p in args.merge], Path(args.out))
        print(markdown(summary, tuple(summary["providers"])))
        return 0
    space = load_space(args.space)
    if args.with_forward and space.kind != "bwd":
        raise FaAutotuneError(f"--with-forward times backward problems with their forward: use --space bwd "
                              f"(got the {args.space!r} space, kind {space.kind!r})")
    if not torch.cuda.is_available():
        raise FaAutotuneError("bench compares GPU kernels and needs a CUDA GPU (the interpreter's timings mean nothing)")
    if args.seqlen is not None:
        problems, name = [problem_from_args(args, kind=space.kind)], "one problem"
    else:
        if args.preset not in space.presets:
            raise FaAutotuneError(f"unknown preset {args.preset!r}; available: {', '.join(sorted(space.presets))}")
        problems, name = list(space.presets[args.preset].problems), args.preset
    if args.match:
        problems, name = _matching(problems, args), f"{name} (problems matching {args.match})"
    providers = tuple(p.strip() for p in args.providers.split(",")) if args.providers else default_providers(problems)
    bench = Bench(providers, args.db, rep_ms=args.rep_ms, with_forward=args.with_forward, rounds=args.rounds)
    ceiling, rows = resume(Path(args.out), providers, args.rounds) if args.resume else (None, [])
    ceiling = ceiling or matmul_ceiling()
    done = {r.problem for r in rows}
    for i, problem in enumerate(problems):
        if bench.row_key(problem) in done:
            continue
        print(f"[{i + 1}/{len(problems)}] {bench.row_key(problem)}", file=sys.stderr, flush=True)
        rows.append(bench.run_problem(problem))
        # Written after every problem: an interrupted run keeps what it measured.
        write(rows, providers, ceiling, Path(args.out), name, rounds=args.rounds)
    print(markdown(write(rows, providers, ceiling, Path(args.out), name, rounds=args.rounds), providers))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fa-autotune", description="Tune Triton FlashAttention kernels per GPU.",
                                     epilog="Run 'fa-autotune COMMAND --help' for a command's options and examples.")
    parser.add_argument("--version", action="version", version=f"fa_autotune {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = _subcommand(sub, "render", _render)
    _add_config_flags(p)
    p.add_argument("--out", default=None, help="directory (default: the kernel cache)")
    p.add_argument("--show", action="store_true", help="also print the source")

    p = _subcommand(sub, "compile", _compile)
    _add_config_flags(p)
    add_problem_flags(p)
    p.add_argument("--arch", type=_arch, default=(9, 0),
                   help="compute capability to compile for, MAJOR.MINOR (default 9.0, Hopper)")

    p = _subcommand(sub, "tune", _tune)
    p.add_argument("--preset", default=None, help="named problem set of the search space (default: smoke without a "
                                                   "GPU, quick with one)")
    p.add_argument("--match", default=None, help="only the preset's problems whose key contains each of these "
                                                  "comma-separated parts, e.g. d128,causal")
    add_problem_flags(p)
    # None here so that --model can tell a flag given from its default (_tune_groups fills them
    # in); the help still says what a plain --seqlen run uses.
    shown = {action.dest: action.default for action in p._actions
             if action.dest in ("batch", "heads", "head_dim", "dtype")}
    p.set_defaults(seqlen=None, batch=None, heads=None, head_dim=None, dtype=None, causal=None, causal_align=None)
    for action in p._actions:
        if action.dest in shown:
            model = "16384 tokens per sequence length" if action.dest == "batch" else "the config's"
            action.help = f"{action.help} (default: {shown[action.dest]}; with --model: {model})"
        elif action.dest == "causal":
            action.help = "a causal mask; --no-causal: none (default: none; with --model: causal for decoder models)"
        elif action.dest == "causal_align":
            action.help += " (default: top_left; --model and --recorded bring their own)"
    p.add_argument("--space", default=None, help="search space name (search_spaces/NAME.yaml) or a YAML path "
                                                  "(default fwd)")
    g = p.add_argument_group("workload (instead of a preset or --seqlen)")
    g.add_argument("--model", default=None, metavar="CONFIG",
                   help="tune what a model runs: a Hugging Face config.json (a path, or a model id already in the "
                        "local Hugging Face cache; nothing is downloaded); heads, KV heads, head dim and dtype "
                        "come from it (--dtype overrides); --batch sets every problem's batch (default: 16384 "
                        "tokens / seqlen; --serving: 1, 16 and 64 sequences)")
    g.add_argument("--seqlens", default=None, help="--model: comma-separated sequence lengths (default 1024,4096,8192 "
                                                   "up to the model's max_position_embeddings)")
    g.add_argument("--training", action="store_true", help="--model: also the backward problems")
    g.add_argument("--serving", action="store_true", help="--model: also KV-cache decode problems (one new token "
                                                          "against each length as the cache; --page-size)")
    g.add_argument("--recorded", default=None, metavar="PATH",
                   help="tune the problems a workload ran (recorded with FA_AUTOTUNE_RECORD=PATH or "
                        "fa_autotune.record(PATH)), untuned and most-called first, within --time-budget")
    g.add_argument("--dry-run", action="store_true", help="print the problems that would be tuned, tune nothing")
    p.add_argument("--trials", type=_positive_int, default=None,
                   help="trials per problem (re-running continues up to this)")
    p.add_argument("--time-budget", type=_positive_float, default=None, help="seconds for the whole run")
    p.add_argument("--sampler", default="tpe", choices=["tpe", "grid", "random"],
                   help="Optuna's TPE, every config of the space once, or random draws")
    p.add_argument("--seed", type=_seed, default=None, help=f"sampler seed, 0..{_MAX_SEED}")
    p.add_argument("--db", default=None, help="SQLAlchemy URL (default: FA_AUTOTUNE_DB or a SQLite file in the user "
                                               "cache dir)")
    p.add_argument("--study", default=None, help="study name prefix (default: fa-autotune)")
    p.add_argument("--jobs", type=_positive_int, default=None,
                   help="parallel compile processes (default: half the CPU cores)")
    p.add_argument("--retime-top", type=_positive_int, default=3,
                   help="re-time this many best configs before picking (at least 1: the winner is one of them)")
    p.add_argument("--trial-timeout", type=_positive_float, default=180.0, help="seconds before a trial counts as hung")
    p.add_argument("--no-warm-start", action="store_true", help="do not seed studies with known-good configs")
    p.add_argument("--max-error", type=_positive_float, default=None,
                   help="FP8 (--dtype fp8): relative error vs float32 a config may have; time and error are both "
                        "minimized and the Pareto front stored (query pareto)")
    p.add_argument("--quiet", action="store_true", help="no live progress, only the summary")
    p.add_argument("--gpus", default=None, help="one worker per GPU of this host: 'all' or ids like 0,1 (each "
                                                "pinned with CUDA_VISIBLE_DEVICES, sharing the database and --jobs)")
    p.add_argument("--worker-slot", type=_worker_slot, default=(0, 1), help=argparse.SUPPRESS)  # set by --gpus

    p = _subcommand(sub, "query", _query)
    p.add_argument("what", choices=["best", "trials", "failures", "compare", "coverage", "pareto"],
                   help="best: winner per problem; trials: every measurement; pareto: FP8 time/error fronts; "
                        "failures: counts and examples by "
                        "status; compare: the same problems on two GPUs/software versions (--a, --b); coverage: "
                        "which problems of --preset are tuned, and how far the nearest tuned one is")
    _add_db_flags(p)
    p.add_argument("--format", default="table", choices=["table", "json", "csv"], help="output format")
    p.add_argument("--status", default=None, help="ok, invalid_config, compile_error, out_of_resources, "
                                                   "wrong_result, timeout or crashed")
    p.add_argument("--problem", default=None, help="exact problem key")
    p.add_argument("--limit", type=_positive_int, default=None, help="at most this many rows")
    p.add_argument("--a", default=None, help="compare: one side, KEY=VALUE (gpu=H100, triton=3.6.0, ...)")
    p.add_argument("--b", default=None, help="compare: the other side")
    p.add_argument("--preset", default=None, help="coverage: the problem set")
    p.add_argument("--space", default="fwd", help="coverage: search space holding the preset")

    p = _subcommand(sub, "bench", _bench)
    p.add_argument("--preset", default="llm-prefill", help="named problem set of --space (ignored with --seqlen)")
    add_problem_flags(p)
    p.set_defaults(seqlen=None)
    p.add_argument("--space", default="fwd", help="search space holding the preset")
    p.add_argument("--providers", default=None, help="comma-separated subset of: tuned, default, tutorial, cudnn, "
                                                     "flash, efficient, flex, fa4 (FlashAttention-4, the [fa4] extra), "
                                                     "tuned_quantize (FP8 rows: attention_fp8 quantizing itself)")
    p.add_argument("--db", default=None, help="database for the tutorial baseline's tuning (default: FA_AUTOTUNE_DB "
                                               "or the user cache dir)")
    p.add_argument("--rep-ms", type=_positive_float, default=200.0, help="timing repetitions per provider, in ms")
    p.add_argument("--rounds", type=_positive_int, default=1, help="times each provider is timed per problem, the providers "
                   "taking turns (ratio: the median of the rounds' ratios); more rounds settle near-equal ratios "
                   "that clock and power drift would otherwise decide")
    p.add_argument("--with-forward", action="store_true", help="backward problems (--space bwd): time each "
                   "provider's forward and backward together, as a training step runs them (TFLOPS count 3.5x "
                   "the forward's FLOPs)")
    p.add_argument("--out", default="bench-results", help="directory for bench.json, bench.md and bench.png")
    p.add_argument("--match", default=None, help="only the preset's problems whose key contains each of these "
                   "comma-separated parts, e.g. d128,causal")
    p.add_argument("--resume", action="store_true", help="keep the problems already in --out's bench.json and "
                   "measure only the rest (an interrupted run continues)")
    p.add_argument("--merge", nargs="+", default=None, metavar="DIR",
                   help="no timing: merge earlier bench outputs (bench.json or its folder) from GPUs of the same "
                        "model and software into one table in --out")

    p = _subcommand(sub, "export", _export)
    p.add_argument("--db", default=None, help="SQLAlchemy URL (default: FA_AUTOTUNE_DB or the user cache dir)")
    p.add_argument("--out", required=True, help="directory for the files")
    p.add_argument("--gpu", default=None, help="only GPUs whose name contains this")

    p = _subcommand(sub, "import", _import)
    p.add_argument("files", nargs="+", help="exported JSON files")
    p.add_argument("--db", default=None, help="SQLAlchemy URL (default: FA_AUTOTUNE_DB or the user cache dir)")

    p = _subcommand(sub, "report", _report)
    _add_db_flags(p)
    p.add_argument("--out", required=True, help="directory for the PNG files")
    return parser


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and examples as written; each option's default shown after its help
    unless the help already says it, or there is none to show (None, False)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if ("%(default)" in text or "default" in text or not action.option_strings
                or action.default in (None, False, argparse.SUPPRESS)):
            return text
        return text + " (default: %(default)s)"


# Shown under each command's --help: commands as a user types them.
_EXAMPLES = {
    "render": ["fa-autotune render --config '{\"BLOCK_M\": 64, \"BLOCK_N\": 64}' --show",
               "fa-autotune render --config '{\"loop_order\": \"split_kv\", \"num_splits\": 4}' --out kernels/"],
    "compile": ["fa-autotune compile --config '{\"access\": \"tensor_desc\"}' --head-dim 128 --causal",
                "fa-autotune compile --config-file config.json --arch 8.0 --seqlen 4096"],
    "tune": ["fa-autotune tune                         # the quick preset (smoke without a GPU)",
             "fa-autotune tune --batch 4 --heads 32 --kv-heads 8 --seqlen 8192 --head-dim 128 --dtype bf16 --causal",
             "fa-autotune tune --preset llm-prefill --match d128,causal --trials 60 --db sqlite:////data/fa.sqlite",
             "fa-autotune tune --gpus all --time-budget 3600"],
    "query": ["fa-autotune query best",
              "fa-autotune query best --dtype bf16 --head-dim 128 --causal --format csv",
              "fa-autotune query trials --status compile_error --limit 20",
              "fa-autotune query compare --a gpu=H100 --b gpu=H200",
              "fa-autotune query coverage --preset llm-prefill"],
    "bench": ["fa-autotune bench --preset llm-prefill --out bench-results",
              "fa-autotune bench --seqlen 4096 --head-dim 128 --dtype bf16 --causal --providers tuned,cudnn",
              "fa-autotune bench --merge run1/ run2/ --out merged/"],
    "export": ["fa-autotune export --out tuned/",
               "fa-autotune export --gpu H200 --out tuned/ --db sqlite:////data/fa.sqlite"],
    "import": ["fa-autotune import tuned/nvidia-h200.attn_fwd.json",
               "fa-autotune import tuned/*.json --db sqlite:////data/fa.sqlite"],
    "report": ["fa-autotune report --out plots/",
               "fa-autotune report --gpu H200 --dtype bf16 --no-causal --out plots/"],
}


def _subcommand(sub, name: str, handler: Handler) -> argparse.ArgumentParser:
    """The subparser of ``name``: the handler's docstring as its help and description, its
    examples as the epilog, defaults shown."""
    epilog = "examples:\n" + "\n".join(f"  {line}" for line in _EXAMPLES[name])
    return sub.add_parser(name, help=handler.__doc__, description=handler.__doc__, epilog=epilog,
                          formatter_class=_HelpFormatter)


def _add_db_flags(p: argparse.ArgumentParser) -> None:
    """--db and the filters shared by query and report."""
    p.add_argument("--db", default=None, help="SQLAlchemy URL (default: FA_AUTOTUNE_DB or the user cache dir)")
    p.add_argument("--gpu", default=None, help="substring of the GPU name")
    p.add_argument("--dtype", default=None, help="only this dtype (fp16, bf16, ...)")
    p.add_argument("--head-dim", type=int, default=None, help="only this head dimension")
    p.add_argument("--causal", action=argparse.BooleanOptionalAction, default=None,
                   help="only causal problems; --no-causal: only those without a mask (default: both)")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {_quote(text)}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _arch(text: str) -> tuple[int, int]:
    """A compute capability, MAJOR.MINOR: "9.0" -> (9, 0)."""
    import re

    match = re.fullmatch(r"\s*(\d{1,2})\.(\d{1,2})\s*", text)
    if not match:
        hint = f"; did you mean {int(text)}.0?" if text.strip().isdigit() and len(text.strip()) <= 2 else ""
        raise argparse.ArgumentTypeError(f"expected a compute capability MAJOR.MINOR like 9.0 or 8.0, got "
                                          f"{_quote(text)}{hint}")
    cap = int(match[1]), int(match[2])
    if cap < _MIN_ARCH:  # older GPUs crash Triton's compiler process instead of failing
        raise argparse.ArgumentTypeError(f"Triton compiles for compute capability {_MIN_ARCH[0]}.{_MIN_ARCH[1]} "
                                          f"and newer, got {text.strip()}")
    return cap


_MIN_ARCH = (7, 0)


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {_quote(text)}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {value}")
    return value


# Optuna's samplers hand the seed to numpy (0 .. 2**32 - 1); a resumed study and each worker
# of `tune --gpus` add their trial count or slot to it, hence the headroom.
_MAX_SEED = 2**31 - 1


def _seed(text: str) -> int:
    value = _non_negative_int(text)
    if value > _MAX_SEED:
        raise argparse.ArgumentTypeError(f"expected a seed from 0 to {_MAX_SEED}, got {value}")
    return value


def _positive_float(text: str) -> float:
    """A positive, finite number: 0 would time every trial out (or end the run at once),
    and nan/inf compare false with everything, so no limit would hold."""
    import math

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {_quote(text)}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive, finite number, got {_quote(text)}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(_causal_spelling(argv))
    args.argv = argv
    try:
        code = _COMMANDS[args.command](args)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
        return code
    except BrokenPipeError:
        return _reader_gone()
    except FaAutotuneError as exc:
        print(f"fa-autotune {args.command}: error: {one_line(str(exc))}", file=sys.stderr)
        return 2
    except OSError as exc:  # a file the command reads or writes (permissions, full disk, a directory)
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"fa-autotune {args.command}: error: {one_line(where + (exc.strerror or str(exc)))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        resume = ("; every finished trial is stored: run the same command again to resume"
                  if args.command == "tune" else "")
        print(f"fa-autotune {args.command}: interrupted{resume}", file=sys.stderr)
        return 130


def _reader_gone() -> int:
    """The reader of our output went away (``fa-autotune query ... | head``): stop quietly, as
    a command killed by SIGPIPE would, with its exit status (128 + 13). Standard output is
    pointed at /dev/null so the interpreter's last flush does not complain on stderr."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no real file descriptor (captured output): nothing to flush
        pass
    return 141

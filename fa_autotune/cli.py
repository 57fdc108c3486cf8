"""``fa-autotune`` (also ``python -m fa_autotune``): the command-line front end.

Each subcommand is a thin layer over a pipeline module; argument errors and
:class:`FaAutotuneError` become one-line messages and exit status 2, never tracebacks.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable, Sequence

from .errors import FaAutotuneError

Handler = Callable[[argparse.Namespace], int]
_COMMANDS: dict[str, Handler] = {}


def command(name: str) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        _COMMANDS[name] = fn
        return fn

    return register


def add_problem_flags(parser: argparse.ArgumentParser, required: bool = False) -> None:
    group = parser.add_argument_group("problem (SDPA's B, H, N, D)")
    group.add_argument("--batch", type=int, default=1)
    group.add_argument("--heads", type=int, default=16, help="query heads")
    group.add_argument("--kv-heads", type=int, default=None, help="key/value heads (GQA); default: --heads")
    group.add_argument("--seqlen", type=int, required=required, default=None if required else 1024)
    group.add_argument("--seqlen-k", type=int, default=None, help="key length; default: --seqlen")
    group.add_argument("--head-dim", type=int, default=128)
    group.add_argument("--dtype", default="float16", help="float16|bfloat16|float32 (fp16, bf16, fp32)")
    group.add_argument("--causal", action="store_true")
    group.add_argument("--causal-align", default="top_left", choices=["top_left", "bottom_right"])


def problem_from_args(args: argparse.Namespace):
    from .problem import Problem

    return Problem(
        batch=args.batch, heads_q=args.heads, heads_kv=args.kv_heads or args.heads, seqlen_q=args.seqlen,
        seqlen_k=args.seqlen_k if args.seqlen_k is not None else args.seqlen, head_dim=args.head_dim,
        dtype=args.dtype, causal=args.causal, causal_align=args.causal_align,
    )


def config_from_args(args: argparse.Namespace):
    from .config import KernelConfig
    from .errors import ConfigError

    text = args.config
    if args.config_file:
        text = Path(args.config_file).read_text()
    try:
        data = json.loads(text) if text else {}
    except json.JSONDecodeError as exc:
        raise ConfigError("config", f"not valid JSON ({exc})") from exc
    return KernelConfig.from_mapping(data)


def _add_config_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=None, help='template parameters as JSON, e.g. \'{"BLOCK_M": 64}\'')
    parser.add_argument("--config-file", default=None, help="JSON file of template parameters")


@command("render")
def _render(args: argparse.Namespace) -> int:
    """Write a variant's Triton module into the kernel cache (or --out) and print its path."""
    from .codegen import render, write_module

    rendered = render(config_from_args(args))
    path = write_module(rendered, Path(args.out) if args.out else None)
    print(path)
    if args.show:
        print(rendered.source)
    return 0


@command("compile")
def _compile(args: argparse.Namespace) -> int:
    """Compile a variant for a GPU architecture without a GPU; report shared memory and wgmma."""
    from .aot import compile_many

    cap = tuple(int(x) for x in args.arch.split("."))
    (result,) = compile_many([config_from_args(args)], problem_from_args(args), capability=cap, jobs=1)
    report = {"variant": result.config.name, "status": result.status, "seconds": round(result.seconds, 2),
              "error": result.error, "kernels": [k.__dict__ for k in result.kernels]}
    print(json.dumps(report, indent=2))
    return 0 if result.status == "ok" else 1


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(prog="fa-autotune", description="Tune Triton FlashAttention kernels per GPU.")
    parser.add_argument("--version", action="version", version=f"fa_autotune {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("render", help=_render.__doc__)
    _add_config_flags(p)
    p.add_argument("--out", default=None, help="directory (default: the kernel cache)")
    p.add_argument("--show", action="store_true", help="also print the source")

    p = sub.add_parser("compile", help=_compile.__doc__)
    _add_config_flags(p)
    add_problem_flags(p)
    p.add_argument("--arch", default="9.0", help="compute capability to compile for (default 9.0, Hopper)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return _COMMANDS[args.command](args)
    except FaAutotuneError as exc:
        print(f"fa-autotune {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"fa-autotune {args.command}: interrupted", file=sys.stderr)
        return 130

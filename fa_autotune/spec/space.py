"""Search spaces as data: ``search_spaces/*.yaml`` parsed into frozen dataclasses.

Constraints are small expressions (names, numbers, strings, arithmetic, comparisons,
and/or/not) compiled into a checked AST and evaluated by a tiny interpreter, never by
``eval``. Every problem in a file is reported with the file, the line and the key.
"""
from __future__ import annotations

import ast
import functools
import hashlib
import itertools
import json
import operator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from ..errors import ConfigError, InputError, SearchSpaceError, one_line
from ..paths import data_dir, read_small_text
from .candidate import Candidate
from .config import GLUON_FIELDS, STRUCTURE_DEFAULTS, KernelConfig
from .problem import Problem
from .recipe import RECIPE_FIELDS

PROBLEM_NAMES = ("batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_k", "head_dim", "head_dim_pad",
                 "gqa_group", "causal", "dtype", "fp8", "page_size")
# What a space searches: the template parameters, and for FP8 problems the quantization
# recipe beside them (split off into the candidate's Fp8Recipe where a sample becomes one).
PARAMETER_NAMES = tuple(f.name for f in fields(KernelConfig)) + tuple(RECIPE_FIELDS)
ARCH_KEYS = ("sm90", "sm80", "interpreter")
_PRESET_KEYS = {"batch", "heads", "kv_heads", "seqlen", "seqlen_k", "head_dim", "dtype", "causal", "causal_align",
                "hidden", "tokens", "page_size"}
# Kernel families a search space can describe, and the kind of problem each serves.
KERNELS = {"attn_fwd": "fwd", "attn_decode": "decode", "attn_bwd": "bwd"}

_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
}
_COMPARE: dict[type, Callable[[Any, Any], bool]] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
    ast.Gt: operator.gt, ast.GtE: operator.ge,
}


# ---------------------------------------------------------------- safe expressions
@dataclass(frozen=True)
class Expression:
    """A validated constraint; ``where`` locates it in its file for error messages."""

    text: str
    where: str
    tree: ast.Expression

    @functools.cached_property
    def parameters(self) -> frozenset[str]:
        """Template parameters the expression reads (kept: grids ask for every node)."""
        return frozenset(n.id for n in ast.walk(self.tree) if isinstance(n, ast.Name) and n.id in PARAMETER_NAMES)

    @classmethod
    def parse(cls, text: str, where: str, names: tuple[str, ...]) -> "Expression":
        if not isinstance(text, str) or not text.strip():
            raise SearchSpaceError(f"{where}: a constraint must be a non-empty string, got {text!r}")
        if len(text) > MAX_EXPRESSION_CHARS:
            raise SearchSpaceError(f"{where}: constraint is {len(text)} characters long, at most "
                                   f"{MAX_EXPRESSION_CHARS} allowed")
        try:
            tree = ast.parse(text.strip(), mode="eval")
        except SyntaxError as exc:
            raise SearchSpaceError(f"{where}: constraint {text[:80]!r} is not an expression ({exc.msg})") from None
        except (RecursionError, MemoryError):
            raise SearchSpaceError(f"{where}: constraint {text[:80]!r} is nested too deeply") from None
        nodes = list(ast.walk(tree))
        if len(nodes) > MAX_EXPRESSION_NODES or _depth(tree) > MAX_EXPRESSION_DEPTH:
            raise SearchSpaceError(f"{where}: constraint {text[:80]!r} is too complex (at most "
                                   f"{MAX_EXPRESSION_NODES} terms, {MAX_EXPRESSION_DEPTH} levels deep)")
        for node in nodes:
            _check_node(node, text, where, names)
        return cls(text.strip(), where, tree)

    @functools.cached_property
    def _function(self) -> Callable[[Mapping[str, Any]], Any]:
        return _compile(self.tree.body)

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without the compiled closures (built again where it is evaluated)."""
        return {name: value for name, value in self.__dict__.items() if name != "_function"}

    def evaluate(self, env: Mapping[str, Any]) -> bool:
        """True or false for ``env``; anything else (a number, a division by zero, a string
        used as a number) is a SearchSpaceError naming the file, line and key."""
        try:
            value = self._function(env)
        except _EvalError as exc:
            raise SearchSpaceError(f"{self.where}: constraint {self.text!r} cannot be evaluated: {exc}") from None
        if not isinstance(value, bool):
            raise SearchSpaceError(f"{self.where}: constraint {self.text!r} gives {value!r}, not true or false")
        return value


MAX_EXPRESSION_CHARS, MAX_EXPRESSION_NODES, MAX_EXPRESSION_DEPTH = 2000, 400, 40


class _EvalError(Exception):
    pass


def _depth(node: ast.AST) -> int:
    """Nesting depth, iteratively (a recursive walk would overflow on the inputs it rejects)."""
    deepest, stack = 0, [(node, 1)]
    while stack:
        current, level = stack.pop()
        deepest = max(deepest, level)
        if deepest > MAX_EXPRESSION_DEPTH:
            return deepest
        stack.extend((child, level + 1) for child in ast.iter_child_nodes(current))
    return deepest


def _number(value: Any, what: str) -> int | float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _EvalError(f"{what} needs numbers, got {value!r}")
    return value


_ALLOWED = (ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.USub, ast.UAdd,
            ast.BinOp, ast.Compare, ast.Name, ast.Load, ast.Constant, *_BINARY, *_COMPARE)


def _check_node(node: ast.AST, text: str, where: str, names: tuple[str, ...]) -> None:
    if not isinstance(node, _ALLOWED):
        raise SearchSpaceError(f"{where}: constraint {text!r} uses {type(node).__name__}, which is not allowed "
                               "(names, numbers, strings, arithmetic, comparisons, and/or/not only)")
    if isinstance(node, ast.Constant) and not isinstance(node.value, (bool, int, float, str)):
        raise SearchSpaceError(f"{where}: constraint {text!r} has an unsupported literal {node.value!r}")
    if isinstance(node, ast.Name) and node.id not in names and node.id not in ("true", "false"):
        raise SearchSpaceError(f"{where}: constraint {text!r} uses unknown name {node.id!r}; "
                               f"known: {', '.join(names)}")


def _compile(node: ast.AST) -> Callable[[Mapping[str, Any]], Any]:
    """A parsed (hence size-bounded) expression as nested closures, built once: typed
    operators, arithmetic on numbers only, ordering between two numbers or two strings, no
    division by zero. Closures rather than a walk of the tree per call: a grid evaluates
    constraints millions of times (benchmarks/results/2026-12-07-cpu-grid-walk/)."""
    if isinstance(node, ast.Constant):
        constant = node.value
        return lambda env: constant
    if isinstance(node, ast.Name):
        if node.id in ("true", "false"):
            truth = node.id == "true"
            return lambda env: truth
        name = node.id
        return lambda env: env[name]
    if isinstance(node, ast.BoolOp):
        parts = tuple(_compile(v) for v in node.values)
        if isinstance(node.op, ast.And):
            return lambda env: all(part(env) for part in parts)
        return lambda env: any(part(env) for part in parts)
    if isinstance(node, ast.UnaryOp):
        operand = _compile(node.operand)
        if isinstance(node.op, ast.Not):
            return lambda env: not operand(env)
        negate = isinstance(node.op, ast.USub)
        return lambda env: -_number(operand(env), "a sign") if negate else _number(operand(env), "a sign")
    if isinstance(node, ast.BinOp):
        return _compile_binary(node)
    if isinstance(node, ast.Compare):
        return _compile_compare(node)
    raise _EvalError(f"unexpected expression node {type(node).__name__}")  # unreachable after parse


def _compile_binary(node: ast.BinOp) -> Callable[[Mapping[str, Any]], Any]:
    symbol = type(node.op).__name__.lower()
    left, right, apply = _compile(node.left), _compile(node.right), _BINARY[type(node.op)]
    divides = isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod))

    def binary(env: Mapping[str, Any]) -> Any:
        a, b = _number(left(env), symbol), _number(right(env), symbol)
        if divides and b == 0:
            raise _EvalError(f"{symbol} by zero")
        try:
            return apply(a, b)
        except (OverflowError, ValueError) as exc:
            raise _EvalError(str(exc)) from None
    return binary


def _compile_compare(node: ast.Compare) -> Callable[[Mapping[str, Any]], bool]:
    first = _compile(node.left)
    steps = tuple((_COMPARE[type(op)], isinstance(op, (ast.Eq, ast.NotEq)), _compile(comparator))
                  for op, comparator in zip(node.ops, node.comparators))

    def compare(env: Mapping[str, Any]) -> bool:
        left = first(env)
        for apply, equality, comparator in steps:
            right = comparator(env)
            if not equality:
                both_strings = isinstance(left, str) and isinstance(right, str)
                both_numbers = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (left, right))
                if not (both_strings or both_numbers):
                    raise _EvalError(f"cannot order {left!r} and {right!r}")
            if not apply(left, right):
                return False
            left = right
        return True
    return compare


# ---------------------------------------------------------------- the space
@dataclass(frozen=True)
class Parameter:
    """Candidate values of one template parameter; searched only where ``when`` holds."""

    name: str
    choices: tuple
    when: Expression | None = None
    otherwise: Any = None

    def active(self, env: Mapping[str, Any]) -> bool:
        return self.when is None or bool(self.when.evaluate(env))


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    problems: tuple[Problem, ...]


@dataclass(frozen=True)
class ArchOverride:
    parameters: tuple[Parameter, ...]
    constraints: tuple[Expression, ...]


@dataclass(frozen=True)
class SearchSpace:
    """Parameters, constraints and presets of one file, optionally resolved for an arch."""

    name: str
    path: str
    parameters: tuple[Parameter, ...]
    constraints: tuple[Expression, ...]
    presets: Mapping[str, Preset]
    arch: Mapping[str, ArchOverride]
    resolved_for: str | None = None

    @property
    def kind(self) -> str:
        """The kind of problem the space's kernels serve (fwd, decode, bwd)."""
        return KERNELS.get(self.name, "fwd")

    def for_arch(self, arch: str) -> "SearchSpace":
        """The space as seen on ``arch`` ("sm90", "sm80" or "interpreter")."""
        if arch not in ARCH_KEYS:
            raise SearchSpaceError(f"unknown architecture {arch!r}; expected one of {ARCH_KEYS}")
        override = self.arch.get(arch)
        if override is None:
            return SearchSpace(self.name, self.path, self.parameters, self.constraints, self.presets, self.arch, arch)
        replaced = {p.name: p for p in override.parameters}
        params = tuple(replaced.get(p.name, p) for p in self.parameters)
        return SearchSpace(self.name, self.path, params, self.constraints + override.constraints,
                           self.presets, self.arch, arch)

    def violated(self, params: Mapping[str, Any], problem: Problem) -> Expression | None:
        """The first constraint ``params`` break on ``problem``, or None."""
        env = dict(_problem_env(problem), **params)
        for constraint in self.constraints:
            if not constraint.evaluate(env):
                return constraint
        return None

    def choices_for(self, parameter: Parameter, problem: Problem) -> tuple:
        """Candidates of ``parameter`` that pass every constraint naming only it and the
        problem: fixed for a given problem, so one Optuna study sees fixed choices."""
        env = _problem_env(problem)
        own = [c for c in self.constraints if c.parameters == frozenset({parameter.name})]
        return tuple(v for v in parameter.choices if all(c.evaluate(dict(env, **{parameter.name: v})) for c in own))

    def suggest(self, choose: Callable[[str, tuple], Any], problem: Problem) -> dict[str, Any]:
        """Walk the parameters in file order; ``choose(name, choices)`` picks each active
        one (an Optuna trial's suggest_categorical), inactive ones take their fallback."""
        env = _problem_env(problem)
        params: dict[str, Any] = {}
        for parameter in self.parameters:
            if not parameter.active(dict(env, **params)):
                params[parameter.name] = parameter.otherwise
                continue
            choices = self.choices_for(parameter, problem)
            if not choices:
                raise SearchSpaceError(f"{self.path}: no value of {parameter.name} suits {problem.key}")
            params[parameter.name] = choices[0] if len(choices) == 1 else choose(parameter.name, choices)
        return params

    def grid(self, problem: Problem) -> list[Candidate]:
        """Every candidate of the space (a config, with its recipe on an FP8 problem) that
        satisfies the constraints on ``problem``."""
        return [candidate for _, candidate in self.grid_rows(problem)]

    def grid_rows(self, problem: Problem) -> list[tuple[dict[str, Any], Candidate]]:
        """Every candidate of :meth:`grid` with the parameters :meth:`suggest` would choose
        for it (the active ones), so a sampler can tell which choices still lead to one."""
        out: list[tuple[dict[str, Any], Candidate]] = []
        env = _problem_env(problem)
        for params, active, proven in self._leaves(problem, self._checks_by_depth()):
            # the constraints in file order, as written: the first false one excludes the
            # config, one that cannot be evaluated raises (those the walk found true skipped)
            full = dict(env, **params)
            if all(c.evaluate(full) for i, c in enumerate(self.constraints) if i not in proven):
                try:
                    candidate = Candidate.from_mapping(params, problem.is_fp8)
                except ConfigError:
                    continue
                out.append(({name: params[name] for name in active}, candidate))
        return out

    def _checks_by_depth(self) -> list[tuple[tuple[int, Expression], ...]]:
        """Per parameter index, the constraints (with their place in the file) whose
        parameters are all set once it is: the walk evaluates them there, so that a branch
        can be dropped once instead of at every leaf under it."""
        order = {p.name: i for i, p in enumerate(self.parameters)}
        depth: list[list[tuple[int, Expression]]] = [[] for _ in self.parameters]
        for i, constraint in enumerate(self.constraints):
            if constraint.parameters and constraint.parameters <= order.keys():
                depth[max(order[name] for name in constraint.parameters)].append((i, constraint))
        return [tuple(checks) for checks in depth]

    def _leaves(self, problem: Problem, checks: list[tuple[tuple[int, Expression], ...]],
                ) -> list[tuple[dict[str, Any], tuple[str, ...], frozenset[int]]]:
        """What :meth:`_walk` finds from the root: each combination it keeps, with its active
        parameters and the constraints proven true on the way there."""
        leaves: list[tuple[dict[str, Any], tuple[str, ...], frozenset[int]]] = []
        self._walk(leaves, _problem_env(problem), functools.partial(self._choices, {}, problem), 0, {}, (),
                   frozenset(), checks)
        return leaves

    def _choices(self, known: dict[str, tuple], problem: Problem, parameter: Parameter) -> tuple:
        """:meth:`choices_for`, each parameter's worked out once per grid (they depend on the
        problem alone)."""
        if parameter.name not in known:
            known[parameter.name] = self.choices_for(parameter, problem)
        return known[parameter.name]

    def _walk(self, leaves: list, problem_env: Mapping[str, Any], choices: Callable[[Parameter], tuple],
              index: int, params: dict[str, Any], active: tuple[str, ...], proven: frozenset[int],
              checks: list[tuple[tuple[int, Expression], ...]]) -> None:
        """Appends to ``leaves`` the combinations under ``params``, with the constraints found true on the way
        (``proven``). A branch is dropped where a constraint is false and every constraint
        before it in the file is proven true there: the leaves' check in file order would
        exclude each config under it at that constraint, raising nothing. Any other outcome
        (false after an unproven one, or an error) is left to the leaves."""
        if index == len(self.parameters):
            leaves.append((dict(params), active, proven))
            return
        parameter = self.parameters[index]
        env = dict(problem_env, **params)
        if parameter.active(env):
            values = choices(parameter)
            # a single choice is taken without asking the sampler (see suggest)
            chosen = active + (parameter.name,) if len(values) > 1 else active
        else:
            values, chosen = (parameter.otherwise,), active
        for value in values:
            params[parameter.name] = value
            env[parameter.name] = value
            known, dropped = proven, False
            for i, constraint in checks[index]:
                try:
                    holds = constraint.evaluate(env)
                except SearchSpaceError:
                    continue
                if holds:
                    known = known | {i}
                elif all(j in known for j in range(i)):
                    dropped = True
                    break
            if not dropped:
                self._walk(leaves, problem_env, choices, index + 1, params, chosen, known, checks)
        params.pop(parameter.name, None)

    @property
    def hash(self) -> str:
        payload = {"params": {p.name: [list(p.choices), p.when.text if p.when else None, p.otherwise]
                              for p in self.parameters},
                   "constraints": [c.text for c in self.constraints], "arch": self.resolved_for}
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:12]


def _problem_env(problem: Problem) -> dict[str, Any]:
    return {"batch": problem.batch, "heads_q": problem.heads_q, "heads_kv": problem.heads_kv,
            "seqlen_q": problem.seqlen_q, "seqlen_k": problem.seqlen_k, "head_dim": problem.head_dim,
            "head_dim_pad": problem.head_dim_pad, "gqa_group": problem.gqa_group, "causal": problem.causal,
            "dtype": problem.dtype, "fp8": problem.is_fp8, "page_size": problem.page_size}


# ---------------------------------------------------------------- loading
def load_space(name_or_path: str | Path = "fwd") -> SearchSpace:
    """Load ``search_spaces/<name>.yaml`` (or a path); errors name file, line and key."""
    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml"):
        path = data_dir("search_spaces") / f"{name_or_path}.yaml"
    if not path.is_file():
        raise SearchSpaceError(f"search space file {path} does not exist")
    text = read_small_text(path, MAX_SPACE_BYTES, SearchSpaceError, str(path),
                           "; a search space is a few KiB")
    return parse_space(text, str(path))


# Bounds on what a search-space file may make the loader do: the shipped ones are ~10 KiB and
# ~500 YAML nodes. Aliases multiply: a 10 KiB file of nested anchors ("billion laughs")
# expands to billions of nodes, so the count is of the expanded tree, taken before any value
# is built.
MAX_SPACE_BYTES = 1024 * 1024
MAX_SPACE_NODES = 100_000


def parse_space(text: str, filename: str = "<string>") -> SearchSpace:
    import yaml

    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        _check_expansion(root, filename)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = one_line(str(getattr(exc, "problem", None) or exc), 200)
        raise SearchSpaceError(f"{filename}{line}: not valid YAML ({problem})") from None
    except RecursionError:
        raise SearchSpaceError(f"{filename}: nested too deeply to be a search space") from None
    loc = _Locator(filename, root)
    if not isinstance(data, dict):
        raise SearchSpaceError(f"{filename}: expected a mapping at the top level")
    unknown = set(data) - {"version", "kernel", "parameters", "constraints", "arch", "presets"}
    if unknown:
        key = sorted(unknown)[0]
        raise SearchSpaceError(f"{loc.at(key)}: unknown top-level key {key!r}")
    if data.get("version") != 1:
        raise SearchSpaceError(f"{loc.at('version')}: version must be 1, got {data.get('version')!r}")
    params = _parse_parameters(data.get("parameters"), loc, ("parameters",), require_all=True)
    names = PARAMETER_NAMES + PROBLEM_NAMES
    constraints = _parse_constraints(data.get("constraints", []), loc, ("constraints",), names)
    arch = {}
    for key, body in (data.get("arch") or {}).items():
        if key not in ARCH_KEYS:
            raise SearchSpaceError(f"{loc.at('arch', key)}: unknown architecture {key!r}; expected one of {ARCH_KEYS}")
        if not isinstance(body, dict) or set(body) - {"parameters", "constraints"}:
            raise SearchSpaceError(f"{loc.at('arch', key)}: expected 'parameters' and/or 'constraints'")
        arch[key] = ArchOverride(
            _parse_parameters(body.get("parameters") or {}, loc, ("arch", key, "parameters"), require_all=False),
            _parse_constraints(body.get("constraints", []), loc, ("arch", key, "constraints"), names),
        )
    kernel = data.get("kernel", "attn_fwd")
    if kernel not in KERNELS:
        raise SearchSpaceError(f"{loc.at('kernel')}: kernel must be one of {tuple(KERNELS)}, got {kernel!r}")
    presets = {name: _parse_preset(name, body, loc, KERNELS[kernel])
               for name, body in (data.get("presets") or {}).items()}
    return SearchSpace(kernel, filename, params, constraints, presets, arch)


def _check_expansion(root, filename: str) -> None:
    """Refuse a YAML document whose tree, aliases expanded, exceeds MAX_SPACE_NODES nodes or
    refers to itself: counted on the composed node graph (an alias is the anchored node
    again), each node's expanded size once, so the count itself stays cheap."""
    sizes: dict[int, int | None] = {}

    def size(node) -> int:
        key = id(node)
        if key in sizes:
            known = sizes[key]
            if known is None:
                raise SearchSpaceError(f"{filename}:{node.start_mark.line + 1}: an alias refers to a node that "
                                       "contains it (a recursive structure)")
            return known
        sizes[key] = None
        total = 1
        children = node.value if node.id == "sequence" else (
            [part for pair in node.value for part in pair] if node.id == "mapping" else [])
        for child in children:
            total += size(child)
            if total > MAX_SPACE_NODES:
                raise SearchSpaceError(f"{filename}:{node.start_mark.line + 1}: expands to more than "
                                       f"{MAX_SPACE_NODES} YAML nodes (nested aliases?); a search space has hundreds")
        sizes[key] = total
        return total

    if root is not None:
        size(root)


class _Locator:
    """Turns a key path into ``file:line (key.path)`` using the YAML node tree."""

    def __init__(self, filename: str, root) -> None:
        self.filename, self.root = filename, root

    def at(self, *path: Any) -> str:
        node, line = self.root, None
        for part in path:
            child = None
            if node is not None and node.id == "mapping":
                for key_node, value_node in node.value:
                    if key_node.value == str(part):
                        child, line = value_node, key_node.start_mark.line + 1
            elif node is not None and node.id == "sequence" and isinstance(part, int) and part < len(node.value):
                child = node.value[part]
                line = child.start_mark.line + 1
            node = child
        where = f"{self.filename}:{line}" if line else self.filename
        return f"{where} ({'.'.join(str(p) for p in path)})"


def _parse_parameters(raw: Any, loc: _Locator, path: tuple, require_all: bool) -> tuple[Parameter, ...]:
    if not isinstance(raw, dict) or (require_all and not raw):
        raise SearchSpaceError(f"{loc.at(*path)}: expected a mapping of parameter -> list of values")
    out = []
    for name, spec in raw.items():
        where = loc.at(*path, name)
        if name not in PARAMETER_NAMES:
            raise SearchSpaceError(f"{where}: unknown parameter {name!r}; known: {', '.join(PARAMETER_NAMES)}")
        out.append(_parse_parameter(name, spec, where))
    if require_all:
        optional = STRUCTURE_DEFAULTS.keys() | RECIPE_FIELDS.keys()  # left out: at their defaults
        missing = [n for n in PARAMETER_NAMES if n not in raw and n not in optional]
        if missing:
            raise SearchSpaceError(f"{loc.at(*path)}: missing parameters {missing}")
    return tuple(out)


def _parse_parameter(name: str, spec: Any, where: str) -> Parameter:
    when, otherwise, values = None, None, spec
    if isinstance(spec, dict):
        extra = set(spec) - {"values", "when", "otherwise"}
        if extra or "values" not in spec or ("when" in spec) != ("otherwise" in spec):
            raise SearchSpaceError(f"{where}: expected a list, or a mapping with 'values' (and 'when' + 'otherwise')")
        values = spec["values"]
        if "when" in spec:
            cond = spec["when"]
            if isinstance(cond, bool):  # YAML's bare true/false
                cond = str(cond).lower()
            if not isinstance(cond, str):
                raise SearchSpaceError(f"{where}.when: expected an expression (a string) or true/false, "
                                       f"got {cond!r}")
            when = Expression.parse(cond, f"{where}.when", PARAMETER_NAMES + PROBLEM_NAMES)
            otherwise = spec["otherwise"]
            _check_value(name, otherwise, f"{where}.otherwise")
    if not isinstance(values, list) or not values:
        raise SearchSpaceError(f"{where}: expected a non-empty list of values")
    if len(set(map(repr, values))) != len(values):
        raise SearchSpaceError(f"{where}: duplicate values in {values}")
    for value in values:
        _check_value(name, value, where)
    return Parameter(name, tuple(values), when, otherwise)


def _check_value(name: str, value: Any, where: str) -> None:
    """Each candidate must be a value the template (or the FP8 recipe) accepts on its own."""
    probe = {name: value}
    if name == "num_splits":
        probe["loop_order"] = "split_kv"
    if name == "q_tiles" and value > 2:
        probe["loop_order"] = "kv_outer"
    if name == "warp_specialize":
        probe.update(access="tensor_desc", num_stages=2)
    if name.startswith("dq_"):
        probe["loop_order"] = "backward"
    if name in GLUON_FIELDS or (name == "language" and value == "gluon"):
        probe.update(language="gluon", access="tensor_desc", BLOCK_M=64, BLOCK_N=64)
        if name == "consumer_regs":
            probe["consumers"] = 1
        if name == "consumers":  # each value with registers that leave the producer its share
            probe["consumer_regs"] = 160
        if name in ("dynamic", "section"):
            probe["persistent"] = 1
        if name == "half_step":
            probe.update(overlap=False, BLOCK_N=128)
    if name == "group_split":
        probe.update(loop_order="backward", language="gluon", access="tensor_desc", BLOCK_M=64, BLOCK_N=64)
    try:
        Candidate.from_mapping(probe, fp8=True)
    except ConfigError as exc:
        raise SearchSpaceError(f"{where}: value {value!r} rejected ({exc})") from None


def _parse_constraints(raw: Any, loc: _Locator, path: tuple, names: tuple[str, ...]) -> tuple[Expression, ...]:
    if not isinstance(raw, list):
        raise SearchSpaceError(f"{loc.at(*path)}: expected a list of expressions")
    return tuple(Expression.parse(text, loc.at(*path, i), names) for i, text in enumerate(raw))


MAX_PRESET_PROBLEMS = 10_000  # a tune of more is a typo, and listing them would hang every command


def _parse_preset(name: str, body: Any, loc: _Locator, kind: str = "fwd") -> Preset:
    where = loc.at("presets", name)
    if not isinstance(body, dict) or not isinstance(body.get("problems"), list) or not body["problems"]:
        raise SearchSpaceError(f"{where}: expected 'problems', a non-empty list of problem entries")
    problems: list[Problem] = []
    seen: set[Problem] = set()
    for i, entry in enumerate(body["problems"]):
        entry_where = loc.at("presets", name, "problems", i)
        if not isinstance(entry, dict):
            raise SearchSpaceError(f"{entry_where}: expected a mapping")
        unknown = set(entry) - _PRESET_KEYS
        if unknown:
            raise SearchSpaceError(f"{entry_where}: unknown key {sorted(unknown)[0]!r}; known: {sorted(_PRESET_KEYS)}")
        size = 1
        for value in entry.values():
            size *= len(value) if isinstance(value, list) else 1
        if size + len(problems) > MAX_PRESET_PROBLEMS:
            raise SearchSpaceError(f"{entry_where}: the preset expands to more than {MAX_PRESET_PROBLEMS} problems")
        for combo in _expand(entry):
            try:
                problem = _problem_from_entry(combo, kind)
            except (InputError, TypeError, KeyError, ValueError, ZeroDivisionError) as exc:
                raise SearchSpaceError(f"{entry_where}: {exc}") from None
            if problem not in seen:
                seen.add(problem)
                problems.append(problem)
    return Preset(name, str(body.get("description", "")), tuple(problems))


def _expand(entry: dict) -> Iterator[dict]:
    keys = list(entry)
    lists = [entry[k] if isinstance(entry[k], list) else [entry[k]] for k in keys]
    for values in itertools.product(*lists):
        yield dict(zip(keys, values))


def _problem_from_entry(e: dict, kind: str = "fwd") -> Problem:
    head_dim = e["head_dim"]
    heads = e["hidden"] // head_dim if "hidden" in e else e.get("heads")
    seqlen = e["seqlen"]
    batch = e["tokens"] // seqlen if "tokens" in e else e.get("batch", 1)
    if heads is None:
        raise KeyError("give 'heads' or 'hidden'")
    if "hidden" in e and e["hidden"] % head_dim:
        raise ValueError(f"hidden {e['hidden']} is not a multiple of head_dim {head_dim}")
    if "tokens" in e and e["tokens"] % seqlen:
        raise ValueError(f"tokens {e['tokens']} is not a multiple of seqlen {seqlen}")
    return Problem(batch=batch, heads_q=heads, heads_kv=e.get("kv_heads", heads), seqlen_q=seqlen,
                   seqlen_k=e.get("seqlen_k", seqlen), head_dim=head_dim, dtype=e.get("dtype", "float16"),
                   causal=bool(e.get("causal", False)),
                   causal_align=e.get("causal_align", "bottom_right" if kind == "decode" else "top_left"),
                   kind=kind, page_size=e.get("page_size", 0))

"""The architecture as CI checks it: the package's import graph has no circles, SQLAlchemy is
imported only under store/, the runtime reads the database only through the store, and the
public package imports cheaply."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "fa_autotune"


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _imports(name: str, path: Path, top_level_only: bool) -> set[str]:
    """Project modules (and third-party roots) that module ``name`` imports."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.If) and top_level_only:  # TYPE_CHECKING blocks do not run
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def _graph(top_level_only: bool) -> dict[str, set[str]]:
    """Module -> project modules it imports; its own ancestor packages do not count (Python
    imports them before any module inside, whatever the module says)."""
    modules = _modules()
    return {name: {m for m in _imports(name, path, top_level_only)
                   if m in modules and m != name and not name.startswith(m + ".")}
            for name, path in modules.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_circles_between_modules():
    assert _cycle(_graph(top_level_only=True)) is None


def test_no_import_circles_between_stages():
    """Packages (pipeline stages) depend on each other in one direction; a function-level
    import counts too."""
    stage = lambda m: ".".join(m.split(".")[:2])  # noqa: E731
    graph: dict[str, set[str]] = {}
    for name, targets in _graph(top_level_only=False).items():
        graph.setdefault(stage(name), set()).update(stage(t) for t in targets if stage(t) != stage(name))
    for targets in list(graph.values()):
        for t in targets:
            graph.setdefault(t, set())
    # processes.py is the one sanctioned upward import: a child process picks Triton's mode first.
    graph["fa_autotune.processes"] = set()
    assert _cycle(graph) is None


def test_sqlalchemy_only_under_store():
    for name, path in _modules().items():
        third_party = {m.split(".")[0] for m in _imports(name, path, top_level_only=False)}
        if "sqlalchemy" in third_party:
            assert name.startswith("fa_autotune.store"), f"{name} imports SQLAlchemy"


def test_runtime_reads_tuned_results_only_through_store_tuned_or_files():
    for name, path in _modules().items():
        if name.startswith("fa_autotune.runtime"):
            store = {m for m in _imports(name, path, top_level_only=False) if m.startswith("fa_autotune.store")}
            assert store <= {"fa_autotune.store", "fa_autotune.store.connect", "fa_autotune.store.tuned",
                             "fa_autotune.store.tuned.tuned_for", "fa_autotune.store.tuned.tuned_by_gpu",
                             "fa_autotune.store.tuned.import_tuned", "fa_autotune.store.Database",
                                 "fa_autotune.store.safe_url", "fa_autotune.store.scrub"}, (name, store)


def test_import_is_cheap():
    code = ("import sys, fa_autotune, fa_autotune.cli; "
            "print(sorted(m for m in ('torch', 'triton', 'sqlalchemy', 'optuna', 'jinja2') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"

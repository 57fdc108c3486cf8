"""The architecture as CI checks it: the package's import graph has no circles, SQLAlchemy is
imported only under store/, the runtime reads the database only through the store, and the
public package imports cheaply."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "fa_autotune"


def _modules(package: Path = PACKAGE) -> dict[str, Path]:
    out = {}
    for path in package.rglob("*.py"):
        parts = path.relative_to(package.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _is_type_checking(node: ast.AST) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _nodes(tree: ast.AST, runtime_only: bool) -> list[ast.AST]:
    """Every node of ``tree``; with ``runtime_only``, less the bodies of ``if TYPE_CHECKING:``
    (imports for annotations, which never run)."""
    out, todo = [], [tree]
    while todo:
        node = todo.pop()
        out.append(node)
        if runtime_only and _is_type_checking(node):
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))
    return out


def _imports(name: str, path: Path, runtime_only: bool = False) -> set[str]:
    """Project modules (and third-party roots) that module ``name`` imports, at the top or in
    a function; ``runtime_only``: only the imports that can run."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in _nodes(tree, runtime_only):
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


def _graph(package: Path = PACKAGE, runtime_only: bool = True) -> dict[str, set[str]]:
    """Module -> project modules it imports when it runs (at the top or in a function: a
    deferred import is still a dependency); its own ancestor packages do not count (Python
    imports them before any module inside, whatever the module says)."""
    modules = _modules(package)
    return {name: {m for m in _imports(name, path, runtime_only)
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
    """No circle at all, a function-level import included: a child process's work, imported
    only after Triton's mode is chosen, is named to it as a string (fa_autotune.processes)."""
    assert _cycle(_graph()) is None


def test_a_circle_through_a_function_level_import_is_caught(tmp_path):
    """The check itself: a deferred import closing a circle is found, one under
    ``if TYPE_CHECKING:`` is not (it never runs)."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from . import b\n")
    (package / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a\n")
    assert _cycle(_graph(package)) is None
    (package / "b.py").write_text("def f():\n    from .a import g\n")
    assert _cycle(_graph(package)) == ["pkg.a", "pkg.b", "pkg.a"]


def test_no_import_circles_between_stages():
    """Packages (pipeline stages) depend on each other in one direction; a function-level
    import counts too, and so does one for annotations only."""
    stage = lambda m: ".".join(m.split(".")[:2])  # noqa: E731
    graph: dict[str, set[str]] = {}
    for name, targets in _graph(runtime_only=False).items():
        graph.setdefault(stage(name), set()).update(stage(t) for t in targets if stage(t) != stage(name))
    for targets in list(graph.values()):
        for t in targets:
            graph.setdefault(t, set())
    assert _cycle(graph) is None


def test_sqlalchemy_only_under_store():
    for name, path in _modules().items():
        third_party = {m.split(".")[0] for m in _imports(name, path)}
        if "sqlalchemy" in third_party:
            assert name.startswith("fa_autotune.store"), f"{name} imports SQLAlchemy"


def test_runtime_reads_tuned_results_only_through_store_tuned_or_files():
    for name, path in _modules().items():
        if name.startswith("fa_autotune.runtime"):
            store = {m for m in _imports(name, path) if m.startswith("fa_autotune.store")}
            assert store <= {"fa_autotune.store", "fa_autotune.store.connect", "fa_autotune.store.tuned",
                             "fa_autotune.store.tuned.tuned_for", "fa_autotune.store.tuned.tuned_by_gpu",
                             "fa_autotune.store.tuned.import_tuned", "fa_autotune.store.Database",
                                 "fa_autotune.store.safe_url", "fa_autotune.store.scrub"}, (name, store)


def test_import_is_cheap():
    code = ("import sys, fa_autotune, fa_autotune.cli; "
            "print(sorted(m for m in ('torch', 'triton', 'sqlalchemy', 'optuna', 'jinja2') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"

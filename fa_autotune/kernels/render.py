"""Render templates into Triton modules, cache them on disk, import them.

Rendering is a pure function of a validated :class:`KernelConfig` and the template files:
the same config gives the same bytes and the same hash. Modules land in the kernel cache
write-if-different (atomic rename), so concurrent tuners never see a half-written file,
and once a module exists no Jinja is needed to run it. A rendered module holds kernels and
their constants only (:class:`KernelModule`); launching them is the plans' job (:mod:`.launch`, and one module per family: :mod:`.fwd`, :mod:`.decode`, :mod:`.bwd`, :mod:`.varlen`).
"""
from __future__ import annotations

import atexit
import hashlib
import linecache
import types
import os
import shutil
import sys
import tempfile
import threading
import warnings
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

from ..errors import TemplateError
from ..paths import data_dir, kernel_cache_dir
from ..spec.config import KernelConfig

TEMPLATES = {
    "q_outer": "attn_fwd_q_outer.py.jinja",
    "kv_outer": "attn_fwd_kv_outer.py.jinja",
    "split_kv": "attn_fwd_split_kv.py.jinja",
    "decode": "attn_decode.py.jinja",  # KV-cache attention (attention_with_kvcache)
    "backward": "attn_bwd.py.jinja",  # dQ, dK, dV (attention()'s autograd)
}
# language="gluon": FlashAttention-3's schedule (Hopper); the backward's dK/dV pass
GLUON_TEMPLATES = {"q_outer": "attn_fwd_gluon.py.jinja", "backward": "attn_bwd_gluon.py.jinja"}


class KernelModule(Protocol):
    """What every rendered module provides, and all a caller may use.

    ``KERNELS`` maps a role to a ``@triton.jit`` function: ``"main"`` always, ``"combine"``
    for split-KV. A kernel's parameters come in three groups, in this order: the tensors of
    each call (their order fixed per loop order and role, see the plans), scalars the
    plan supplies by name (strides, lengths, scales), then ``tl.constexpr`` flags by name.
    A kernel declares only what it uses.
    """

    CONFIG: dict[str, Any]  # the config's template parameters (KernelConfig.to_dict())
    KERNELS: dict[str, Any]


@dataclass(frozen=True)
class RenderedKernel:
    """Source text of one variant and its identity."""

    config: KernelConfig
    source: str
    sha256: str

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def module_name(self) -> str:
        return f"{self.config.name}_{self.sha256[:12]}"


def _py_literal(value: Any) -> str:
    """Python literal for validated config values; refuses anything else."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_py_literal(k)}: {_py_literal(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (bool, int, str)) or value is None:
        return repr(value)
    raise TemplateError(f"refusing to render a {type(value).__name__} into kernel source")


@lru_cache(maxsize=1)
def _environment():
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(data_dir("templates"))),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["py"] = _py_literal
    return env


def render(config: KernelConfig) -> RenderedKernel:
    """Render the module for ``config``'s kernel (one module for every FP8 recipe it runs
    with: the recipe is no template parameter); deterministic."""
    if not isinstance(config, KernelConfig):
        raise TypeError("render() takes a KernelConfig; build one with KernelConfig.from_mapping")
    try:
        if config.language == "gluon":
            template = GLUON_TEMPLATES[config.loop_order]
        else:
            template = TEMPLATES[config.loop_order]
        source = _environment().get_template(template).render(cfg=config)
    except Exception as exc:  # jinja errors carry the template line; keep it in the message
        raise TemplateError(f"rendering {config.name} failed: {exc}") from exc
    source = tidy(source)
    return RenderedKernel(config, source, hashlib.sha256(source.encode()).hexdigest())


def tidy(source: str) -> str:
    """Normalise blank lines PEP 8 style, so templates can be written for readability
    without fighting Jinja's whitespace rules: none inside code blocks, one before nested
    definitions and after the imports, two around top-level definitions; docstrings are
    left untouched."""
    out: list[str] = []
    in_doc = False
    for line in (raw.rstrip() for raw in source.splitlines()):
        if in_doc:
            out.append(line)
        elif line:
            gap = _blank_lines_before(line, out)
            out.extend([""] * gap)
            out.append(line)
        in_doc ^= line.count('"""') % 2 == 1
    return "\n".join(out) + "\n"


def _blank_lines_before(line: str, previous: list[str]) -> int:
    last = next((p for p in reversed(previous) if p), None)
    nested_def = line.startswith("    ") and line.lstrip().startswith(("def ", "@"))
    if nested_def and last is not None and last[0].isspace() and not last.lstrip().startswith(("@", "class ")):
        return 1  # methods and nested functions: one blank line
    if last is None or line[0].isspace() or line[0] in ")]}":
        return 0
    if last.startswith("@"):
        return 0
    if line.startswith(("@", "def ", "class ")) or last[0].isspace():
        return 2
    if last.startswith(("import ", "from ")) != line.startswith(("import ", "from ")):
        return 1
    return 1 if last.endswith('"""') else 0


def write_module(rendered: RenderedKernel, directory: Path | None = None) -> Path:
    """Write the module into the kernel cache unless identical bytes are already there. A
    cache directory that cannot be written (read-only, a file, /proc) is replaced by a
    private temporary one for this process, with one warning naming it."""
    if directory is not None:
        return _write(rendered, Path(directory))
    try:
        return _write(rendered, kernel_cache_dir())
    except OSError as exc:
        return _write(rendered, _fallback_cache(kernel_cache_dir(), exc))


def _write(rendered: RenderedKernel, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{rendered.module_name}.py"
    data = rendered.source.encode()
    if path.is_file() and path.read_bytes() == data:
        return path
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".py")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


_FALLBACK: list[Path] = []


def _fallback_cache(wanted: Path, exc: OSError) -> Path:
    with _LOCK_FALLBACK:
        if not _FALLBACK:
            _FALLBACK.append(Path(tempfile.mkdtemp(prefix="fa_autotune-kernels-")))
            atexit.register(shutil.rmtree, _FALLBACK[0], ignore_errors=True)
            warnings.warn(f"kernel cache {wanted} is not writable ({exc.strerror or exc}); rendered kernels go to "
                          f"{_FALLBACK[0]} for this process (set FA_AUTOTUNE_CACHE to a writable directory)",
                          RuntimeWarning, stacklevel=4)
        return _FALLBACK[0]


_LOCK_FALLBACK = threading.Lock()
_LOCK = threading.Lock()
_MODULES: dict[str, KernelModule] = {}


def load_module(config: KernelConfig) -> KernelModule:
    """Import the module of ``config`` (rendering it on first use), once per process."""
    key = config.key
    module = _MODULES.get(key)
    if module is not None:
        return module
    with _LOCK:
        module = _MODULES.get(key)
        if module is None:
            module = _import(render(config))
            _MODULES[key] = module
    return module


def _import(rendered: RenderedKernel) -> KernelModule:
    """Execute the rendered source itself (never a ``__pycache__`` file beside it, which
    nothing verifies), under the path Triton reads the kernels' source from."""
    path = write_module(rendered)
    name = f"fa_autotune_kernels.{rendered.module_name}"
    module = types.ModuleType(name)
    module.__file__ = str(path)
    # Triton's JIT reads each kernel's source through linecache: serve it the verified text,
    # not whatever the file on disk holds by then.
    linecache.cache[str(path)] = (len(rendered.source), None, rendered.source.splitlines(True), str(path))
    sys.modules[name] = module
    try:
        exec(compile(rendered.source, str(path), "exec", dont_inherit=True), module.__dict__)
    except Exception as exc:
        sys.modules.pop(name, None)
        raise TemplateError(f"rendered kernel {path} failed to import: {exc}") from exc
    kernels = getattr(module, "KERNELS", None)
    if getattr(module, "CONFIG", None) != rendered.config.to_dict() or not isinstance(kernels, dict) \
            or "main" not in kernels:
        sys.modules.pop(name, None)
        raise TemplateError(f"rendered kernel {path} lacks the KernelModule interface (CONFIG, KERNELS['main'])")
    return module

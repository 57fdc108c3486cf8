from __future__ import annotations

import ast
import inspect
import os
import re
import subprocess
import sys

from pathlib import Path

import pytest

from fa_autotune import paths
from fa_autotune.kernels import render
from fa_autotune.spec.config import KernelConfig
from fa_autotune.errors import TemplateError

SAMPLE = [
    KernelConfig(),
    KernelConfig(loop_order="kv_outer", q_tiles=4, access="block_ptr", causal_mode="masked"),
    KernelConfig(loop_order="split_kv", num_splits=8, access="tensor_desc"),
    KernelConfig(access="tensor_desc", warp_specialize=True, BLOCK_N=128, num_stages=2),
]


@pytest.mark.parametrize("config", SAMPLE, ids=lambda c: c.name)
def test_render_is_deterministic_valid_python(config):
    first, second = render.render(config), render.render(config)
    assert first.source == second.source and first.sha256 == second.sha256
    tree = ast.parse(first.source)
    defined = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    assert config.name in defined
    assert "{{" not in first.source and "{%" not in first.source
    assert first.source.startswith(f'"""{config.name}:')


@pytest.mark.parametrize("config", SAMPLE, ids=lambda c: c.name)
def test_rendered_modules_hold_kernels_and_constants_only(config):
    """Host code lives once in the plans of kernels/: a rendered module imports Triton alone,
    defines only @triton.jit functions, and ends with its KernelModule interface."""
    tree = ast.parse(render.render(config).source)
    imports = {alias.name for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))
               for alias in node.names}
    assert imports == {"triton", "triton.language"}
    functions = [node for node in tree.body if isinstance(node, ast.FunctionDef)]
    assert functions and all(any(ast.unparse(d) == "triton.jit" for d in f.decorator_list) for f in functions)
    assert not [node for node in tree.body if isinstance(node, ast.ClassDef)]
    assigned = {t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets}
    assert {"CONFIG", "KERNELS"} <= assigned


def test_render_is_identical_in_another_process():
    code = "from fa_autotune.kernels.render import render; from fa_autotune import KernelConfig; print(render(KernelConfig()).sha256)"
    env = dict(os.environ, PYTHONHASHSEED="123")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert result.stdout.strip() == render.render(KernelConfig()).sha256


def test_different_configs_render_differently():
    hashes = {render.render(c).sha256 for c in SAMPLE}
    assert len(hashes) == len(SAMPLE)


def test_write_if_different(kernel_cache):
    rendered = render.render(KernelConfig())
    path = render.write_module(rendered)
    assert path.parent == kernel_cache and path.read_text() == rendered.source
    os.utime(path, (1, 1))
    assert render.write_module(rendered) == path
    assert path.stat().st_mtime == 1  # identical bytes: untouched
    path.write_text("corrupted")
    render.write_module(rendered)
    assert path.read_text() == rendered.source  # different bytes: replaced
    assert not list(kernel_cache.glob(".tmp-*"))


def test_load_module_imports_from_cache(kernel_cache):
    config = KernelConfig(BLOCK_M=16, BLOCK_N=16, num_stages=1)
    module = render.load_module(config)
    assert module.CONFIG == config.to_dict()
    assert module.KERNELS["main"].__name__ == config.name
    assert render.load_module(config) is module


def test_stale_or_tampered_bytecode_is_never_imported(kernel_cache, monkeypatch):
    """The module runs from the verified rendered source: a .pyc beside it (tampered, or
    truncated by a crash) is not read."""
    config = KernelConfig(BLOCK_M=16, BLOCK_N=32, num_stages=1)
    path = render.write_module(render.render(config))
    cache = path.parent / "__pycache__"
    cache.mkdir()
    tag = sys.implementation.cache_tag
    (cache / f"{path.stem}.{tag}.pyc").write_bytes(b"\x00garbage")
    monkeypatch.setattr(render, "_MODULES", {})
    module = render.load_module(config)
    assert module.CONFIG == config.to_dict() and module.__file__ == str(path)


def test_kernels_compile_from_the_verified_source(kernel_cache, monkeypatch):
    """A cache file changed after it was checked does not reach Triton: the JIT reads each
    kernel's source through linecache, which holds the rendered text."""
    config = KernelConfig(BLOCK_M=16, BLOCK_N=16, num_stages=1)
    rendered = render.render(config)
    original = render.write_module

    def tampering(r, directory=None):
        path = original(r, directory)
        path.write_text(r.source.replace("tl.program_id(0)", "tl.program_id(0) + 0  # TAMPERED"))
        return path

    monkeypatch.setattr(render, "write_module", tampering)
    kernel = render._import(rendered).KERNELS["main"]
    source = getattr(kernel, "src", None) or inspect.getsource(kernel.fn)  # JIT, or the interpreter's wrapper
    assert "program_id" in source and "TAMPERED" not in source


@pytest.mark.parametrize("kind", ["file", "readonly"])
def test_unwritable_cache_falls_back_with_one_warning(tmp_path, monkeypatch, kind):
    """FA_AUTOTUNE_CACHE naming a regular file or a read-only directory: kernels go to a
    private temporary directory, with one warning naming the unusable one."""
    bad = tmp_path / "cache"
    if kind == "file":
        bad.write_text("not a directory")
    else:
        bad.mkdir()
        bad.chmod(0o500)
        if os.access(bad, os.W_OK):  # root ignores permissions
            bad = Path("/proc/fa_autotune_cache")
    monkeypatch.setenv("FA_AUTOTUNE_CACHE", str(bad))
    monkeypatch.setattr(render, "_MODULES", {})
    monkeypatch.setattr(render, "_FALLBACK", [])
    with pytest.warns(RuntimeWarning, match="not writable") as caught:
        module = render.load_module(KernelConfig(BLOCK_M=16, BLOCK_N=16, num_stages=1))
        render.load_module(KernelConfig(BLOCK_M=32, BLOCK_N=16, num_stages=1))
    assert len([w for w in caught if "not writable" in str(w.message)]) == 1
    assert not Path(module.__file__).is_relative_to(bad)


def test_refuses_unvalidated_values():
    with pytest.raises(TemplateError):
        render._py_literal({"x": 1.5})
    with pytest.raises(TypeError):
        render.render({"BLOCK_M": 64})


def test_template_hash_is_stable():
    assert paths.template_hash() == paths.template_hash()
    assert len(paths.template_hash()) == 16


def test_template_hash_covers_the_device_code_the_templates_import():
    """A tune reuses measurements of the same template_hash, so the hash must change with any
    kernel code a trial runs: the Gluon functions the templates import from the package (the
    wide backward's consumers live in kernels/gluon_bwd_wide.py) as well as the templates."""
    covered = {p.resolve() for p in paths.template_sources()}
    package = Path(paths.__file__).parent
    imported = set()
    for template in paths.data_dir("templates").glob("*.jinja"):
        for module in re.findall(r"^from fa_autotune\.([\w.]+) import", template.read_text(), re.M):
            imported.add((package / (module.replace(".", "/") + ".py")).resolve())
    assert imported and imported <= covered, sorted(map(str, imported - covered))
    assert all(p.is_file() for p in covered)


def test_template_hash_covers_the_launch_plans():
    """Every kernels/ module that builds launches (flags, grids, descriptors: what a rendered
    kernel computes, e.g. kernels.fwd.wide_steps' 128-key steps) is under template_hash."""
    covered = {p.resolve() for p in paths.template_sources()}
    kernels = Path(paths.__file__).parent / "kernels"
    planners = {p.resolve() for p in kernels.glob("*.py") if "Launch(" in p.read_text()}
    assert {"fwd.py", "bwd.py", "varlen.py", "decode.py"} <= {p.name for p in planners}
    assert planners <= covered, sorted(p.name for p in planners - covered)


def test_tidy_normalises_blank_lines():
    messy = 'import a\n\nX = 1\n@dec\n\ndef f():\n\n    """Doc.\n\n    More."""\n\n    return 1\nY = 2\n'
    assert render.tidy(messy) == (
        'import a\n\nX = 1\n\n\n@dec\ndef f():\n    """Doc.\n\n    More."""\n    return 1\n\n\nY = 2\n'
    )


GLUON_SAMPLE = [
    KernelConfig(language="gluon", access="tensor_desc", num_warps=4, BLOCK_M=64, BLOCK_N=128, num_stages=2),
    KernelConfig(language="gluon", access="tensor_desc", num_warps=4, BLOCK_M=64, BLOCK_N=64, num_stages=3,
                 overlap=False, persistent=1, causal_mode="masked"),
    KernelConfig(language="gluon", access="tensor_desc", num_warps=4, BLOCK_M=64, BLOCK_N=128, num_stages=2,
                 pingpong=True, persistent=1),
]


@pytest.mark.parametrize("config", GLUON_SAMPLE, ids=lambda c: c.name)
def test_gluon_modules_hold_gluon_kernels_only(config):
    """The Gluon template renders @gluon.jit functions over Gluon's Hopper API (and the shared
    Gluon helpers of kernels/gluon_parts.py), its glossary
    spelling the schedule, and the same KernelModule interface as the Triton ones."""
    rendered = render.render(config)
    assert rendered.source.startswith(f'"""{config.name}:') and "{{" not in rendered.source
    tree = ast.parse(rendered.source)
    imports = {node.module if isinstance(node, ast.ImportFrom) else alias.name
               for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom)) for alias in node.names}
    assert imports == {"triton.experimental", "triton.experimental.gluon",
                       "triton.experimental.gluon.language.nvidia.hopper",
                       "fa_autotune.kernels.gluon_parts"}  # the helpers the fwd and bwd kernels share
    functions = [node for node in tree.body if isinstance(node, ast.FunctionDef)]
    assert all(any(ast.unparse(d) == "gluon.jit" for d in f.decorator_list) for f in functions)
    assert config.name in {f.name for f in functions}
    assert f"OVERLAP = gl.constexpr({config.overlap})" in rendered.source
    assert f"PINGPONG = gl.constexpr({config.pingpong})" in rendered.source
    assert f"Q_BUFS = gl.constexpr({2 if config.persistent else 1})" in rendered.source
    assigned = {t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets}
    assert {"CONFIG", "KERNELS"} <= assigned
    assert len({render.render(c).sha256 for c in GLUON_SAMPLE}) == len(GLUON_SAMPLE)


@pytest.mark.parametrize("change, constants", [
    ({"pingpong": True}, {"PINGPONG"}), ({"one_loop": True}, {"ONE_LOOP"}), ({"overlap": False}, {"OVERLAP"}),
    ({"rescale_threshold": 8}, {"LAZY_RESCALE", "RESCALE_THRESHOLD"}),
    ({"consumer_regs": 160}, {"P_FP32"}),
], ids=lambda v: ",".join(v) if isinstance(v, dict) else "")
def test_gluon_forward_branches_are_constexpr(change, constants):
    """A Gluon forward knob that only picks a branch changes the rendered module in its
    constants alone (gl.constexpr: the untaken branch is never compiled; the AOT tests
    compile both), besides the name, the glossary and the setmaxnreg list."""
    import difflib

    base = KernelConfig(language="gluon", access="tensor_desc", num_warps=4, BLOCK_M=64, BLOCK_N=128, num_stages=2,
                        persistent=1)
    variant = base.with_(**change)
    one, two = (render.render(c).source.replace(c.name, "NAME") for c in (base, variant))
    body = lambda text: text.split('\nfrom triton', 1)[1].splitlines()  # past the glossary
    changed = [line[1:] for line in difflib.unified_diff(body(one), body(two), lineterm="", n=0)
               if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    names = {line.split(" = ")[0] for line in changed if " = gl.constexpr(" in line}
    rest = [line for line in changed if " = gl.constexpr(" not in line and not line.startswith("CONFIG = ")
            and not line.strip().startswith("[") ]
    assert names == constants and not rest, changed


def test_fp8_recipes_of_one_kernel_share_its_module():
    """The FP8 recipe (scaling, Hadamard) decides how inputs are quantized, not the kernel's
    code: it is no template parameter, so every recipe a kernel runs with shares the one module
    named for the kernel, while the candidates (config and recipe) still spell their recipe."""
    from fa_autotune.spec.candidate import Candidate
    from fa_autotune.spec.recipe import Fp8Recipe

    base = KernelConfig(BLOCK_M=32, BLOCK_N=32, num_warps=4, num_stages=1)
    candidates = [Candidate(base, Fp8Recipe(s, h)) for s in ("per_tensor", "per_head", "per_block")
                  for h in (True, False)]
    assert len({c.name for c in candidates}) == len({c.key for c in candidates}) == len(candidates)
    assert {c.config for c in candidates} == {base} and render.render(base).name == base.name
    with pytest.raises(TypeError, match="takes a KernelConfig"):
        render.render(candidates[0])

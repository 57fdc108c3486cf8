from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest

from fa_autotune import codegen
from fa_autotune.config import KernelConfig
from fa_autotune.errors import TemplateError

SAMPLE = [
    KernelConfig(),
    KernelConfig(loop_order="kv_outer", q_tiles=4, access="block_ptr", causal_mode="masked"),
    KernelConfig(loop_order="split_kv", num_splits=8, access="tensor_desc"),
    KernelConfig(access="tensor_desc", warp_specialize=True, BLOCK_N=128, num_stages=2),
]


@pytest.mark.parametrize("config", SAMPLE, ids=lambda c: c.name)
def test_render_is_deterministic_valid_python(config):
    first, second = codegen.render(config), codegen.render(config)
    assert first.source == second.source and first.sha256 == second.sha256
    tree = ast.parse(first.source)
    defined = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    assert config.name in defined and "launch" in defined
    assert "{{" not in first.source and "{%" not in first.source
    assert first.source.startswith(f'"""{config.name}:')


def test_render_is_identical_in_another_process():
    code = "from fa_autotune import codegen, KernelConfig; print(codegen.render(KernelConfig()).sha256)"
    env = dict(os.environ, PYTHONHASHSEED="123")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert result.stdout.strip() == codegen.render(KernelConfig()).sha256


def test_different_configs_render_differently():
    hashes = {codegen.render(c).sha256 for c in SAMPLE}
    assert len(hashes) == len(SAMPLE)


def test_write_if_different(kernel_cache):
    rendered = codegen.render(KernelConfig())
    path = codegen.write_module(rendered)
    assert path.parent == kernel_cache and path.read_text() == rendered.source
    os.utime(path, (1, 1))
    assert codegen.write_module(rendered) == path
    assert path.stat().st_mtime == 1  # identical bytes: untouched
    path.write_text("corrupted")
    codegen.write_module(rendered)
    assert path.read_text() == rendered.source  # different bytes: replaced
    assert not list(kernel_cache.glob(".tmp-*"))


def test_load_module_imports_from_cache(kernel_cache):
    config = KernelConfig(BLOCK_M=16, BLOCK_N=16, num_stages=1)
    module = codegen.load_module(config)
    assert module.CONFIG == config.to_dict()
    assert codegen.load_module(config) is module


def test_refuses_unvalidated_values():
    with pytest.raises(TemplateError):
        codegen._py_literal({"x": 1.5})
    with pytest.raises(TypeError):
        codegen.render({"BLOCK_M": 64})


def test_template_hash_is_stable():
    assert codegen.template_hash() == codegen.template_hash()
    assert len(codegen.template_hash()) == 16


def test_tidy_normalises_blank_lines():
    messy = 'import a\n\nX = 1\n@dec\n\ndef f():\n\n    """Doc.\n\n    More."""\n\n    return 1\nY = 2\n'
    assert codegen.tidy(messy) == (
        'import a\n\nX = 1\n\n\n@dec\ndef f():\n    """Doc.\n\n    More."""\n    return 1\n\n\nY = 2\n'
    )

"""The family registry (tallow/families/): tensor tables, layer kinds, roles, torch-free planning."""

from __future__ import annotations

import subprocess
import sys

import pytest
from gguf import GGMLQuantizationType as QT

from tiny_models import ARCHITECTURES, MOE_ARCHITECTURES, SSM_ARCHITECTURES, write_tiny_model, write_tiny_ssm
from tallow.errors import ModelFileError
from tallow.families import FAMILIES, SUPPORTED_ARCHITECTURES, family
from tallow.families.tensors import NAMES, OUTPUT, TOKEN_EMBD, TensorTable, tensor_name
from tallow.gguf_file import GGUFFile
from tallow.spec import FULL_ATTENTION, LAYER_KINDS, SHARED_KV, SLIDING_ATTENTION, spec_from_gguf


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("families")
    files = {arch: GGUFFile(write_tiny_model(arch, d / f"{arch}.gguf")) for arch in ARCHITECTURES + MOE_ARCHITECTURES}
    return files | {arch: GGUFFile(write_tiny_ssm(arch, d / f"{arch}.gguf")) for arch in SSM_ARCHITECTURES}


EVERY_TINY = ARCHITECTURES + MOE_ARCHITECTURES + SSM_ARCHITECTURES


@pytest.mark.parametrize("arch", EVERY_TINY)
def test_every_tensor_of_a_tiny_file_has_a_role_of_its_family(arch, tiny_files):
    gf = tiny_files[arch]
    names = family(gf.architecture).tensors
    for name in gf.tensors:
        found = names.role_of(name)
        assert found is not None, f"{name} is spelled by no role of {gf.architecture}"
        role, index, suffix = found
        assert names.name(role, index, suffix) == name


@pytest.mark.parametrize("arch", EVERY_TINY)
def test_layers_are_of_the_kinds_their_family_declares(arch, tiny_files):
    gf = tiny_files[arch]
    spec = spec_from_gguf(gf)
    kinds = {layer.kind for layer in spec.layers}
    assert kinds <= set(FAMILIES[gf.architecture].layer_kinds) <= set(LAYER_KINDS)
    expected = {"gemma3": {FULL_ATTENTION, SLIDING_ATTENTION}, "gemma4": {FULL_ATTENTION, SLIDING_ATTENTION, SHARED_KV},
                "gemma4-31b": {FULL_ATTENTION, SLIDING_ATTENTION}, "gemma4-moe": {FULL_ATTENTION, SLIDING_ATTENTION},
                "mamba": set(), "mamba2": set()}  # pure state-space: no attention layers (spec.ssm holds them)
    assert kinds == expected.get(arch, {FULL_ATTENTION})


def test_a_family_building_an_undeclared_kind_is_caught(tiny_files, monkeypatch):
    monkeypatch.setattr(FAMILIES["gemma3"], "layer_kinds", (FULL_ATTENTION,))
    with pytest.raises(RuntimeError, match="gemma3 family built layer 0 of kind 'sliding'"):
        spec_from_gguf(tiny_files["gemma3"])


def test_unsupported_architecture_is_one_sentence():
    with pytest.raises(ModelFileError, match=r"^m.gguf: architecture 'rwkv6' is not supported \(supported: "
                                             + ", ".join(SUPPORTED_ARCHITECTURES) + r"\)\.$"):
        family("rwkv6", "m.gguf")


def test_tensor_names():
    assert tensor_name("attn_out", 3) == "blk.3.attn_output.weight"
    assert tensor_name("attn_q", 0, "bias") == "blk.0.attn_q.bias"
    assert tensor_name(TOKEN_EMBD) == "token_embd.weight"
    with pytest.raises(ValueError, match="needs a block index"):
        tensor_name("attn_q")
    with pytest.raises(ValueError, match="takes no block index"):
        tensor_name(OUTPUT, 1)
    table = family("llama").tensors
    with pytest.raises(KeyError):
        table.name("attn_q_norm", 0)  # qwen3/gemma have it, llama does not
    assert table.block(5)("ffn_down") == "blk.5.ffn_down.weight"
    assert table.role_of("blk.12.attn_output.weight") == ("attn_out", 12, "weight")
    assert table.role_of("blk.0.attn_q_norm.weight") is None
    mine = TensorTable("attn_q", extra={"my_mixer": "blk.{i}.my_mixer"})
    assert mine.name("my_mixer", 2) == "blk.2.my_mixer.weight"
    with pytest.raises(ValueError, match="already spelled"):
        TensorTable(extra={"attn_q": "blk.{i}.q"})
    with pytest.raises(ValueError, match="unknown tensor roles"):
        TensorTable("attn_qq")
    assert all(("{i}" in t) == t.startswith("blk.") for t in NAMES.values())


@pytest.mark.parametrize("arch", ["llama", "qwen3"])  # an own output.weight; tied to token_embd
def test_the_output_projection_is_chosen_by_role(arch, tmp_path, monkeypatch):
    from tallow.kernels.cpu.linear import HAS_INT4_OPS
    from tallow.models import build_model

    if not HAS_INT4_OPS:
        pytest.skip("no int4pack ops in this torch")
    monkeypatch.setenv("TALLOW_OUTPUT_INT8G", "1")  # group-32 forms at any width (the tiny K is 64)
    monkeypatch.setenv("TALLOW_CPU_GGML_DOT", "0")  # the torch layers (the C kernel's role rule: test_ggml_dot.py)
    gf = GGUFFile(write_tiny_model(arch, tmp_path / "m.gguf", qtype=QT.Q8_0, n_layers=1))
    model = build_model(gf, spec_from_gguf(gf))
    assert model.output.kind == "int4x2"  # Q8_0's exact group-32 form, only for the output projection
    assert model.layers[0].ffn_down.kind == "int8"


def test_planning_stays_torch_free():
    code = ("import sys, tallow.memory.budget, tallow.spec, tallow.families; "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    subprocess.run([sys.executable, "-c", code], check=True)

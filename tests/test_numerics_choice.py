"""Which arithmetic a model runs in (tallow/numerics_choice.py): llama.cpp's by default where the C
library computes all of it, the torch paths elsewhere, each model its own in one process."""

import ctypes

import pytest
import torch
from gguf import GGMLQuantizationType as QT

import tallow
from tallow.errors import UsageError
from tallow.families import FAMILIES, model_class
from tallow.gguf_file import GGUFFile
from tallow.kernels.cpu import decode_layer, ggml_dot, ggml_ops
from tallow.memory.budget import plan_memory
from tallow.numerics_choice import choose, describe, why_not_ggml
from tallow.numerics_mode import DEFAULT, GGML, ggml_enabled, scope

from model_paths import require_model
from tiny_models import tiny_prompt, write_tiny_model

needs_c = pytest.mark.skipif(not (ggml_dot.usable() and ggml_ops.usable() and decode_layer.usable()),
                             reason="the C library is not built for this CPU")


@needs_c
@pytest.mark.parametrize("name", ["smollm2-135m", "gemma3-270m", "qwen2.5-coder-1.5b-instruct"])
def test_the_reference_models_run_llamacpps_arithmetic_by_default(name, monkeypatch):
    gf = GGUFFile(require_model(name))
    monkeypatch.delenv("TALLOW_NUMERICS", raising=False)
    assert choose(gf) == GGML and why_not_ggml(gf) is None
    assert choose(gf, "cuda") == DEFAULT  # (the GPU's half is not built)
    monkeypatch.setenv("TALLOW_NUMERICS", "default")
    assert choose(gf) == DEFAULT
    monkeypatch.setenv("TALLOW_NUMERICS", "auto")
    assert choose(gf) == GGML
    gf.close()


@needs_c
def test_what_keeps_a_model_on_the_torch_paths(tmp_path, monkeypatch):
    monkeypatch.delenv("TALLOW_NUMERICS", raising=False)
    f32 = GGUFFile(write_tiny_model("llama", tmp_path / "f32.gguf"))
    assert choose(f32) == DEFAULT and "F32 weights" in why_not_ggml(f32)
    f16 = GGUFFile(write_tiny_model("llama", tmp_path / "f16.gguf", qtype=QT.F16))
    assert choose(f16) == DEFAULT and "F16 weights" in why_not_ggml(f16)
    q51 = GGUFFile(write_tiny_model("llama", tmp_path / "q51.gguf", qtype=QT.Q5_1))  # in C since session 26
    assert choose(q51) == GGML
    q40 = GGUFFile(write_tiny_model("llama", tmp_path / "q40.gguf", qtype=QT.Q4_0))  # in C, its prompts slower
    assert choose(q40) == DEFAULT and "Q4_0 weights" in why_not_ggml(q40)
    assert describe(q40).startswith("tallow's torch paths (not llama.cpp's: Q4_0 weights")  # tallow inspect's line
    gemma4 = GGUFFile(write_tiny_model("gemma4", tmp_path / "g4.gguf", qtype=QT.Q8_0))
    assert choose(gemma4) == DEFAULT and "gemma4" in why_not_ggml(gemma4)
    q80 = GGUFFile(write_tiny_model("llama", tmp_path / "q80.gguf", qtype=QT.Q8_0))
    assert choose(q80) == GGML
    assert choose(q80, linear_mode="reference") == DEFAULT
    monkeypatch.setenv("TALLOW_CPU_GGML_DOT", "0")
    assert choose(q80) == DEFAULT and "C library" in why_not_ggml(q80)
    monkeypatch.setenv("TALLOW_NUMERICS", "ggml")
    assert choose(f32) == GGML  # forced, whatever it costs
    monkeypatch.setenv("TALLOW_NUMERICS", "gmml")
    with pytest.raises(UsageError, match="TALLOW_NUMERICS='gmml' is not one of ggml, default or auto"):
        choose(q80)


def test_the_families_flag_is_the_c_steps_own_test():
    """Family.ggml_step (torch-free, read before loading) names exactly the families whose blocks
    decode_layer.DecodeLayers.for_model computes in ggml's arithmetic (by their model classes)."""
    from tallow.models.gemma3 import Gemma3Model
    from tallow.models.llama import LlamaModel

    for arch, family in FAMILIES.items():
        cls = model_class(arch)
        computed = (cls.block is LlamaModel.block and cls.mlp is LlamaModel.mlp) or cls.block is Gemma3Model.block
        assert family.ggml_step == computed, arch


def _mapped(tensor: torch.Tensor, gf: GGUFFile) -> bool:
    m = gf.private_map()
    start = ctypes.addressof(ctypes.c_char.from_buffer(m))
    return start <= tensor.data_ptr() and tensor.data_ptr() + tensor.numel() <= start + len(m)


@needs_c
def test_each_model_keeps_its_own_arithmetic_in_one_process(tmp_path, monkeypatch):
    """A llama.cpp-numerics model and a torch-numerics one of the same file, loaded and run in
    turns: each gives its own logits every time (the choice is scoped to the model's own load and
    passes), they differ, and nothing outside a model's pass sees ggml's arithmetic."""
    monkeypatch.delenv("TALLOW_NUMERICS", raising=False)
    path = write_tiny_model("llama", tmp_path / "q80.gguf", qtype=QT.Q8_0)
    exact = tallow.LLM(path, ctx=64)
    monkeypatch.setenv("TALLOW_NUMERICS", "default")
    torch_path = tallow.LLM(path, ctx=64)
    monkeypatch.delenv("TALLOW_NUMERICS")
    assert (exact.model.numerics, torch_path.model.numerics) == (GGML, DEFAULT)
    prompt = tiny_prompt(12)

    def logits(llm):
        llm.engine.kv.truncate(0)
        return llm.model.forward(prompt, 0, llm.engine.kv, all_logits=True)

    first = logits(exact)
    other = logits(torch_path)
    assert torch.equal(logits(exact), first) and torch.equal(logits(torch_path), other)
    assert not torch.equal(first, other)
    assert not ggml_enabled()
    with scope(GGML):
        assert ggml_enabled()
    # The C kernel's weights are the file's bytes through its private map: no copy at load.
    c_layers = [t for t in exact.model.layers[0].tensors.values() if getattr(t, "kind", None) == "ggml_dot"]
    blocks = [x for t in c_layers for x in t._tensors() if x.dtype == torch.uint8]
    assert blocks and all(_mapped(x, exact.gguf) for x in blocks)


@needs_c
@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_the_plan_counts_llamacpps_numerics_as_loaded(arch, tmp_path, monkeypatch):
    """Under llama.cpp's numerics no torch copy of a weight is made: the plan says the file's bytes."""
    monkeypatch.delenv("TALLOW_NUMERICS", raising=False)
    path = write_tiny_model(arch, tmp_path / f"{arch}.gguf", qtype=QT.Q8_0)
    llm = tallow.LLM(path, ctx=64)
    assert llm.model.numerics == GGML
    plan = plan_memory(path, 64)
    assert abs(plan.weights - llm.model.nbytes) <= 0.02 * llm.model.nbytes
    assert llm.memory.weights == plan.weights
    monkeypatch.setenv("TALLOW_NUMERICS", "default")
    assert plan_memory(path, 64).weights > plan.weights  # the torch layers beside the C kernel's bytes


@needs_c
def test_weights_copied_into_memory_on_request_give_the_same_logits(tmp_path, monkeypatch):
    """TALLOW_CPU_MAP_WEIGHTS=0: the C kernel's weights are a copy in memory, not the file's map; same bits."""
    monkeypatch.delenv("TALLOW_NUMERICS", raising=False)
    path = write_tiny_model("qwen2", tmp_path / "q80.gguf", qtype=QT.Q8_0)
    got = []
    for mapped in ("1", "0"):
        monkeypatch.setenv("TALLOW_CPU_MAP_WEIGHTS", mapped)
        llm = tallow.LLM(path, ctx=64)
        layer = llm.model.layers[0].attn_output
        assert layer.kind == "ggml_dot" and _mapped(layer.weight, llm.gguf) == (mapped == "1")
        llm.engine.reset()
        got.append(llm.model.forward(tiny_prompt(12), 0, llm.engine.kv, all_logits=True))
    assert torch.equal(*got)

"""scripts/make_moe_twin.py: a scaled-down Qwen3-30B-A3B twin is a valid qwen3moe file tallow
reads, its header-only form has the same header and tensor index (the data a sparse hole), and
the full-size tables' byte counts are the files' (checked against the header-only writes)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tallow.gguf_file import GGUFFile
from tallow.memory.budget import plan_memory
from tallow.spec import spec_from_gguf

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "make_moe_twin.py"


def _make(tmp_path, name, *args):
    out = tmp_path / f"{name}{'-'.join(args).replace('--', '')}.gguf"
    subprocess.run([sys.executable, str(SCRIPT), name, str(out), *args], check=True, capture_output=True)
    return out


def test_scaled_qwen3_twin_is_a_qwen3moe_file_and_its_header_only_twin_matches(tmp_path):
    small = ("--layers", "2", "--experts", "8", "--vocab-size", "512")
    full, hdr = _make(tmp_path, "qwen3-30b-a3b", *small), _make(tmp_path, "qwen3-30b-a3b", *small, "--header-only")
    a, b = GGUFFile(full), GGUFFile(hdr)
    assert [(t.name, t.shape, t.qtype) for t in a.tensors.values()] == [(t.name, t.shape, t.qtype) for t in b.tensors.values()]
    assert full.stat().st_size == hdr.stat().st_size
    spec = spec_from_gguf(a)
    assert (spec.architecture, spec.n_layers, spec.n_experts, spec.n_experts_used, spec.expert_ffn_dim, spec.dim) == (
        "qwen3moe", 2, 8, 8, 768, 2048)
    gate = a.tensors["blk.1.ffn_gate_exps.weight"]
    assert gate.shape == (2048, 768, 8) and gate.qtype.name == "Q4_K"
    assert [a.tensors[f"blk.{i}.ffn_down_exps.weight"].qtype.name for i in (0, 1)] == ["Q4_K", "Q6_K"]  # use_more_bits(i, 2)
    plan = plan_memory(a, 1024, None)
    assert plan.weights > sum(t.n_bytes for t in a.tensors.values()) // 2

"""The GPU path of the state-space and hybrid models (mamba, mamba2, falcon-h1), run on the CPU:
the mixer through the Triton kernels (kernels/triton/ssm.py, under TRITON_INTERPRET=1) and the
forward passes shaped as the CUDA graphs build them (engine/graphs.py: a device start, a padded
prefill chunk whose real length reaches the kernels as a device tensor, one-token decode steps),
against the CPU's eager torch path and llama.cpp's logits (tests/fixtures/tiny_<arch>.json).
The graphs themselves, on a GPU: scripts/gpu_ssmgpu.sh."""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np
import pytest
import torch

from tiny_models import SSM_ARCHITECTURES, write_tiny_ssm

from tallow.gguf_file import GGUFFile
from tallow.kernels.ssm_ops import TorchMixerOps, TritonMixerOps, mixer_ops
from tallow.memory.recurrent import make_memory
from tallow.models import build_model
from tallow.models.step import ALL, DECODE, PREFILL, Step
from tallow.spec import spec_from_gguf

pytest.importorskip("triton")
import tallow.kernels.triton  # noqa: E402,F401  (the interpreter shim)

FIXTURES = Path(__file__).parent / "fixtures"
TOLERANCE = 1e-4  # as tests/test_ssm.py against llama.cpp; the Triton mixer differs from torch's by ~1e-6
# The interpreter runs a launch's programs one by one: 32 state rows per scan program (a
# quarter of the programs the GPU's choice makes here; tests/kernel_cases.py covers that choice).
TRITON = dict(scan_rows=32)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ssm_gpu")
    return {arch: write_tiny_ssm(arch, folder / f"tiny-{arch}.gguf") for arch in SSM_ARCHITECTURES}


def _model(path, ops=None):
    gf = GGUFFile(path)
    spec = spec_from_gguf(gf)
    model = build_model(gf, spec)
    if ops is not None:
        model.ssm_ops = ops
    return spec, model


def _ref(arch):
    return json.loads((FIXTURES / f"tiny_{arch}.json").read_text())


def test_the_cpu_keeps_torch_and_the_switch_turns_triton_off(monkeypatch):
    assert isinstance(mixer_ops(torch.device("cpu")), TorchMixerOps)
    assert isinstance(mixer_ops(torch.device("cuda")), TritonMixerOps)
    monkeypatch.setenv("TALLOW_SSM_TRITON", "0")
    assert isinstance(mixer_ops(torch.device("cuda")), TorchMixerOps)


@pytest.mark.parametrize("arch", SSM_ARCHITECTURES)
def test_triton_mixer_matches_llama_cpp(arch, tiny):
    """The 40-token prompt in one pass through the Triton conv and scan: llama.cpp's logits."""
    ref = _ref(arch)
    spec, model = _model(tiny[arch], TritonMixerOps(**TRITON))
    out = model.forward(ref["ids"], 0, make_memory(spec, 64, "f32"), all_logits=True).numpy()
    delta = np.abs(out - np.array(ref["logits"], dtype=np.float32)).max()
    assert delta < TOLERANCE, f"{arch}: max |Δlogit| {delta:.2e}"


def _graph_steps(model, spec, ids, n_prefill, chunk, bucket):
    """Logits of ids run as the GPU engine runs them: the first n_prefill in chunks of `chunk`
    tokens padded to `bucket` rows (PrefillGraphs: a device start, logits=the last real row
    as a device tensor), then the rest one decode step each (GraphDecoder: device position and
    seq_len). Each is bracketed with kv.folding as the graphs' callers do."""
    kv = make_memory(spec, 64, "f32")
    rows = []
    for s in range(0, n_prefill, chunk):
        part = ids[s : min(s + chunk, n_prefill)]
        tokens = torch.tensor(part + [0] * (bucket - len(part)))
        start = torch.tensor([s])
        step = Step(PREFILL, tokens, torch.arange(bucket) + start, start, logits=torch.tensor([len(part) - 1]))
        with kv.folding(s, len(part)):
            rows.append(model.run(step, kv))
        del kv.tokens[s:]
        kv.tokens.extend(part)
    for p in range(n_prefill, len(ids)):
        position = torch.tensor([p])
        step = Step(DECODE, torch.tensor([ids[p]]), position, position, (position + 1).int(), logits=ALL)
        with kv.folding(p, 1):
            rows.append(model.run(step, kv))
        kv.tokens.append(ids[p])
    return rows, kv


# Triton on Mamba-1 and on the hybrid (whose mixer is Mamba-2's; mamba2's groups: the llama.cpp
# test above and the kernel cases), for time; the torch ops on all three.
@pytest.mark.parametrize("arch, ops", [("mamba", "triton"), ("falcon-h1", "triton")] + [(a, "torch") for a in SSM_ARCHITECTURES])
def test_graph_shaped_steps_continue_one_state(arch, ops, tiny):
    """Padded prefill chunks (14 tokens in chunks of 5, each padded to 8 rows: the padding must
    not move any state, and the conv window spans chunks) and decode steps at device positions
    give the eager one-pass logits, with the Triton mixer and with the torch references reading
    n_valid on the device (TALLOW_SSM_TRITON=0). (Falcon-H1 once lost n_valid on its way to the
    mixer: the padding then moved the state, |Δlogit| 0.3 after the first chunk.)"""
    ids, n_prefill = _ref(arch)["ids"][:18], 14
    spec, model = _model(tiny[arch], TritonMixerOps(**TRITON) if ops == "triton" else TorchMixerOps())
    whole = model.forward(ids, 0, make_memory(spec, 64, "f32"), all_logits=True)
    rows, kv = _graph_steps(model, spec, ids, n_prefill, 5, 8)
    last_of_chunks = [min(s + 5, n_prefill) - 1 for s in range(0, n_prefill, 5)]
    got = torch.cat([r[-1:] for r in rows[: len(last_of_chunks)]] + rows[len(last_of_chunks) :])
    want = torch.cat([whole[last_of_chunks], whole[n_prefill:]])
    assert (got - want).abs().max().item() < 1e-4
    assert kv.state.position == len(ids)


def test_speculation_steps_aside_off_the_cpu(tiny):
    """The GPU's verification graphs keep no per-row states to roll back to, so a recurrent memory
    on another device (here `meta`: no allocation) says it cannot roll back; the engine then never
    speculates (engine.py: speculation needs kv.can_rollback)."""
    spec = spec_from_gguf(GGUFFile(tiny["falcon-h1"]))
    assert make_memory(spec, 64, "f16").can_rollback
    assert not make_memory(spec, 64, "f16", device="meta").can_rollback


@pytest.mark.parametrize("n, rows, n_valid", [(1, 64, None), (3, 96, 2)])
def test_the_scan_epilogue_is_the_separate_bias_add_and_quantization(n, rows, n_valid):
    """Mamba-1's decode scan with the dt projection's bias and y's Q8_1 inside it
    (TALLOW_SSM_SCAN_EPILOGUE): y and the state bit for bit the scan after a separate bias add,
    and the Q8_1 blocks those of mmvq.quantize_q8_1 over that y, every field written."""
    from tallow.kernels.triton.mmvq import quantize_q8_1
    from tallow.kernels.triton.ssm import ssm_scan

    g = torch.Generator().manual_seed(rows + n)
    d_state = 16
    state = torch.randn(rows, 1, d_state, generator=g)
    x, z = torch.randn(n, rows, generator=g), torch.randn(n, rows, generator=g)
    dt, bias = torch.randn(n, rows, generator=g) * 3, torch.randn(rows, generator=g)
    A, D = -torch.rand(rows, d_state, generator=g) * 4, torch.randn(rows, generator=g)
    bc = torch.randn(n, 2 * d_state, generator=g)
    B, C = bc[:, :d_state], bc[:, d_state:]
    nv = torch.tensor([n_valid]) if n_valid is not None else None
    s_ref, s_new = state.clone(), state.clone()
    y_ref = ssm_scan(s_ref, x, dt + bias, A, B, C, nv, D=D, z=z)
    y, xq = ssm_scan(s_new, x, dt, A, B, C, nv, dt_bias=bias, D=D, z=z, q8=True)
    assert torch.equal(y, y_ref) and torch.equal(s_new, s_ref)
    ref = quantize_q8_1(y_ref)
    for field in ("qs", "d", "s", "isum"):
        assert torch.equal(getattr(xq, field), getattr(ref, field)), field


def test_the_scan_epilogue_is_asked_only_of_the_triton_ops():
    ops = TritonMixerOps()
    assert not TorchMixerOps().epilogue(None, None, 1)
    assert not ops.epilogue(None, None, 1)  # not GPULinears: the separate launches


# ---------------------------------------------------------------- the chunked SSD scan (TALLOW_SSD_CHUNKED)

def _mamba2_scan_inputs(n, heads, head_dim, groups, d_state, seed=0):
    g = torch.Generator().manual_seed(seed)
    dt = torch.randn(n, heads, generator=g) * 3
    dt[0, 0], dt[-1, -1] = 25.0, -30.0  # softplus's two far ends
    bc = torch.randn(n, 3 * groups * d_state, generator=g)  # B and C as strided views of one row, as xBC holds them
    return dict(state=torch.randn(heads, head_dim, d_state, generator=g), x=torch.randn(n, heads * head_dim, generator=g),
                dt=dt, A=-torch.rand(heads, generator=g) * 4, B=bc[:, : groups * d_state],
                C=bc[:, groups * d_state : 2 * groups * d_state], dt_bias=torch.randn(heads, generator=g),
                D=torch.randn(heads, generator=g), z=torch.randn(n, heads * head_dim, generator=g))


@pytest.mark.parametrize("n, heads, head_dim, groups, d_state, n_valid, chunk", [
    (40, 3, 4, 1, 12, None, 16),   # three chunks, the last partial; d_state not a power of two
    (70, 4, 8, 2, 16, 50, 16),     # groups; padding rows from 50 on (n_valid a device tensor)
    (37, 2, 40, 1, 24, 5, 32),     # head_dim over two row blocks; a chunk of all padding
    (64, 2, 16, 1, 80, None, 64),  # d_state over two column tiles, one whole chunk
])
def test_the_chunked_ssd_scan_is_the_token_by_token_scan(n, heads, head_dim, groups, d_state, n_valid, chunk):
    """The SSD form re-associates the scan's sums: y (valid rows) and the state it leaves within
    fp32 rounding of the token-by-token Triton scan and of the torch reference (decode continues
    from that state, and prefix checkpoints store it)."""
    from tallow.kernels.triton.ssd import ssd_scan
    from tallow.kernels.triton.ssm import ssm_scan

    a = _mamba2_scan_inputs(n, heads, head_dim, groups, d_state)
    nv = torch.tensor([n_valid]) if n_valid else None
    k = n_valid or n
    s_ssd, s_seq, s_ref = a["state"].clone(), a["state"].clone(), a["state"].clone()
    args = (a["x"], a["dt"], a["A"], a["B"], a["C"])
    y_ssd = ssd_scan(s_ssd, *args, nv, a["dt_bias"], a["D"], a["z"], chunk=chunk, block_p=16, block_n=16 if d_state > 16 else None)
    y_seq = ssm_scan(s_seq, *args, nv, a["dt_bias"], a["D"], a["z"], block_r=32)
    y_ref = TorchMixerOps().scan(s_ref, *args, n_valid, a["dt_bias"], a["D"], a["z"])
    for y in (y_seq, y_ref):
        assert ((y_ssd[:k] - y[:k]).norm() / y[:k].norm()).item() < 1e-5
    for s in (s_seq, s_ref):
        assert ((s_ssd - s).norm() / s.norm()).item() < 1e-5
        assert (s_ssd - s).abs().max().item() < 1e-4 * s.abs().max().item()


def test_the_ssd_switch_picks_the_prefill_scans(monkeypatch):
    """Mamba-2 chunks of SSD_MIN_ROWS rows or more take the SSD form; decode steps, Mamba-1 and
    TALLOW_SSD_CHUNKED=0 the token-by-token scan."""
    import tallow.kernels.triton.ssd as ssd
    import tallow.kernels.triton.ssm as ssm

    calls = []
    monkeypatch.setattr(ssd, "ssd_scan", lambda *a, **k: calls.append("ssd"))
    monkeypatch.setattr(ssm, "ssm_scan", lambda *a, **k: calls.append("seq"))
    ops = TritonMixerOps()
    for n, a_dims in ((ssd.SSD_MIN_ROWS, 1), (ssd.SSD_MIN_ROWS - 1, 1), (1, 1), (ssd.SSD_MIN_ROWS, 2)):
        ops.scan(None, torch.zeros(n, 4), None, torch.zeros((4,) * a_dims), None, None)
    assert calls == ["ssd", "seq", "seq", "seq"]
    monkeypatch.setenv("TALLOW_SSD_CHUNKED", "0")
    ops.scan(None, torch.zeros(64, 4), None, torch.zeros(4), None, None)
    assert calls[-1] == "seq"


def test_padded_ssd_chunks_continue_one_state(tiny, monkeypatch):
    """Falcon-H1 through the graphs' padded prefill with the SSD scan: 36 tokens in chunks of 32
    rows (the second chunk 4 real rows, 28 padding), then decode steps: the eager
    one-pass logits (which run the token-by-token scan with TALLOW_SSD_CHUNKED=0 here)."""
    ids, n_prefill = _ref("falcon-h1")["ids"][:40], 36
    spec, model = _model(tiny["falcon-h1"], TritonMixerOps(**TRITON))
    monkeypatch.setenv("TALLOW_SSD_CHUNKED", "0")
    whole = model.forward(ids, 0, make_memory(spec, 64, "f32"), all_logits=True)
    monkeypatch.delenv("TALLOW_SSD_CHUNKED")
    rows, kv = _graph_steps(model, spec, ids, n_prefill, 32, 32)
    got = torch.cat([rows[0][-1:], rows[1][-1:]] + rows[2:])
    want = torch.cat([whole[[31, 35]], whole[n_prefill:]])
    assert (got - want).abs().max().item() < 1e-4
    assert kv.state.position == len(ids)


def test_the_stacked_in_projection_is_the_separate_products(tiny, monkeypatch):
    """TALLOW_HYBRID_STACK_IN (falcon-h1 on the GPU): the mixer's in-projection and Q/K/V as one
    stacked product whose columns are sliced apart, and the attention branch handed to the mixer
    as the addend of its out-projection, give the separate products' logits (here on the CPU, the
    stacking forced: the slicing and the plumbing; the bits on the device: scripts/gpu_session_16.sh)."""
    from tallow.models.falcon_h1 import FalconH1Model

    for name in ("TALLOW_CPU_C_LAYER", "TALLOW_CPU_C_MIXER"):
        monkeypatch.setenv(name, "0")
    ids = _ref("falcon-h1")["ids"][:12]
    spec, model = _model(tiny["falcon-h1"])
    assert "in_qkv" not in model.layers[0].tensors  # off the GPU: the separate products
    want = model.forward(ids, 0, make_memory(spec, 64, "f32"), all_logits=True)
    monkeypatch.setattr(FalconH1Model, "stacks_in_projection", lambda self: True)
    spec, stacked = _model(tiny["falcon-h1"])
    stacked.__dict__["c_decode"] = None  # the CPU's one-call layer reads the separate products (never stacked there)
    layer = stacked.layers[0].tensors
    assert "in_qkv" in layer and "ssm_in" not in layer and "attn_qkv" not in layer
    kv = make_memory(spec, 64, "f32")
    got = stacked.forward(ids[:8], 0, kv, all_logits=True)
    got = torch.cat([got] + [stacked.forward([t], 8 + i, kv) for i, t in enumerate(ids[8:])])
    assert (got - want).abs().max().item() < 1e-5

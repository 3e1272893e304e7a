"""tallow.quant.reference must be bit-exact with gguf.quants.dequantize, llama.cpp's Python reference.

Random blocks exercise every bit of every field (random bytes), except the fp16 scale fields,
which are set to finite values so that comparisons are not NaN-vs-NaN; real tensors from the
three test models check that our layout reading matches files written by llama.cpp tools.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as QT, quants

from model_paths import model_path, require_model
from tallow.errors import ModelFileError
from tallow.quant import reference
from tallow.quant.reference import SUPPORTED_TYPES, dequantize

# Byte offsets of the fp16 fields (d, dmin/m) inside one block of each type.
FP16_FIELDS: dict[QT, list[int]] = {
    QT.Q4_0: [0], QT.Q4_1: [0, 2], QT.Q5_0: [0], QT.Q5_1: [0, 2], QT.Q8_0: [0],
    QT.Q2_K: [80, 82], QT.Q3_K: [108], QT.Q4_K: [0, 2], QT.Q5_K: [0, 2], QT.Q6_K: [208],
    QT.MXFP4: [], QT.NVFP4: [],  # 8-bit scales: any byte is a scale (tests/test_fp4.py covers all 256)
}
# Found wherever `tallow pull` put them (tests/model_paths.py), not only in /root/models.
MODELS = {
    "smollm2": model_path("smollm2-135m"),
    "gemma3": model_path("gemma3-270m"),
    "qwen2.5": model_path("qwen2.5-coder-1.5b-instruct"),
}
MODEL_NAMES = {"smollm2": "smollm2-135m", "gemma3": "gemma3-270m", "qwen2.5": "qwen2.5-coder-1.5b-instruct"}


def random_rows(qtype: QT, n_rows: int, n_cols: int, seed: int = 0) -> np.ndarray:
    """uint8 (n_rows, row_bytes) of random blocks with finite fp16 scales."""
    rng = np.random.default_rng(seed)
    block, type_size = GGML_QUANT_SIZES[qtype]
    if qtype == QT.F32:
        return rng.standard_normal((n_rows, n_cols), dtype=np.float32).view(np.uint8)
    if qtype == QT.F16:
        return rng.standard_normal((n_rows, n_cols)).astype(np.float16).view(np.uint8)
    if qtype == QT.BF16:
        f = rng.standard_normal((n_rows, n_cols), dtype=np.float32).view(np.uint32)
        return (f >> 16).astype(np.uint16).view(np.uint8)
    raw = rng.integers(0, 256, (n_rows, n_cols // block * type_size), dtype=np.uint8)
    blocks = raw.reshape(-1, type_size)
    for off in FP16_FIELDS[qtype]:
        vals = rng.uniform(-2.0, 2.0, (blocks.shape[0], 1)).astype(np.float16)
        blocks[:, off:off + 2] = vals.view(np.uint8)
    return raw


def gguf_reference(raw: np.ndarray, qtype: QT, n_cols: int) -> np.ndarray:
    return np.asarray(quants.dequantize(raw, qtype), dtype=np.float32).reshape(raw.shape[0], n_cols)


def test_supported_types_cover_the_brief() -> None:
    names = {t.name for t in SUPPORTED_TYPES}
    assert names == {"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
                     "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "MXFP4", "NVFP4"}
    assert set(FP16_FIELDS) | {QT.F32, QT.F16, QT.BF16} == SUPPORTED_TYPES


@pytest.mark.parametrize("qtype", sorted(SUPPORTED_TYPES), ids=lambda t: t.name)
@pytest.mark.parametrize("n_rows,n_blocks", [(1, 1), (3, 4), (17, 2)])
def test_random_blocks_bit_exact(qtype: QT, n_rows: int, n_blocks: int) -> None:
    block = GGML_QUANT_SIZES[qtype][0]
    n_cols = block * n_blocks if block > 1 else 64 * n_blocks
    raw = random_rows(qtype, n_rows, n_cols, seed=n_rows * 100 + n_blocks)
    got = dequantize(raw, qtype, n_cols)
    assert got.dtype == torch.float32 and got.shape == (n_rows, n_cols)
    np.testing.assert_array_equal(got.numpy(), gguf_reference(raw, qtype, n_cols))


@pytest.mark.parametrize("qtype", [QT.Q4_0, QT.Q6_K], ids=lambda t: t.name)
def test_chunked_path_and_torch_input(qtype: QT, monkeypatch: pytest.MonkeyPatch) -> None:
    """Many rows cross the internal chunk boundary; torch uint8 input is accepted too."""
    monkeypatch.setattr(reference, "_CHUNK_ELEMENTS", 1000)  # 1000 // 256 = 3 rows per chunk
    raw = random_rows(qtype, 10, 256, seed=7)
    want = gguf_reference(raw, qtype, 256)
    np.testing.assert_array_equal(dequantize(raw, qtype, 256).numpy(), want)
    np.testing.assert_array_equal(dequantize(torch.from_numpy(raw.copy()), qtype, 256).numpy(), want)


def test_unsupported_type_is_a_model_file_error() -> None:
    with pytest.raises(ModelFileError, match="IQ2_XXS"):
        dequantize(np.zeros((1, 66), np.uint8), QT.IQ2_XXS, 256)


def test_wrong_row_size_is_a_model_file_error() -> None:
    with pytest.raises(ModelFileError, match="Q4_0"):
        dequantize(np.zeros((2, 17), np.uint8), QT.Q4_0, 32)


def _real_tensors_by_type() -> list[tuple[str, str, QT]]:
    from tallow.gguf_file import GGUFFile

    cases = []
    for model, path in MODELS.items():
        if path is None:
            continue
        seen: set[QT] = set()
        with GGUFFile(path) as gf:
            for t in gf.tensors.values():
                if t.qtype not in seen:
                    seen.add(t.qtype)
                    cases.append((model, t.name, t.qtype))
    return cases


REAL_CASES = _real_tensors_by_type()


@pytest.mark.parametrize("model", MODEL_NAMES.values())
def test_real_models_present(model: str) -> None:
    """The parametrized test below has no case for a missing model: this one skips for it,
    or fails under TALLOW_REQUIRE_MODELS=1."""
    require_model(model)


@pytest.mark.skipif(not REAL_CASES, reason="test models not found; run `tallow pull smollm2-135m gemma3-270m qwen2.5-coder-1.5b-instruct`")
@pytest.mark.parametrize("model,name,qtype", REAL_CASES, ids=lambda v: getattr(v, "name", v))
def test_real_tensor_rows_bit_exact(model: str, name: str, qtype: QT) -> None:
    from tallow.gguf_file import GGUFFile

    with GGUFFile(MODELS[model]) as gf:
        t = gf.tensors[name]
        rows = np.unique(np.r_[0, 1, t.n_rows // 2, t.n_rows - 1].clip(0, t.n_rows - 1))  # a few rows only
        raw = np.array(t.data[rows])
        got = dequantize(raw, t.qtype, t.n_cols)
        np.testing.assert_array_equal(got.numpy(), gguf_reference(raw, t.qtype, t.n_cols))

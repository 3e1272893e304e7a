"""The GGUF reader: agrees with gguf.GGUFReader on real files, and bad files fail with one sentence."""

from __future__ import annotations

import subprocess
import os
import sys

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter

from model_paths import model_path, require_model
from tiny_models import write_tiny_model

from tallow.errors import ModelFileError
from tallow.gguf_file import GGUFFile
from tallow.kernels.cpu.linear import make_linear
from tallow.spec import spec_from_gguf


@pytest.mark.parametrize("name", ["smollm2-135m", "gemma3-270m"])
def test_reader_agrees_with_gguf_package(name):
    path = require_model(name)  # skips, or fails under TALLOW_REQUIRE_MODELS=1
    ours = GGUFFile(path)
    ref = GGUFReader(path)
    assert set(ours.metadata) == {k for k in ref.fields if not k.startswith("GGUF.")}
    for key, field in ref.fields.items():
        if key.startswith("GGUF."):
            continue
        value = ours.metadata[key]
        expected = field.contents()
        if isinstance(value, np.ndarray):
            assert np.array_equal(value, np.asarray(expected, dtype=value.dtype)), key
        else:
            assert value == expected, key
    assert [t.name for t in ref.tensors] == list(ours.tensors)
    for t in ref.tensors:
        mine = ours.tensors[t.name]
        assert mine.qtype == t.tensor_type
        assert mine.shape == tuple(int(d) for d in t.shape)
        assert mine.offset == t.data_offset
        assert mine.n_bytes == t.n_bytes
        assert np.array_equal(mine.data.reshape(-1)[:64], np.asarray(t.data).view(np.uint8).reshape(-1)[:64])


def test_wrong_magic(tmp_path):
    p = tmp_path / "bad.gguf"
    p.write_bytes(b"GGML" + b"\0" * 100)
    with pytest.raises(ModelFileError, match="wrong magic"):
        GGUFFile(p)


def test_truncated_header_and_data(tmp_path):
    full = write_tiny_model("llama", tmp_path / "full.gguf")
    data = full.read_bytes()
    (tmp_path / "head.gguf").write_bytes(data[:200])
    with pytest.raises(ModelFileError, match="truncated"):
        GGUFFile(tmp_path / "head.gguf")
    (tmp_path / "tail.gguf").write_bytes(data[:-1000])
    with pytest.raises(ModelFileError, match="truncated"):
        GGUFFile(tmp_path / "tail.gguf")


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(ModelFileError, match="no such file"):
        GGUFFile(tmp_path / "nope.gguf")
    with pytest.raises(ModelFileError, match="directory"):
        GGUFFile(tmp_path)


def test_unknown_architecture(tmp_path):
    p = tmp_path / "arch.gguf"
    w = GGUFWriter(str(p), "rwkv6")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelFileError, match="architecture 'rwkv6' is not supported"):
        spec_from_gguf(GGUFFile(p))


def _write_table(path, table: np.ndarray):
    """A GGUF holding one float32 tensor, token_embd.weight = table; returns its path."""
    w = GGUFWriter(str(path), "llama")
    w.add_tensor("token_embd.weight", table)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _mapped_rss_kib(path) -> int:
    """This process's resident KiB of its mappings of `path` (/proc/self/smaps)."""
    total, inside = 0, False
    for line in open("/proc/self/smaps"):
        head = line.split()
        if "-" in head[0] and len(head) >= 5:
            inside = head[-1] == str(path)
        elif inside and head[0] == "Rss:":
            total += int(head[1])
    return total


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")
def test_embedding_rows_are_read_without_making_the_table_resident(tmp_path):
    """A token's embedding row is read from the file, not through the map: a page fault there would make
    that page and its neighbours resident in this process (memory the plan does not count), so a long
    prompt's scattered rows would make most of the table resident."""
    from tallow.kernels.cpu.linear import Embedding

    table = np.random.default_rng(0).standard_normal((4096, 1024), dtype=np.float32)  # a 4 KiB page a row, 16 MiB
    p = _write_table(tmp_path / "table.gguf", table)
    gf = GGUFFile(p)
    gf.release_pages()
    before = _mapped_rss_kib(p)
    idx = np.random.default_rng(1).permutation(4096)[:512]  # 2 MiB of rows were they read through the map
    got = Embedding(gf.tensors["token_embd.weight"])(torch.from_numpy(idx))
    assert torch.equal(got, torch.from_numpy(table[idx]))
    assert _mapped_rss_kib(p) - before < 256
    gf.close()


def test_unsupported_tensor_type(tmp_path):
    p = tmp_path / "iq.gguf"
    w = GGUFWriter(str(p), "llama")
    # IQ4_NL: a valid GGUF type tallow has no kernel for (block 32, 18 bytes).
    w.add_tensor("blk.0.attn_q.weight", np.zeros((4, 18), np.uint8), raw_dtype=GGMLQuantizationType.IQ4_NL)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    gf = GGUFFile(p)
    with pytest.raises(ModelFileError, match="IQ4_NL"):
        make_linear(gf.tensors["blk.0.attn_q.weight"])


@pytest.mark.parametrize("content", [b"", b"hello", b"GGUF\x03\x00\x00\x00" + b"\xff" * 16])
def test_cli_bad_file_is_one_sentence_exit_2(tmp_path, content):
    p = tmp_path / "bad.gguf"
    p.write_bytes(content)
    r = subprocess.run([sys.executable, "-m", "tallow.cli", "inspect", str(p)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("tallow: error:") and str(p) in lines[0]


def test_rows_read_from_the_file_equal_the_map(tmp_path):
    """FileRows (what the packers read a tensor through) and read_rows give the map's bytes; a file
    cut short under a running process is one clear error."""
    from tallow.gguf_file import FileRows

    table = np.random.default_rng(0).standard_normal((300, 64), dtype=np.float32)
    p = _write_table(tmp_path / "t.gguf", table)
    gf = GGUFFile(p)
    t = gf.tensors["token_embd.weight"]
    rows = t.streamed()
    assert isinstance(rows, FileRows) and rows.shape == t.data.shape
    for r0, r1 in ((0, 300), (17, 130), (299, 400), (5, 5)):
        assert np.array_equal(rows[r0:r1], t.data[r0:r1])
    idx = np.array([299, 0, 7, 7])
    assert np.array_equal(t.read_rows(idx), t.data[idx])
    with pytest.raises(TypeError):
        rows[::2]
    os.truncate(p, t.offset + 10 * t.data.shape[1])
    with pytest.raises(ModelFileError, match="cut short"):
        rows[0:300]
    gf.close()

"""A seeded GGUF fuzzer: a few hundred mutations of real headers (the tiny llama and gemma3
models' metadata and tensor tables, re-serialized) — wrong metadata types, huge array and
string lengths, unknown value and tensor types, overflowing shapes and offsets, duplicate and
overlapping tensors, truncations, zero head counts and alignments, block_count 0 / 2^32-1,
nested arrays. Every case must end in a ModelFileError (the CLI's one sentence and exit 2) or
load cleanly, within seconds, under a memory limit, in a child process (a crash is a failure).
"""

from __future__ import annotations

import json
import random
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tiny_models import write_tiny_model

ROOT = Path(__file__).resolve().parents[1]
N_CASES = 300
SEED = 19

T = {"u8": 0, "i8": 1, "u16": 2, "i16": 3, "u32": 4, "i32": 5, "f32": 6, "bool": 7, "str": 8, "arr": 9, "u64": 10, "i64": 11, "f64": 12}
FMT = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def parse(path: Path):
    """(metadata as [key, type, value], tensors as [name, shape, type, offset], data bytes)."""
    from tallow.gguf_file import GGUFFile

    with GGUFFile(path) as gf:
        raw = Path(path).read_bytes()
        buf, pos = memoryview(raw), 24
        meta = []

        def s():
            nonlocal pos
            (n,) = struct.unpack_from("<Q", buf, pos)
            pos += 8 + n
            return bytes(buf[pos - n : pos]).decode()

        def v(t):
            nonlocal pos
            if t == 8:
                return s()
            if t == 9:
                it, n = struct.unpack_from("<IQ", buf, pos)
                pos += 12
                return (it, [v(it) for _ in range(n)])
            (x,) = struct.unpack_from(FMT[t], buf, pos)
            pos += struct.calcsize(FMT[t])
            return x

        _, _, n_t, n_kv = struct.unpack_from("<4sIQQ", buf, 0)
        for _ in range(n_kv):
            k = s()
            (t,) = struct.unpack_from("<I", buf, pos)
            pos += 4
            meta.append([k, t, v(t)])
        tensors = [[t.name, list(t.shape), int(t.qtype), t.offset - gf.data_start] for t in gf.tensors.values()]
        data = raw[gf.data_start :]
    return meta, tensors, data


def enc_value(t, x) -> bytes:
    if t == 8:
        b = x.encode() if isinstance(x, str) else x
        return struct.pack("<Q", len(b)) + b
    if t == 9:
        it, items = x
        return struct.pack("<IQ", it, len(items)) + b"".join(enc_value(it, i) for i in items)
    return struct.pack(FMT[t], x)


def serialize(meta, tensors, data, alignment=32, n_t=None, n_kv=None) -> bytes:
    out = [struct.pack("<4sIQQ", b"GGUF", 3, len(tensors) if n_t is None else n_t, len(meta) if n_kv is None else n_kv)]
    for k, t, x in meta:
        out.append(enc_value(8, k) + struct.pack("<I", t) + (x if isinstance(x, bytes) and t not in (8,) else enc_value(t, x)))
    for name, shape, qt, off in tensors:
        out.append(enc_value(8, name) + struct.pack("<I", len(shape)) + b"".join(struct.pack("<Q", d % 2**64) for d in shape) + struct.pack("<IQ", qt, off % 2**64))
    head = b"".join(out)
    pad = (-len(head)) % alignment if alignment > 0 and alignment & (alignment - 1) == 0 else 0
    return head + b"\0" * pad + data


HOSTILE_VALUES = [
    (T["u32"], 0), (T["u32"], 2**32 - 1), (T["i32"], -1), (T["u64"], 2**64 - 1), (T["i64"], -2**63),
    (T["f32"], float("nan")), (T["f64"], float("inf")), (T["bool"], True), (T["str"], "x"), (T["str"], ""),
    (T["arr"], (T["str"], ["a", "b"])), (T["arr"], (T["u32"], [])), (T["arr"], (T["arr"], [(T["u8"], [1])])),
    (T["arr"], (T["u32"], [0] * 3)), (T["f32"], 0.0), (T["f32"], -1.0),
]
KEYS = ["block_count", "embedding_length", "attention.head_count", "attention.head_count_kv", "feed_forward_length",
        "context_length", "attention.key_length", "attention.value_length", "rope.freq_base", "rope.dimension_count",
        "attention.layer_norm_rms_epsilon", "attention.sliding_window", "attention.sliding_window_pattern",
        "final_logit_softcapping", "vocab_size"]


def mutate(rng: random.Random, meta, tensors, data, arch: str) -> bytes:
    meta = [list(m) for m in meta]
    tensors = [[n, list(s), q, o] for n, s, q, o in tensors]
    kind = rng.randrange(14)
    alignment = 32
    if kind == 0:  # a known key gets a hostile type or value
        t, x = rng.choice(HOSTILE_VALUES)
        key = f"{arch}.{rng.choice(KEYS)}"
        meta = [m for m in meta if m[0] != key] + [[key, t, x]]
    elif kind == 1:  # any key's value replaced
        i = rng.randrange(len(meta))
        t, x = rng.choice(HOSTILE_VALUES)
        meta[i][1:] = [t, x]
    elif kind == 2:  # a string or array length far past the file
        i = rng.randrange(len(meta))
        n = rng.choice([2**32, 2**63, 2**64 - 1, len(data) * 10])
        meta[i][1:] = [T["arr"], struct.pack("<IQ", rng.choice([T["u8"], T["str"], T["arr"], T["f64"]]), n)] if rng.random() < 0.5 else [T["str"], struct.pack("<Q", n) + b"ab"]
        meta[i][1] = T["arr"] if meta[i][2][:1] != b"" and len(meta[i][2]) == 12 else T["u8"]
        if meta[i][1] == T["u8"]:  # the string form: type str with a raw length
            meta[i][1:] = [T["str"], n]
            meta[i][2] = "x" * 3
            raw = struct.pack("<Q", n) + b"xyz"
            meta[i] = [meta[i][0], T["str"], raw]
    elif kind == 3:  # unknown value type
        meta[rng.randrange(len(meta))][1:] = [rng.choice([13, 99, 2**32 - 1]), b"\0" * 8]
    elif kind == 4:  # overflowing or hostile shapes
        i = rng.randrange(len(tensors))
        tensors[i][1] = rng.choice([[2**63], [32, 2**63], [2**32, 2**32], [0], [], [1, 1, 1, 1, 1], [2**64 - 1, 1], [32, 2**40 + 1], [-32, 8]])
    elif kind == 5:  # unknown tensor type
        tensors[rng.randrange(len(tensors))][2] = rng.choice([4, 5, 31, 99, 2**32 - 1])
    elif kind == 6:  # offsets: huge, unaligned, overlapping
        i = rng.randrange(len(tensors))
        tensors[i][3] = rng.choice([2**64 - 1, 2**63, tensors[i][3] + 1, tensors[(i + 1) % len(tensors)][3], len(data)])
    elif kind == 7:  # a duplicate tensor
        tensors.append(list(tensors[rng.randrange(len(tensors))]))
    elif kind == 8:  # truncation anywhere
        full = serialize(meta, tensors, data)
        return full[: rng.randrange(len(full))]
    elif kind == 9:  # nested arrays, deep
        depth = rng.choice([5, 50, 5000])
        x = struct.pack("<IQ", T["u8"], 0)
        for _ in range(depth):
            x = struct.pack("<IQ", T["arr"], 1) + x
        meta.append(["hostile.nested", T["arr"], x])
    elif kind == 10:  # general.alignment zero, odd, huge, wrong type
        t, x = rng.choice([(T["u32"], 0), (T["u32"], 3), (T["u32"], 2**31), (T["str"], "32"), (T["f32"], 32.0), (T["u64"], 2**63)])
        meta = [m for m in meta if m[0] != "general.alignment"] + [["general.alignment", t, x]]
    elif kind == 11:  # block_count 0 / 2^32-1, zero head counts
        t, x = rng.choice([(T["u32"], 0), (T["u32"], 2**32 - 1), (T["u64"], 2**63)])
        key = f"{arch}.{rng.choice(['block_count', 'attention.head_count', 'attention.head_count_kv', 'embedding_length'])}"
        meta = [m for m in meta if m[0] != key] + [[key, t, x]]
    elif kind == 12:  # header counts past the table
        return serialize(meta, tensors, data, n_t=rng.choice([len(tensors) + 1, 2**63, 10**6]), n_kv=rng.choice([len(meta) + 1, 2**63, 10**6]))
    else:  # random bytes flipped inside the header
        full = bytearray(serialize(meta, tensors, data))
        header_end = len(full) - len(data)
        for _ in range(rng.randint(1, 8)):
            full[rng.randrange(8, header_end)] = rng.randrange(256)
        return bytes(full)
    return serialize(meta, tensors, data, alignment)


CHILD = textwrap.dedent("""
    import json, resource, sys, time, traceback
    sys.path.insert(0, {root!r})
    from collections import Counter
    from tallow.errors import TallowError
    from tallow.gguf_file import GGUFFile
    from tallow.spec import spec_from_gguf
    from tallow.memory.budget import kv_bytes
    # A multi-GB allocation fails here instead of succeeding (and is then a MemoryError: a failure).
    limit = {limit}
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    out = []
    for path in sys.argv[1:]:
        t0 = time.monotonic()
        try:
            with GGUFFile(path) as gf:
                spec = spec_from_gguf(gf)
                sum(t.n_rows * t.n_cols for t in gf.tensors.values()), Counter(t.qtype.name for t in gf.tensors.values())
                kv_bytes(spec, min(spec.context_length, 4096))
            result = "ok"
        except TallowError as exc:
            msg = str(exc)
            result = "error" if msg and "\\n" not in msg and len(msg) < 400 else "bad message: " + msg[:300]
        except BaseException as exc:
            result = "traceback: " + "".join(traceback.format_exception(exc))[-800:]
        out.append([path, result, time.monotonic() - t0])
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    base = tmp_path_factory.mktemp("fuzz")
    rng = random.Random(SEED)
    sources = {arch: parse(write_tiny_model(arch, base / f"{arch}.gguf")) for arch in ("llama", "gemma3")}
    paths = []
    for i in range(N_CASES):
        arch = rng.choice(list(sources))
        p = base / f"case{i:03d}.gguf"
        p.write_bytes(mutate(rng, *sources[arch], arch))
        paths.append(p)
    return paths


def run_child(paths, limit=3 << 30):
    code = CHILD.format(root=str(ROOT), limit=limit)
    proc = subprocess.run([sys.executable, "-c", code, *map(str, paths)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"the child died (exit {proc.returncode}): {proc.stderr[-1500:]}"
    return json.loads(proc.stdout)


def test_every_fuzzed_header_is_refused_in_one_sentence_or_loads(cases):
    results = run_child(cases)
    bad = [(Path(p).name, r) for p, r, _ in results if r not in ("ok", "error")]
    assert not bad, f"{len(bad)} of {len(results)} cases: {bad[:5]}"
    slow = [(Path(p).name, s) for p, _, s in results if s > 5]
    assert not slow, slow
    errors = sum(r == "error" for _, r, _ in results)
    assert errors > len(results) // 2  # the mutations mostly break the file: the fuzzer tests something


def test_cli_inspect_on_fuzzed_files_is_one_sentence_and_exit_2(cases):
    results = run_child(cases[:40])
    broken = [p for p, r, _ in results if r == "error"][:3]
    for path in broken:
        proc = subprocess.run([sys.executable, "-m", "tallow.cli", "inspect", path], capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert proc.returncode == 2, (path, proc.returncode, proc.stderr[-500:])
        assert proc.stderr.startswith("tallow: error:") and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr

"""The tokenizer against llama.cpp: ids, text, streaming, special tokens, on three real models and
llama.cpp's vocabulary-only Gemma 4 file.

Fixtures come from scripts/make_tokenizer_fixtures.py (llama-cpp-python as the oracle). Each test
skips, saying why, when its model file is not found (see tests/model_paths.py and
tests/shared_data.py).
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tallow.errors import ModelFileError
from tallow.gguf_file import GGUFFile
from tallow.tokenizer import StreamDecoder, Tokenizer, TokenizerError
from tallow.tokenizer.bpe import codepoint_classes, split_words

from model_paths import KNOWN_MODELS, require_model
from shared_data import shared_file, vocab_gguf

FIXTURES = Path(__file__).parent / "fixtures"
VOCAB_ONLY = ("gemma-4",)  # llama.cpp's vocabulary-only test files (shared/vocab/)
_loaded: dict[str, Tokenizer] = {}


def _fixture(name: str) -> dict:
    return json.loads((FIXTURES / f"tokenizer_{name}.json").read_text(encoding="utf-8"))


def _path(name: str) -> Path:
    if name in VOCAB_ONLY:
        return vocab_gguf(name)  # skips when the shared folder is absent
    return require_model(name)  # skips, or fails under TALLOW_REQUIRE_MODELS=1


def _tokenizer(name: str) -> Tokenizer:
    if name not in _loaded:
        path = _path(name)
        t0 = time.perf_counter()
        gf = GGUFFile(path)
        t1 = time.perf_counter()
        _loaded[name] = Tokenizer.from_gguf(gf)
        print(f"\n{name}: header read in {(t1 - t0) * 1e3:.0f} ms, tokenizer built in "
              f"{(time.perf_counter() - t1) * 1e3:.0f} ms (vocab {_loaded[name].vocab_size})")
    return _loaded[name]


def _expected_bytes(case: dict, key: str) -> bytes:
    return case[key].encode("utf-8") if key in case else bytes.fromhex(case[key + "_hex"])


@pytest.fixture(scope="module", params=KNOWN_MODELS + VOCAB_ONLY)
def model(request) -> tuple[Tokenizer, dict]:
    tok = _tokenizer(request.param)
    return tok, _fixture(request.param)


def test_encode_matches_llama_cpp(model):
    tok, fx = model
    bad = []
    for case in fx["cases"]:
        got = tok.encode(case["text"])  # add_special=True, parse_special=True
        if got != case["ids"]:
            bad.append(("special", case["text"], case["ids"], got))
        got = tok.encode(case["text"], add_special=False, parse_special=False)
        if got != case["ids_plain"]:
            bad.append(("plain", case["text"], case["ids_plain"], got))
    n = 2 * len(fx["cases"])
    print(f"{fx['model']}: {n - len(bad)}/{n} encodings identical to llama.cpp")
    assert not bad, "\n".join(f"[{k}] {t!r}\n  llama.cpp {e}\n  tallow    {g}" for k, t, e, g in bad[:10])


def test_decode_matches_llama_cpp(model):
    tok, fx = model
    bad = []
    for case in fx["cases"] + fx["decode_cases"]:
        for skip, key in ((False, "detok"), (True, "detok_skip")):
            want = _expected_bytes(case, key)
            got = tok.decode_bytes(case["ids"], skip_special=skip)
            if got != want:
                bad.append((case["ids"], skip, want, got))
            elif tok.decode(case["ids"], skip_special=skip) != want.decode("utf-8", errors="replace"):
                bad.append((case["ids"], skip, want, "str"))
    assert not bad, "\n".join(f"{i} skip_special={s}\n  llama.cpp {w!r}\n  tallow    {g!r}" for i, s, w, g in bad[:10])


def test_stream_decode_concatenates_to_decode(model):
    tok, fx = model
    for case in fx["cases"] + fx["decode_cases"]:
        for skip in (False, True):
            dec = StreamDecoder(tok, skip_special=skip)
            parts = [dec.push(i) for i in case["ids"]]
            parts.append(dec.flush())
            for p in parts:
                p.encode("utf-8")  # a str with half a character would hold a lone surrogate
            assert "".join(parts) == tok.decode(case["ids"], skip_special=skip), case["ids"]


def test_stream_holds_split_characters():
    tok = _tokenizer("gemma3-270m")
    ids = [tok.token_to_id[f"<0x{b:02X}>"] for b in "😀".encode("utf-8")]
    dec = StreamDecoder(tok)
    assert [dec.push(i) for i in ids] == ["", "", "", "😀"]
    assert dec.flush() == ""
    # An unfinished character comes out as U+FFFD on flush, as decode() gives it.
    assert dec.push(ids[0]) == "" and dec.flush() == "\ufffd" == tok.decode(ids[:1])


def test_special_tokens_and_eog(model):
    tok, fx = model
    assert tok.vocab_size == fx["vocab_size"]
    assert tok.bos_id == (fx["bos_id"] if fx["bos_id"] >= 0 else None)
    assert tok.eos_id == (fx["eos_id"] if fx["eos_id"] >= 0 else None)
    assert (tok.add_bos, tok.add_eos) == (fx["add_bos"], fx["add_eos"])
    assert tok.eog_ids == set(fx["eog_ids"])
    assert {i: a for i, a in enumerate(tok.attrs) if a != 4} == {i: a for i, a in fx["attrs_not_normal"]}


def test_every_token_piece(model):
    tok, fx = model
    for special, key in ((True, "piece_sha256_special"), (False, "piece_sha256_plain")):
        h = hashlib.sha256()
        for t in range(tok.vocab_size):
            p = tok.token_to_bytes(t, special=special)
            h.update(len(p).to_bytes(4, "little"))
            h.update(p)
        assert h.hexdigest() == fx[key], f"token pieces differ from llama.cpp (special={special})"


def test_unicode_table_matches_llama_cpp():
    fx = _fixture(KNOWN_MODELS[0])
    assert hashlib.sha256(codepoint_classes().tobytes()).hexdigest() == fx["unicode_class_sha256"], (
        "llama.cpp's unicode table changed: regenerate bpe.py's table with "
        "scripts/make_tokenizer_fixtures.py --emit-unicode-table"
    )


def test_encode_speed(model):
    tok, fx = model
    base = "".join(c["text"] for c in fx["cases"][:200])
    text = base
    while len(tok.encode(text, add_special=False)) < 2000:
        text += base
    ids = tok.encode(text, add_special=False)
    n = 2000
    # cut the text to about 2,000 tokens
    text = tok.decode(ids[:n], skip_special=False)
    fresh = Tokenizer.from_gguf(GGUFFile(_path(fx["model"])))  # cold word cache
    t0 = time.perf_counter()
    cold = fresh.encode(text)
    t1 = time.perf_counter()
    fresh.encode(text)
    t2 = time.perf_counter()
    print(f"{fx['model']}: {len(cold)} tokens, cold {(t1 - t0) * 1e3:.1f} ms, warm {(t2 - t1) * 1e3:.1f} ms")
    assert t1 - t0 < 0.5  # generous for slow CI; typically 10-30 ms


def test_edge_inputs():
    tok = _tokenizer("qwen2.5-coder-1.5b-instruct")
    assert tok.encode("a\ud800b", add_special=False) == tok.encode("ab", add_special=False)
    with pytest.raises(TokenizerError):
        tok.decode([tok.vocab_size])
    with pytest.raises(TokenizerError):
        tok.token_to_bytes(-1)
    assert tok.decode([]) == ""


def _fake(md: dict) -> SimpleNamespace:
    return SimpleNamespace(path="fake.gguf", metadata=md)


def test_unknown_pre_tokenizer_is_an_error():
    md = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "no-such-pre",
          "tokenizer.ggml.tokens": ["a", "b", "ab"], "tokenizer.ggml.merges": ["a b"]}
    with pytest.raises(ModelFileError, match="no-such-pre"):
        Tokenizer(_fake(md))
    md["tokenizer.ggml.pre"] = "gpt2"
    tok = Tokenizer(_fake(md))
    assert tok.encode("abab ab", add_special=False) == [2, 2, 2]  # " " has no token: dropped like llama.cpp
    del md["tokenizer.ggml.pre"]  # missing: default regexes with a warning, as llama.cpp
    assert Tokenizer(_fake(md)).encode("ab", add_special=False) == [2]
    md["tokenizer.ggml.model"] = "t5"
    with pytest.raises(ModelFileError, match="not supported"):
        Tokenizer(_fake(md))


@pytest.mark.parametrize("pre", ["llama-bpe", "gpt-2", "default", "qwen2"])
def test_other_pre_tokenizers_on_smollm_vocab(pre):
    """llama3/gpt2/default/qwen2 regexes, checked on smollm2's vocab relabelled (see the script)."""
    path = require_model("smollm2-135m")
    fx = _fixture("smollm2-135m")
    variant = fx["pre_variants"][pre]
    md = dict(GGUFFile(path).metadata)
    md["tokenizer.ggml.pre"] = pre
    tok = Tokenizer(SimpleNamespace(path=f"{path} (pre={pre})", metadata=md))
    assert tok.add_bos == variant["add_bos"]
    bad = []
    for case, ids, plain in zip(fx["cases"], variant["ids"], variant["ids_plain"]):
        if tok.encode(case["text"]) != ids or tok.encode(case["text"], False, False) != plain:
            bad.append(case["text"])
    assert not bad, f"{len(bad)} strings differ from llama.cpp with pre={pre}, e.g. {bad[:5]!r}"


def _reference_partition(text: str, order: list[tuple[int, str, int]]) -> list[tuple[int, int, int]]:
    """llama.cpp's tokenizer_st_partition, literally: every token walks every raw fragment."""
    frags = [(0, len(text), -1)]
    for tid, needle, attr in order:
        out = []
        for s, e, t in frags:
            if t >= 0:
                out.append((s, e, t))
                continue
            while True:
                at = text.find(needle, s, e)
                if at < 0:
                    if s < e:
                        out.append((s, e, -1))
                    break
                left = at
                while attr & 128 and left > s and text[left - 1] in " \t\n\v\f\r":
                    left -= 1
                if left > s:
                    out.append((s, left, -1))
                out.append((at, at + len(needle), tid))
                s = at + len(needle)
                while attr & 256 and s < e and text[s] in " \t\n\v\f\r":
                    s += 1
                if s >= e:
                    break
        frags = out
    return frags


def test_special_partition_matches_reference():
    """Overlapping special texts, lstrip/rstrip: the optimized partition equals the literal one."""
    import random

    specials = ["ab", "bc", "abc", "<x>", "<x", "x>", "  ", "a", "<xx>", "cab"]
    vocab = ["?"] + specials
    md = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-2", "tokenizer.ggml.tokens": vocab,
          "tokenizer.ggml.token_type": [1] + [3, 4] * 5, "tokenizer.ggml.merges": []}
    tok = Tokenizer(_fake(md))
    tok.attrs[vocab.index("<x>")] |= 128  # lstrip
    tok.attrs[vocab.index("bc")] |= 256  # rstrip
    tok.attrs[vocab.index("  ")] |= 128 | 256
    rng = random.Random(3)
    for parse_special in (True, False):
        order = [(t, vocab[t], tok.attrs[t]) for t in (tok._special_all if parse_special else tok._special_user)]
        for _ in range(3000):
            text = "".join(rng.choice(["a", "b", "c", "x", "<", ">", " ", "  ", "\n"]) for _ in range(rng.randint(1, 25)))
            assert tok._partition(text, parse_special) == _reference_partition(text, order), text


def test_pre_tokenizer_digit_rules():
    # llama3 groups digits by three, qwen2 and smollm split every digit, gpt2 keeps runs.
    assert split_words("12345", "llama3") == ["123", "45"]
    assert split_words("12345", "qwen2") == ["1", "2", "3", "4", "5"]
    assert split_words("x 12345", "starcoder") == ["x", " ", "1", "2", "3", "4", "5"]
    assert split_words("x 12345", "gpt2") == ["x", " 12345"]


def test_gemma4_llama_cpp_test_strings():
    """llama.cpp's own tokenizer test for this vocab (tests/test-tokenizer-0): every string of the
    .inp file, tokenized with add_special=False and parse_special=False, gives the .out line."""
    tok = _tokenizer("gemma-4")
    inp = shared_file("vocab/ggml-vocab-gemma-4.gguf.inp").read_text(encoding="utf-8")
    out = shared_file("vocab/ggml-vocab-gemma-4.gguf.out").read_text(encoding="utf-8")
    texts = inp.split("\n__ggml_vocab_test__\n")
    expected = [[int(x) for x in line.split()] for line in out.split("\n")[: len(texts)]]
    assert len(texts) == len(expected) == 46
    bad = [(t, e, tok.encode(t, add_special=False, parse_special=False)) for t, e in zip(texts, expected)]
    bad = [b for b in bad if b[1] != b[2]]
    assert not bad, "\n".join(f"{t!r}\n  llama.cpp {e}\n  tallow    {g}" for t, e, g in bad[:10])
    assert all(tok.decode(e) == t for t, e in zip(texts, expected))  # and every one decodes back


def test_gemma4_tokenizer_facts():
    """What llama.cpp derives for Gemma 4: BOS always added, the turn/tool markers are EOG or
    control, "<unusedN>" are plain text, raw spaces become "▁" and unknown bytes "<0xXX>"."""
    tok = _tokenizer("gemma-4")
    assert (tok.kind, tok.pre, tok.add_bos, tok.bos_id, tok.eos_id) == ("bpe", "gemma4", True, 2, 1)
    t2i = tok.token_to_id
    assert {t2i["<eos>"], t2i["<turn|>"], t2i["<|tool_response>"]} <= tok.eog_ids
    assert tok.encode("<|turn>user\nhi<turn|>", add_special=False)[:1] == [t2i["<|turn>"]]
    assert tok.encode("<|turn>", add_special=False, parse_special=False) != [t2i["<|turn>"]]
    assert tok.encode("<unused0>", add_special=False) != [t2i["<unused0>"]]  # NORMAL in this vocab
    assert tok.encode("a b", add_special=False) == [t2i["a"], t2i["▁b"]]
    assert tok.decode([t2i["<0xF0>"], t2i["<0x9F>"], t2i["<0x98>"], t2i["<0x80>"]]) == "😀"
    assert tok.encode("\n" * 31, add_special=False) == [t2i["\n" * 31]]


def test_gemma4_switch_merges_whole_lines(monkeypatch):
    """TALLOW_TOKENIZER_CUTS=0 takes the reference path, with the same ids on llama.cpp's strings."""
    monkeypatch.setenv("TALLOW_TOKENIZER_CUTS", "0")
    ref = Tokenizer.from_gguf(GGUFFile(_path("gemma-4")))
    assert ref._bpe._chunk_boundary is None and _tokenizer("gemma-4")._bpe._chunk_boundary is not None
    fx = _fixture("gemma-4")
    for case in fx["cases"]:
        assert ref.encode(case["text"]) == case["ids"], case["text"]


def test_gemma4_line_chunks_merge_like_whole_lines():
    """Cutting a line before "▁" (not after ">" or "▁") gives the ids of merging the whole line."""
    import random

    tok = _tokenizer("gemma-4")
    bpe = tok._bpe
    rng = random.Random(5)
    pieces = ["a", "b", "the", "▁", " ", "  ", ">", "<", "é", "中", "😀", "ing", "-", "\t", "x>", "> ", "0"]
    for _ in range(400):
        line = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 40))).replace(" ", "▁")
        assert bpe.encode(line) == bpe._encode_spm_style(line), line

"""The tokenizer against llama.cpp: ids, text, streaming, special tokens, on three real models.

Fixtures come from scripts/make_tokenizer_fixtures.py (llama-cpp-python as the oracle). Each test
skips, saying why, when its model file is not found (see tests/model_paths.py).
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

from model_paths import KNOWN_MODELS, model_path, require_model

FIXTURES = Path(__file__).parent / "fixtures"
_loaded: dict[str, Tokenizer] = {}


def _fixture(name: str) -> dict:
    return json.loads((FIXTURES / f"tokenizer_{name}.json").read_text(encoding="utf-8"))


def _tokenizer(name: str) -> Tokenizer:
    if name not in _loaded:
        path = require_model(name)  # skips, or fails under TALLOW_REQUIRE_MODELS=1
        gf = GGUFFile(path)
        t0 = time.perf_counter()
        _loaded[name] = Tokenizer.from_gguf(gf)
        print(f"\n{name}: tokenizer built in {(time.perf_counter() - t0) * 1e3:.0f} ms "
              f"(vocab {_loaded[name].vocab_size})")
    return _loaded[name]


def _expected_bytes(case: dict, key: str) -> bytes:
    return case[key].encode("utf-8") if key in case else bytes.fromhex(case[key + "_hex"])


@pytest.fixture(scope="module", params=KNOWN_MODELS)
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
    fresh = Tokenizer.from_gguf(GGUFFile(model_path(fx["model"])))  # cold word cache
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

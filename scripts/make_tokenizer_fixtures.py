#!/usr/bin/env python3
"""Produce tests/fixtures/tokenizer_<model>.json with llama.cpp (through llama-cpp-python) as the oracle.

Dev-only: this script imports ``llama_cpp``; tallow never does. For each model it records, for a
deterministic corpus of a few hundred strings (hand-written cases plus seeded random mixtures):

* ``ids``: ``llama_tokenize(text, add_special=True, parse_special=True)``
* ``ids_plain``: ``llama_tokenize(text, add_special=False, parse_special=False)``
* ``detok`` / ``detok_skip``: the text of ``ids`` as llama-cpp-python's ``Llama.detokenize``
  gives it with ``special=True`` / ``special=False`` (stored as text when the bytes are valid
  UTF-8, else as hex in ``detok_hex`` / ``detok_skip_hex``).

For smollm2 the corpus is also tokenized with its GGUF relabelled as other pre-tokenizers
(``pre_variants``: llama-bpe, gpt-2, default, qwen2), covering regex families no model here uses.

And per model: BOS/EOS, add_bos/add_eos, the EOG set (``llama_vocab_is_eog`` over the whole
vocab), every token attribute that is not plain NORMAL, digests of every token's piece with and
without ``special``, detokenized random id lists, and a digest of llama.cpp's code point class
table (checked against the table embedded in ``tallow/tokenizer/bpe.py``).

We call ``llama_token_to_piece`` ourselves with a large buffer instead of ``Llama.detokenize``,
whose fixed 32-byte buffer mangles longer pieces; otherwise the rules are llama-cpp-python's
(concatenate pieces, drop one leading space when the list starts with BOS). Where no piece is
longer than 32 bytes we check that ``Llama.detokenize`` agrees.

Usage:
    python scripts/make_tokenizer_fixtures.py [--models-dir DIR] [--vocab-dir ../shared/vocab] [--out tests/fixtures]
    python scripts/make_tokenizer_fixtures.py --emit-unicode-table   # prints bpe.py's table
"""

from __future__ import annotations

import argparse
import base64
import ctypes
import hashlib
import json
import lzma
import os
import random
import sys
import tempfile
import zlib
from pathlib import Path

import numpy as np

MODELS = ("smollm2-135m", "gemma3-270m", "qwen2.5-coder-1.5b-instruct")
# Vocabulary-only GGUFs from llama.cpp's test models (../shared/vocab/), unpacked from .xz.
VOCAB_ONLY = {"gemma-4": "ggml-vocab-gemma-4.gguf.xz"}

# Gemma 4's own markup and whitespace shapes, added to the shared corpus for its fixture only
# (the other fixtures keep their corpus unchanged).
GEMMA4_EXTRA: list[str] = [
    "<bos><|turn>system\n<|think|>You are helpful.<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\n",
    "<|turn>model\n<|channel>thought\nLet me think.<channel|>The answer is 4.<turn|>",
    "<|channel>thought\n<channel|>",
    "<|tool>declaration:get_weather{description:<|\"|>Weather<|\"|>,parameters:{properties:{city:{type:<|\"|>STRING<|\"|>}},"
    "required:[<|\"|>city<|\"|>],type:<|\"|>OBJECT<|\"|>}}<tool|>",
    "<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>,days:3,metric:true}<tool_call|>",
    "<|tool_response>response:get_weather{temp:21,sky:<|\"|>clear<|\"|>}<tool_response|>",
    "<|\"|>", "<|tool", "call:", "<turn|><eos>", "<|image|><|audio|><|video|>",
    "\n" * 40, "\n" * 31, " \n" * 5, "\t" * 33, " " * 40, "▁" * 3, "x▁y ▁ z",
    "line one\nline two\n\nline four\n\n\n\nline eight",
    "a very long line " * 60,
    "\u00e9\u0301\u00e9 \ufb01 \u2028 \u2029 sep",
]

# ----------------------------------------------------------------------------- corpus

HAND_WRITTEN: list[str] = [
    "",
    " ",
    "  ",
    "   ",
    "\t",
    "\n",
    "\n\n",
    "\r\n",
    " \n ",
    "Hello world",
    "Hello, world!",
    " Hello world",
    "  Hello world  ",
    "Hello world ",
    "hello\tworld\n",
    "The quick brown fox jumps over the lazy dog.",
    "THE QUICK BROWN FOX! the Quick bRoWn fOx?",
    "it's don't we'll they've I'd she'S you're I'M WE'LL they'VE",
    "'s 't 're 've 'm 'll 'd",
    "rock 'n' roll, 'quoted' and \"double quoted\"",
    "l'homme d'affaires aujourd'hui",
    "0", "7", "12", "123", "1234", "12345", "123456", "1234567",
    "3.14159265358979323846264338327950288419716939937510",
    "99 bottles of beer, 1,000,000 dollars, 2024-01-31T12:34:56Z",
    "Phone: +1 (555) 123-4567, zip 90210-1234",
    "0x1F 0b1010 1e-10 -42 +7 1_000_000",
    "١٢٣ ٤٥٦ ۷۸۹ १२३ ໑໒໓ ①②③ Ⅻ ½ ¾",
    "你好，世界！",
    "我爱北京天安门。今天天气很好，我们去公园散步吧。",
    "日本語のテキスト、カタカナとひらがな。漢字も。",
    "한국어 텍스트입니다. 안녕하세요!",
    "Привет, мир! Как дела? ЁЖИК в тумане.",
    "Україна, Київ — «цитата» і ґанок.",
    "مرحبا بالعالم! كيف حالك؟",
    "שלום עולם",
    "नमस्ते दुनिया, यह हिंदी है।",
    "বাংলা ভাষা",
    "தமிழ் மொழி",
    "ภาษาไทยไม่มีช่องว่างระหว่างคำ",
    "Ελληνικά: Γειά σου Κόσμε",
    "Tiếng Việt có dấu: Chào thế giới",
    "emoji: 😀😃😄😁 👍🏽 ❤️ 🇺🇸 🇯🇵",
    "family: 👨‍👩‍👧‍👦 and 👩🏾‍💻 and 🏳️‍🌈",
    "new emoji 🫨🫷🫸 and 🪿",
    "café naïve résumé coöperate",
    "e\u0301 a\u0300 o\u0308 n\u0303 (combining marks)",
    "Z\u0351\u0308\u0353a\u0362l\u0335g\u0337o",
    "Ａｂｃ　ｆｕｌｌｗｉｄｔｈ　１２３",
    "nbsp\u00a0here, thin\u2009space, ideographic\u3000space, nel\x85line",
    "zero\u200bwidth\u200cnon\u200djoiner\ufeffbom",
    "control \x00 \x01 \x07 \x1b[31m \x7f \x1c\x1d\x1e\x1f end",
    "replacement \ufffd char and \ufffd\ufffd",
    "private use \ue000\uf8ff \U000f0000",
    "unicode 15 letters \U00031350\U00031351 kawi \U00011f04\U00011f05 garay digits \U00010d40\U00010d41",
    "math ∑∫∂√∞≈≠≤≥ → ← ↔ ⇒ ∀x∃y",
    "symbols © ® ™ § ¶ † ‡ • … ‰ € £ ¥ ₹ ₿",
    "box ┌─┐│└─┘ ░▒▓█",
    "https://example.com/path/to/page?query=1&other=two#frag",
    "mailto:someone@example.org and user.name+tag@sub.domain.co.uk",
    "C:\\Users\\name\\Documents\\file.txt and /usr/local/bin/python3",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "class Foo:\n\tdef __init__(self, x: int) -> None:\n\t\tself.x = x  # tab indented\n",
    "#include <stdio.h>\n\nint main(void) {\n    printf(\"Hello, %s!\\n\", \"world\");\n    return 0;\n}\n",
    "fn main() {\n    let v: Vec<i32> = (0..10).map(|x| x * x).collect();\n    println!(\"{:?}\", v);\n}\n",
    "const f = async (a, b) => { await fetch(`/api/${a}?b=${b}`); return a ?? b; };",
    "SELECT id, name FROM users WHERE age >= 18 AND name LIKE '%smith%' ORDER BY id DESC;",
    "<html><body><div class=\"x\">Hi &amp; bye</div></body></html>",
    "{\"key\": [1, 2.5, true, null], \"nested\": {\"a\": \"b\"}}",
    "x = [i**2 for i in range(10) if i % 2 == 0]  # list comp",
    "if (a && b || !c) { x += 1; } else { x -= 1; }",
    "    indented with four spaces",
    "\tindented with a tab",
    "trailing spaces    ",
    "many        internal        spaces",
    "lines\n\n\n\nwith\n\n\nblank\n\nlines",
    "windows\r\nline\r\nendings\r\n",
    "mixed \t \n \r \x0b \x0c whitespace",
    "a" * 300,
    "ab" * 120,
    "=" * 80,
    "-" * 50 + "\n" + "#" * 50,
    "!!!???...,,,;;;:::",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n",
    "<|endoftext|>",
    "text<|endoftext|>more text",
    "<|im_start|><|im_end|><|im_start|>",
    "<|im_start",
    "<|im_end|>trailing",
    "<start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n",
    "<start_of_turn>",
    "<bos>",
    "<bos>Hello",
    "<bos><bos>",
    "<eos>",
    "<pad><unk><mask>",
    "</s> <s> <unk>",
    "<unused0> <unused99>",
    "[multimodal]",
    "<|fim_prefix|>def f():<|fim_suffix|>\n    return 1<|fim_middle|>",
    "<|repo_name|>tallow<|file_sep|>main.py",
    "<tool_call>{\"name\": \"f\"}</tool_call>",
    "<reponame>x<filename>y.py<gh_stars>10",
    "<jupyter_code>print(1)<jupyter_output>1",
    "  <|im_start|>  spaced  <|im_end|>  ",
    "<start_of_turn>user\n  two leading spaces<end_of_turn>",
    "Ġ Ċ ĉ ▁ ▁▁ Ā ā",
    "▁leading block and trailing▁",
    "<0x41> <0xFF> byte token text",
    "Mixed CASE camelCase snake_case kebab-case SCREAMING_CASE PascalCase",
    "iPhone eBay McDonald's O'Neil",
    "U.S.A. e.g. i.e. etc. Mr. Dr.",
    "$100 €50 £20 ¥1000 100% 50°C",
    "@user #hashtag $TICKER ^caret ~tilde `backtick` |pipe|",
    "a1b2c3 x9y8z7 2nd 3rd 21st",
    "🙂" * 10,
    "中文English混合text测试123数字",
    "Ѐ Ё Ђ ѓ Є ѕ І ї ј Љ Њ Ћ Ќ",
]

POOLS: dict[str, list[str]] = {
    "en": ["hello", "world", "The", "quick", "brown", "fox", "is", "running", "tokenizer", "llama",
           "don't", "it's", "I'll", "we've", "ASCII", "x", "a", "Zebra", "naïve", "co-operate"],
    "code": ["def", "return", "if x:", "for i in range(10):", "{", "}", "()", "[]", "=>", "!=", "==",
             "&&", "||", "->", "::", "#include", "std::vector<int>", "self.x", "__init__", "0x7fff",
             "printf(\"%d\\n\", x);", "lambda x: x", "`code`", "/* c */", "// comment", "<div>"],
    "num": ["0", "1", "42", "123", "2024", "3.14", "1,000", "999999", "12345678901", "007", "1e9", "-5"],
    "ws": [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n", "\n ", "\t\t", "    ", "\u00a0", "\u3000", "\x0b"],
    "cjk": ["你好", "世界", "中文", "日本語", "カタカナ", "ひらがな", "한국어", "漢字", "。", "，", "！"],
    "cyr": ["Привет", "мир", "Ёжик", "тест", "Київ", "ґанок"],
    "ar": ["مرحبا", "العالم", "كتاب", "שלום", "עולם"],
    "hi": ["नमस्ते", "दुनिया", "हिंदी", "বাংলা", "தமிழ்", "ไทย"],
    "emoji": ["😀", "👍🏽", "❤️", "🇺🇸", "👨‍👩‍👧‍👦", "👩🏾‍💻", "🏳️‍🌈", "🫨", "🪿", "✨", "🔥"],
    "accent": ["café", "e\u0301", "n\u0303", "Å", "ø", "ß", "œ", "Ǆ", "ǅ", "ﬁ", "ǰ"],
    "punct": [".", ",", "!", "?", "...", "—", "–", "«", "»", "\"", "'", "(", ")", ";", ":", "…", "、", "¿", "¡"],
    "special": ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<start_of_turn>", "<end_of_turn>", "<bos>",
                "<eos>", "</s>", "<pad>", "<unused5>", "<|fim_prefix|>", "<tool_call>", "<reponame>",
                "<|im_start", "im_end|>", "<start_of", "[multimodal]"],
    "url": ["https://a.b/c?d=e", "www.example.com", "user@host.org", "/etc/passwd", "C:\\x\\y"],
}
SEPARATORS = ["", " ", " ", " ", "  ", "\n", "\t", "\n\n", " \n", ", ", "-", "_", "/"]

# Code point ranges for random characters: scripts, marks, symbols, Unicode 15/16 additions,
# private use, unassigned, noncharacters, controls.
RANDOM_RANGES = [
    (0x20, 0x7E), (0x00, 0x1F), (0x7F, 0x9F), (0xA0, 0x24F), (0x300, 0x36F), (0x370, 0x3FF), (0x400, 0x4FF),
    (0x590, 0x6FF), (0x900, 0x97F), (0xE00, 0xE7F), (0x1100, 0x11FF), (0x2000, 0x206F), (0x20A0, 0x20CF),
    (0x2190, 0x22FF), (0x3000, 0x30FF), (0x4E00, 0x9FFF), (0xAC00, 0xD7A3), (0xE000, 0xE0FF), (0xFB00, 0xFB4F),
    (0xFE00, 0xFE0F), (0xFF00, 0xFFEF), (0xFFF0, 0xFFFF), (0x10000, 0x100FF), (0x10D40, 0x10D8F),
    (0x11F00, 0x11F5F), (0x1F300, 0x1FAFF), (0x20000, 0x2A6DF), (0x31350, 0x323AF), (0xE0000, 0xE007F),
    (0x10FFF0, 0x10FFFF),
]


def _random_char(rng: random.Random) -> str:
    lo, hi = rng.choice(RANDOM_RANGES)
    cp = rng.randint(lo, hi)
    if 0xD800 <= cp <= 0xDFFF:
        cp = 0x41
    return chr(cp)


def build_corpus(seed: int = 20240601, n_mixed: int = 170, n_random: int = 40) -> list[str]:
    """Hand-written strings, then seeded mixtures of the pools, then runs of random code points."""
    rng = random.Random(seed)
    corpus = list(HAND_WRITTEN)
    cats = sorted(POOLS)
    for _ in range(n_mixed):
        parts = []
        for _ in range(rng.randint(2, 9)):
            cat = rng.choice(cats)
            piece = rng.choice(POOLS[cat])
            r = rng.random()
            if r < 0.1:
                piece = piece.upper()
            elif r < 0.15:
                piece = piece.swapcase()
            parts.append(piece)
            parts.append(rng.choice(SEPARATORS))
        text = "".join(parts)
        if rng.random() < 0.2:
            text = " " + text
        if rng.random() < 0.2:
            text = text + rng.choice([" ", "\n", "  ", "\t"])
        corpus.append(text)
    for _ in range(n_random):
        corpus.append("".join(_random_char(rng) for _ in range(rng.randint(1, 24))))
    # One long mixed document (~2k tokens) to exercise caches and long-range behaviour.
    doc_rng = random.Random(seed + 1)
    corpus.append("".join(doc_rng.choice(POOLS[doc_rng.choice(cats)]) + doc_rng.choice(SEPARATORS)
                          for _ in range(900)))
    seen: set[str] = set()
    unique = []
    for s in corpus:
        if s not in seen:
            seen.add(s)
            unique.append(s)
    return unique


# ----------------------------------------------------------------------------- llama.cpp access

def _libllama() -> ctypes.CDLL:
    import llama_cpp

    return ctypes.CDLL(os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libllama.so"))


def llama_class_table() -> np.ndarray:
    """llama.cpp's code point classes, in the encoding bpe.py uses (see codepoint_classes())."""
    lib = _libllama()
    flags_of = lib._Z26unicode_cpt_flags_from_cptj  # unicode_cpt_flags_from_cpt(uint32_t)
    flags_of.restype = ctypes.c_uint16
    flags_of.argtypes = [ctypes.c_uint32]
    flags = np.fromiter((flags_of(c) for c in range(0x110000)), dtype=np.uint32, count=0x110000)
    cat = flags & 0xFF
    cls = np.zeros(0x110000, dtype=np.uint8)
    for bit, value in ((0x02, 1), (0x04, 2), (0x20, 3), (0x10, 4), (0x40, 5)):
        cls[cat == bit] = value
    cls[(flags & 0x100) != 0] = 6
    cls[:128] = 0
    return cls


def emit_unicode_table() -> str:
    cls = llama_class_table()
    change = np.nonzero(np.diff(cls.astype(np.int16)))[0] + 1
    starts = np.concatenate([[0], change])
    ends = np.concatenate([change, [cls.shape[0]]])
    raw = bytearray()
    for s, e in zip(starts, ends):
        v = int(e - s) * 8 + int(cls[s])
        while True:
            b, v = v & 0x7F, v >> 7
            raw.append(b | 0x80 if v else b)
            if not v:
                break
    text = base64.b85encode(zlib.compress(bytes(raw), 9)).decode()
    lines = [f'    "{text[i:i + 96]}"' for i in range(0, len(text), 96)]
    return "_CLASS_RUNS_B85 = (\n" + "\n".join(lines) + "\n)\n"


class Oracle:
    """One model loaded vocab-only in llama.cpp."""

    def __init__(self, path: Path):
        import llama_cpp

        self.llama_cpp = llama_cpp
        self.llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
        self.vocab = llama_cpp.llama_model_get_vocab(self.llm.model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)
        self.bos = llama_cpp.llama_vocab_bos(self.vocab)
        self._buf = ctypes.create_string_buffer(1024)

    def tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        return self.llm.tokenize(text.encode("utf-8"), add_bos=add_special, special=parse_special)

    def piece(self, tid: int, special: bool) -> bytes:
        n = self.llama_cpp.llama_token_to_piece(self.vocab, tid, self._buf, len(self._buf), 0, special)
        if n < 0:
            self._buf = ctypes.create_string_buffer(-n * 2)
            n = self.llama_cpp.llama_token_to_piece(self.vocab, tid, self._buf, len(self._buf), 0, special)
        return self._buf.raw[:n]

    def detokenize(self, ids: list[int], special: bool) -> bytes:
        pieces = [self.piece(t, special) for t in ids]
        out = b"".join(pieces)
        if ids and ids[0] == self.bos and out[:1] == b" ":
            out = out[1:]
        if all(len(p) <= 32 for p in pieces):  # Llama.detokenize's buffer is 32 bytes
            ref = self.llm.detokenize(ids, special=special)
            if ref != out:
                raise SystemExit(f"our detokenize wrapper disagrees with Llama.detokenize on {ids}: {out!r} vs {ref!r}")
        return out

    def piece_digest(self, special: bool) -> str:
        h = hashlib.sha256()
        for t in range(self.n_vocab):
            p = self.piece(t, special)
            h.update(len(p).to_bytes(4, "little"))
            h.update(p)
        return h.hexdigest()


def _text_or_hex(entry: dict, key: str, data: bytes) -> None:
    try:
        entry[key] = data.decode("utf-8")
    except UnicodeDecodeError:
        entry[key + "_hex"] = data.hex()


def make_fixture(name: str, path: Path, corpus: list[str], class_digest: str) -> dict:
    o = Oracle(path)
    lc = o.llama_cpp
    v = o.vocab
    cases = []
    for text in corpus:
        ids = o.tokenize(text, True, True)
        entry: dict = {"text": text, "ids": ids, "ids_plain": o.tokenize(text, False, False)}
        _text_or_hex(entry, "detok", o.detokenize(ids, special=True))
        _text_or_hex(entry, "detok_skip", o.detokenize(ids, special=False))
        cases.append(entry)
    # Random id lists: every kind of token (bytes, control, unused, long pieces), BOS-first too.
    rng = random.Random(7)
    attrs = [int(lc.llama_vocab_get_attr(v, t)) for t in range(o.n_vocab)]
    interesting = [t for t in range(o.n_vocab) if attrs[t] != 4]
    decode_cases = []
    for k in range(40):
        ids = [rng.randrange(o.n_vocab) if rng.random() < 0.7 else rng.choice(interesting)
               for _ in range(rng.randint(1, 30))]
        if k % 5 == 0 and o.bos >= 0:
            ids[0] = o.bos
        entry = {"ids": ids}
        _text_or_hex(entry, "detok", o.detokenize(ids, special=True))
        _text_or_hex(entry, "detok_skip", o.detokenize(ids, special=False))
        decode_cases.append(entry)
    return {
        "model": name,
        "generator": "scripts/make_tokenizer_fixtures.py",
        "llama_cpp_python": lc.__version__,
        "vocab_size": o.n_vocab,
        "bos_id": o.bos,
        "eos_id": lc.llama_vocab_eos(v),
        "add_bos": bool(lc.llama_vocab_get_add_bos(v)),
        "add_eos": bool(lc.llama_vocab_get_add_eos(v)),
        "eog_ids": [t for t in range(o.n_vocab) if lc.llama_vocab_is_eog(v, t)],
        "attrs_not_normal": [[t, a] for t, a in enumerate(attrs) if a != 4],
        "piece_sha256_special": o.piece_digest(True),
        "piece_sha256_plain": o.piece_digest(False),
        "unicode_class_sha256": class_digest,
        "cases": cases,
        "decode_cases": decode_cases,
    }


# Pre-tokenizers with no real model at hand are checked on smollm2's vocabulary relabelled: a
# vocab-only copy of its GGUF with tokenizer.ggml.pre replaced, tokenized by llama.cpp.
PRE_VARIANTS = {"smollm2-135m": ("llama-bpe", "gpt-2", "default", "qwen2")}


def write_vocab_variant(src: Path, dst: Path, overrides: dict[str, str]) -> None:
    """Copy every metadata key of `src` (no tensors) to `dst`, replacing string values in `overrides`."""
    import gguf

    reader = gguf.GGUFReader(str(src))
    writer = gguf.GGUFWriter(str(dst), arch=reader.fields["general.architecture"].contents())
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        value = overrides.get(name, field.contents())
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(name, value, vtype, sub_type=field.types[-1])
        else:
            writer.add_key_value(name, value, vtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def pre_variants(name: str, path: Path, corpus: list[str]) -> dict:
    import tempfile

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for pre in PRE_VARIANTS.get(name, ()):
            dst = Path(tmp) / f"{name}-{pre}.gguf"
            write_vocab_variant(path, dst, {"tokenizer.ggml.pre": pre})
            o = Oracle(dst)
            out[pre] = {
                "add_bos": bool(o.llama_cpp.llama_vocab_get_add_bos(o.vocab)),
                "ids": [o.tokenize(t, True, True) for t in corpus],
                "ids_plain": [o.tokenize(t, False, False) for t in corpus],
            }
    return out


def default_models_dir() -> Path:
    return Path(os.environ.get("TALLOW_TEST_MODELS", "/root/models"))


def read_vocab_tests(inp: Path) -> list[str]:
    """llama.cpp's tokenizer test strings: a .inp file, strings separated by __ggml_vocab_test__ lines."""
    return inp.read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n") if inp.exists() else []


def default_vocab_dir() -> Path:
    """shared/vocab next to the checkout (../shared) or next to the worktrees folder (../../shared)."""
    for up in Path(__file__).resolve().parents[1:4]:
        if (up / "shared" / "vocab").is_dir():
            return up / "shared" / "vocab"
    return Path("../shared/vocab")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models-dir", type=Path, default=default_models_dir())
    ap.add_argument("--vocab-dir", type=Path, default=default_vocab_dir(),
                    help="llama.cpp's vocabulary-only test GGUFs (.xz); default: the shared/vocab folder beside the checkout")
    ap.add_argument("--only", action="append", help="make only this fixture (repeatable), e.g. --only gemma-4")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "tests" / "fixtures")
    ap.add_argument("--emit-unicode-table", action="store_true", help="print the class table constant for bpe.py")
    args = ap.parse_args(argv)
    if args.emit_unicode_table:
        sys.stdout.write(emit_unicode_table())
        return 0
    corpus = build_corpus()
    class_digest = hashlib.sha256(llama_class_table().tobytes()).hexdigest()
    args.out.mkdir(parents=True, exist_ok=True)
    tmp = tempfile.TemporaryDirectory()
    paths = {name: args.models_dir / f"{name}.gguf" for name in MODELS}
    for name, packed in VOCAB_ONLY.items():
        src = args.vocab_dir / packed
        paths[name] = Path(tmp.name) / packed.removesuffix(".xz")
        if src.exists():
            paths[name].write_bytes(lzma.decompress(src.read_bytes()))
    for name, path in paths.items():
        if args.only and name not in args.only:
            continue
        if not path.exists():
            print(f"skip {name}: {path} not found", file=sys.stderr)
            continue
        model_corpus = corpus
        if name in VOCAB_ONLY:  # plus llama.cpp's own test strings for this vocab, and its extras
            inp = args.vocab_dir / VOCAB_ONLY[name].replace(".xz", ".inp")
            extra = read_vocab_tests(inp) + (GEMMA4_EXTRA if name == "gemma-4" else [])
            model_corpus = corpus + [t for t in dict.fromkeys(extra) if t not in corpus]
        fixture = make_fixture(name, path, model_corpus, class_digest)
        variants = pre_variants(name, path, corpus)
        if variants:
            fixture["pre_variants"] = variants
        out = args.out / f"tokenizer_{name}.json"
        out.write_text(json.dumps(fixture, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8")
        n_ids = sum(len(c["ids"]) for c in fixture["cases"])
        print(f"{out}: {len(fixture['cases'])} strings, {n_ids} ids, {out.stat().st_size / 1024:.0f} KiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

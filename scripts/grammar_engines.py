"""Compare grammar engines (llguidance, xgrammar, outlines-core) on tallow's own vocabularies.

    python scripts/grammar_engines.py [/root/models/smollm2-135m.gguf ...]

For each model: the engine's tokenizer build time (from the token bytes tallow's tokenizer
gives), the compile time of one nested JSON schema (objects, arrays, enums, $ref, required),
and the per-token mask time (thread CPU time, so a busy machine does not inflate it) while walking a valid instance of that schema token by token
(compute the allowed set, then advance with the instance's next token). Every engine sees
the same token bytes and the same token walk; a walk the engine refuses is reported, not hidden.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch

from tallow.gguf_file import GGUFFile
from tallow.tokenizer import Tokenizer

SCHEMA = {
    "$defs": {
        "address": {
            "type": "object",
            "properties": {"street": {"type": "string"}, "city": {"type": "string"}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
            "required": ["street", "city"],
        }
    },
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0},
        "role": {"enum": ["admin", "user", "guest"]},
        "home": {"$ref": "#/$defs/address"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "scores": {"type": "array", "items": {"type": "number"}},
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "role", "home", "tags"],
}
INSTANCE = {
    "name": "Ada Lovelace",
    "age": 36,
    "role": "admin",
    "home": {"street": "12 St James's Square", "city": "London", "zip": "12345"},
    "tags": ["math", "engines", "poetry"],
    "scores": [9.5, 10, 8.25],
    "active": True,
}


def vocab_bytes(tok: Tokenizer) -> tuple[list[bytes], list[int]]:
    """Token bytes as llama.cpp renders them; control tokens (and <…> user-defined ones) marked special."""
    out, special = [], []
    for i in range(tok.vocab_size):
        b = tok.token_to_bytes(i, special=True)
        if tok.attrs[i] & 8 or (tok.attrs[i] & 16 and b.startswith(b"<") and b.endswith(b">")):  # CONTROL, USER_DEFINED
            special.append(i)
        out.append(b)
    return out, special


def timed(fn):
    t0 = time.perf_counter()
    r = fn()
    return r, time.perf_counter() - t0


def bench_llguidance(tok, toks, special, walk):
    import llguidance

    class Wrap:
        eos_token_id = sorted(tok.eog_ids)[0]
        bos_token_id = tok.bos_id
        tokens = [b"\xff" + b if i in set(special) else b for i, b in enumerate(toks)]
        special_token_ids = special

        def __call__(self, s):
            return tok.encode(s.decode("utf-8", "replace") if isinstance(s, bytes) else s, add_special=False, parse_special=False)

    ll_tok, t_tok = timed(lambda: llguidance.LLTokenizer(llguidance.TokenizerWrapper(Wrap()), eos_token=sorted(tok.eog_ids)))
    grammar = llguidance.LLMatcher.grammar_from_json_schema(SCHEMA, defaults={"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "})
    m, t_comp = timed(lambda: llguidance.LLMatcher(ll_tok, grammar))
    assert not m.is_error(), m.get_error()
    buf = torch.zeros((tok.vocab_size + 31) // 32, dtype=torch.int32)
    times = []
    for t in walk:
        t0 = time.thread_time()
        m.unsafe_compute_mask_ptr(buf.data_ptr(), buf.numel() * 4)
        times.append(time.thread_time() - t0)
        if not (int(buf[t // 32]) >> (t % 32)) & 1 or not m.consume_token(t):
            return t_tok, t_comp, times, f"refused token {t}"
    return t_tok, t_comp, times, "ok" if m.is_accepting() else "not accepting at end"


def bench_xgrammar(tok, toks, special, walk):
    import xgrammar as xgr

    enc = [b"" if i in set(special) else b for i, b in enumerate(toks)]
    def build():
        info = xgr.TokenizerInfo(enc, xgr.VocabType.RAW, vocab_size=tok.vocab_size, stop_token_ids=sorted(tok.eog_ids))
        return xgr.GrammarCompiler(info, max_threads=2, cache_enabled=False)

    comp, t_tok = timed(build)
    cg, t_comp = timed(lambda: comp.compile_json_schema(json.dumps(SCHEMA), any_whitespace=False))
    m = xgr.GrammarMatcher(cg)
    buf = xgr.allocate_token_bitmask(1, tok.vocab_size)
    times = []
    for t in walk:
        t0 = time.thread_time()
        m.fill_next_token_bitmask(buf)
        times.append(time.thread_time() - t0)
        if not m.accept_token(t):
            return t_tok, t_comp, times, f"refused token {t}"
    return t_tok, t_comp, times, "ok"


def bench_outlines(tok, toks, special, walk):
    from outlines_core import Guide, Index, Vocabulary
    from outlines_core.json_schema import build_regex_from_schema

    eos = sorted(tok.eog_ids)[0]
    sp = set(special) | set(tok.eog_ids)

    def build():
        mapping: dict[bytes, list[int]] = {}
        for i, b in enumerate(toks):
            if i not in sp and b:
                mapping.setdefault(b, []).append(i)
        return Vocabulary(eos, mapping)

    voc, t_tok = timed(build)
    regex = build_regex_from_schema(json.dumps(SCHEMA), r"[ ]?")
    index, t_comp = timed(lambda: Index(regex, voc))
    g = Guide(index)
    buf = torch.zeros((tok.vocab_size + 31) // 32, dtype=torch.int32)
    times = []
    for t in walk:
        t0 = time.thread_time()
        g.write_mask_into(buf.data_ptr(), buf.numel(), 4)
        times.append(time.thread_time() - t0)
        try:
            g.advance(t)
        except Exception as exc:  # noqa: BLE001 - reported as the engine's refusal
            return t_tok, t_comp, times, f"refused token {t}: {exc}"
    return t_tok, t_comp, times, "ok"


def main(paths: list[str]) -> None:
    text = json.dumps(INSTANCE)
    print("| model | vocab | engine | tokenizer build s | schema compile s | first mask ms | mask ms/token median / mean / max | walk |")
    print("|---|---:|---|---:|---:|---:|---:|---|")
    for path in paths:
        tok = Tokenizer.from_gguf(GGUFFile(path))
        (toks, special), t_bytes = timed(lambda: vocab_bytes(tok))
        walk = tok.encode(text, add_special=False, parse_special=False)
        name = path.rsplit("/", 1)[-1].removesuffix(".gguf")
        for engine, fn in (("llguidance", bench_llguidance), ("xgrammar", bench_xgrammar), ("outlines-core", bench_outlines)):
            try:
                t_tok, t_comp, times, status = fn(tok, toks, special, walk)
            except Exception as exc:  # noqa: BLE001 - one engine failing must not hide the others
                print(f"| {name} | {tok.vocab_size} | {engine} | - | - | - | error: {type(exc).__name__}: {exc} |")
                continue
            ms = [x * 1000 for x in times]
            rest = ms[1:]  # the first mask may include work an engine defers from compile time
            print(f"| {name} | {tok.vocab_size} | {engine} | {t_tok + t_bytes:.2f} | {t_comp:.3f} | {ms[0]:.2f} | "
                  f"{statistics.median(rest):.3f} / {statistics.mean(rest):.3f} / {max(rest):.3f} | {status}, {len(walk)} tokens |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or [f"/root/models/{n}.gguf" for n in ("smollm2-135m", "gemma3-270m", "qwen2.5-coder-1.5b-instruct")])

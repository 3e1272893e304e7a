#!/usr/bin/env python3
"""Gemma 4 tokenizer load and encode, each fast path beside what it replaced, in one run.

Usage: xz -dk shared/vocab/ggml-vocab-gemma-4.gguf.xz -c > /tmp/g4.gguf
       python scripts/gemma4_tokenizer_speed.py /tmp/g4.gguf     (from the repository root)

1. the GGUF header's string arrays read in one tight loop (gguf_file._Cursor.string_array)
   against one generic value() call per string, as before;
2. one long line encoded cut at safe "▁" boundaries (bpe.BpeTokenizer._safe_boundaries) against
   merging the whole line at once, as llama.cpp does; the ids are the same (tests check it).
Medians of 3, cold word cache.
"""
import random, statistics, sys, time
sys.path.insert(0, '.')
from tallow import gguf_file
from tallow.gguf_file import GGUFFile
from tallow.tokenizer import Tokenizer

path = sys.argv[1]
fast = gguf_file._Cursor.string_array
def per_item(self, count):  # the generic path before: one value() call per string
    return [self.string() for _ in range(count)]
def med(f, n=3):
    ts = []
    for _ in range(n):
        t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
    return statistics.median(ts)
gguf_file._Cursor.string_array = per_item
slow_s = med(lambda: GGUFFile(path))
gguf_file._Cursor.string_array = fast
fast_s = med(lambda: GGUFFile(path))
print(f"header (262k tokens + 515k merges): per-item {slow_s:.2f} s, tight loop {fast_s:.2f} s")
tok = Tokenizer.from_gguf(GGUFFile(path))
words = open('README.md').read().split()
random.seed(1)
text = ' '.join(random.choice(words) for _ in range(4000))
bpe = tok._bpe
boundary = bpe._chunk_boundary
def cold(b):
    bpe._chunk_boundary = b; bpe._cache.clear(); tok.encode(text)
whole = med(lambda: cold(None)); chunked = med(lambda: cold(boundary))
n = len(tok.encode(text))
print(f"one {len(text)}-char line, {n} tokens, cold cache: whole line {whole*1e3:.0f} ms, cut at safe boundaries {chunked*1e3:.0f} ms")

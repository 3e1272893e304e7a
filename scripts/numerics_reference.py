"""llama.cpp b11434 as a reference on this machine (dev only; issue 14).

llama-cpp-python 0.3.36's own libggml-cpu dies of SIGILL on quantized products on the AMD
development machine, but its ctypes bindings match b11434's include/llama.h (llama_context_params
and llama_model_params field for field, checked), so this module loads them over b11434's
libraries built for this machine (../shared/llama.cpp/llama-b11434-cpu.tar.xz, unpacked to
$LLAMA_DIR, default /tmp/llama): the libraries are opened by absolute path first, so the bindings'
own `LLAMA_CPP_LIB_PATH` lookup and every NEEDED entry resolve to them by soname.

One configuration, the one the conformance fixtures and TALLOW_NUMERICS=ggml share
(CONFIG below): flash attention off, f16 K/V, no weight repacking (use_extra_bufts off: every
quantized product is ggml's plain vec_dot_* per row, the arithmetic a mirror can reproduce; the
repacked gemv/gemm kernels sum in another order), 2 threads, n_batch = n_ubatch = 512.

    from numerics_reference import Reference
    ref = Reference(path)                          # model + context in CONFIG
    logits = ref.logits(ids)                       # (n, vocab) float32, teacher-forced
    logits, tensors = ref.logits(ids, capture=["attn_norm-0", "Qcur-0"])  # + intermediate tensors
    ids, gaps = ref.greedy(prompt_ids, 64)         # greedy continuation with its top-2 gaps

Intermediate tensors come from the eval callback (cb_eval) by their graph names (`attn_norm-0`,
`Qcur-0`, `kq-0`, `ffn_out-0`, `l_out-0`, …; `capture=True` takes every F32/F16 tensor), as numpy
arrays in ggml's axis order reversed (ne[3], ne[2], ne[1], ne[0]), unit ne[3]/ne[2] dropped.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import numpy as np

LLAMA_DIR = Path(os.environ.get("LLAMA_DIR", "/tmp/llama"))
CONFIG = {"flash_attn": False, "type_kv": "f16", "repack": False, "n_threads": 2, "n_batch": 512, "n_ubatch": 512,
          "n_ctx": 2048}


def _load_libraries():
    for name in ("libggml-base.so.0", "libggml-cpu.so.0", "libggml.so.0", "libllama.so.0"):
        if not (LLAMA_DIR / name).exists():
            raise SystemExit(f"{LLAMA_DIR / name} is missing: mkdir -p {LLAMA_DIR} && tar xJf "
                             "../shared/llama.cpp/llama-b11434-cpu.tar.xz -C " + str(LLAMA_DIR))
        ctypes.CDLL(str(LLAMA_DIR / name), mode=ctypes.RTLD_GLOBAL)
    # The bindings look for lib<name>.so (no version suffix) in LLAMA_CPP_LIB_PATH.
    # (One links folder per LLAMA_DIR: links kept from another build would load its libllama beside these.)
    links = Path(os.environ.get("TMPDIR", "/tmp")) / ("llama-b11434-links-" + str(LLAMA_DIR.resolve()).strip("/").replace("/", "_"))
    links.mkdir(exist_ok=True)
    for lib in LLAMA_DIR.glob("lib*.so.0"):
        link = links / lib.name[: -len(".0")]
        if link.is_symlink() and link.resolve() != lib.resolve():
            link.unlink()
        if not link.exists():
            link.symlink_to(lib)
    os.environ["LLAMA_CPP_LIB_PATH"] = str(links)
    import llama_cpp.llama_cpp as lc

    return lc


lc = _load_libraries()
_GGML_F32, _GGML_F16 = 0, 1


class _Tensor(ctypes.Structure):  # struct ggml_tensor (ggml.h: GGML_MAX_DIMS 4, MAX_OP_PARAMS 64, MAX_SRC 10, MAX_NAME 64)
    _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4),
                ("nb", ctypes.c_size_t * 4), ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16),
                ("flags", ctypes.c_int32), ("src", ctypes.c_void_p * 10), ("view_src", ctypes.c_void_p),
                ("view_offs", ctypes.c_size_t), ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64),
                ("extra", ctypes.c_void_p), ("padding", ctypes.c_char * 8)]


def _read(t: _Tensor) -> np.ndarray:
    dtype = np.float32 if t.type == _GGML_F32 else np.float16
    ne, nb = list(t.ne), list(t.nb)
    extent = sum((n - 1) * s for n, s in zip(ne, nb)) + np.dtype(dtype).itemsize
    raw = np.frombuffer(ctypes.string_at(t.data, extent), dtype=np.uint8)
    view = np.lib.stride_tricks.as_strided(raw, shape=ne[::-1] + [np.dtype(dtype).itemsize],
                                           strides=nb[::-1] + [1])
    out = np.ascontiguousarray(view).view(dtype)[..., 0]
    while out.ndim > 2 and out.shape[0] == 1:  # drop unit ne[3], ne[2]; keep (rows, ne[0]) even for one row
        out = out[0]
    return out


class Reference:
    """One model and one context of llama.cpp b11434 in CONFIG."""

    def __init__(self, path: str | Path, n_ctx: int = CONFIG["n_ctx"]):
        lc.llama_backend_init()
        self._quiet = lc.llama_log_callback(lambda level, text, user: None)  # kept: C holds the pointer
        lc.llama_log_set(self._quiet, None)
        mp = lc.llama_model_default_params()
        mp.n_gpu_layers = 0
        mp.use_extra_bufts = CONFIG["repack"]
        self.model = lc.llama_model_load_from_file(str(path).encode(), mp)
        if not self.model:
            raise SystemExit(f"llama.cpp could not load {path}")
        self.vocab = lc.llama_model_get_vocab(self.model)
        self.n_vocab = lc.llama_vocab_n_tokens(self.vocab)
        self.n_ctx = n_ctx
        self._want: set[str] | bool = set()
        self._store: dict[str, list[np.ndarray]] = {}
        self._callback = lc.ggml_backend_sched_eval_callback(self._on_tensor)
        self.ctx = None
        self._new_context()

    def _new_context(self):
        if self.ctx:
            lc.llama_free(self.ctx)
        cp = lc.llama_context_default_params()
        cp.n_ctx = self.n_ctx
        cp.n_batch = CONFIG["n_batch"]
        cp.n_ubatch = CONFIG["n_ubatch"]
        cp.n_threads = cp.n_threads_batch = CONFIG["n_threads"]
        cp.flash_attn_type = lc.LLAMA_FLASH_ATTN_TYPE_DISABLED if not CONFIG["flash_attn"] else lc.LLAMA_FLASH_ATTN_TYPE_ENABLED
        cp.type_k = cp.type_v = _GGML_F16
        cp.cb_eval = self._callback
        cp.cb_eval_user_data = None
        self.ctx = lc.llama_init_from_model(self.model, cp)
        if not self.ctx:
            raise SystemExit("llama.cpp could not create a context")

    def _on_tensor(self, t, ask, _user):
        g = _Tensor.from_address(t)
        name = g.name.decode(errors="replace")
        wanted = g.type in (_GGML_F32, _GGML_F16) and (self._want is True or name in self._want)
        if ask:
            return wanted
        if wanted:
            self._store.setdefault(name, []).append(_read(g))
        return True

    # -- tokens ------------------------------------------------------------------------------
    def tokenize(self, text: str, add_bos: bool = True, special: bool = True) -> list[int]:
        data = text.encode()
        buf = (lc.llama_token * (len(data) + 16))()
        n = lc.llama_tokenize(self.vocab, data, len(data), buf, len(buf), add_bos, special)
        if n < 0:
            raise ValueError("tokenize: buffer too small")
        return list(buf[:n])

    def detokenize(self, ids: list[int]) -> str:
        buf = ctypes.create_string_buffer(16 * len(ids) + 64)
        arr = (lc.llama_token * len(ids))(*ids)
        n = lc.llama_detokenize(self.vocab, arr, len(ids), buf, len(buf), False, False)
        return buf.raw[: max(n, 0)].decode("utf-8", errors="replace")

    def is_eog(self, tok: int) -> bool:
        return bool(lc.llama_vocab_is_eog(self.vocab, tok))

    def add_bos(self) -> bool:
        return bool(lc.llama_vocab_get_add_bos(self.vocab))

    # -- evaluation --------------------------------------------------------------------------
    def reset(self):
        lc.llama_memory_clear(lc.llama_get_memory(self.ctx), True)

    def _decode(self, ids: list[int], start: int, all_logits: bool) -> np.ndarray:
        """ids at positions start.. in batches of n_batch; logits of every row (all_logits) or the last."""
        rows = []
        for s in range(0, len(ids), CONFIG["n_batch"]):
            part = ids[s : s + CONFIG["n_batch"]]
            batch = lc.llama_batch_init(len(part), 0, 1)
            try:
                batch.n_tokens = len(part)
                for i, tok in enumerate(part):
                    batch.token[i] = tok
                    batch.pos[i] = start + s + i
                    batch.n_seq_id[i] = 1
                    batch.seq_id[i][0] = 0
                    batch.logits[i] = all_logits or (s + i == len(ids) - 1)
                if lc.llama_decode(self.ctx, batch) != 0:
                    raise RuntimeError("llama_decode failed")
            finally:
                lc.llama_batch_free(batch)
            if all_logits:
                ptr = lc.llama_get_logits(self.ctx)
                rows.append(np.ctypeslib.as_array(ptr, shape=(len(part), self.n_vocab)).copy())
        if not all_logits:
            rows.append(np.ctypeslib.as_array(lc.llama_get_logits_ith(self.ctx, -1), shape=(1, self.n_vocab)).copy())
        return np.concatenate(rows)

    def logits(self, ids: list[int], capture=None, start: int = 0, reset: bool = True):
        """Teacher-forced logits (n, vocab) of ids at positions start..; with capture (a list of
        tensor names, or True for all), also {name: [array per graph evaluation]}."""
        if reset:
            self.reset()
        self._want = capture if capture is True else set(capture or ())
        self._store = {}
        try:
            out = self._decode(ids, start, all_logits=True)
        finally:
            self._want = set()
        return (out, self._store) if capture else out

    def greedy(self, prompt_ids: list[int], n: int) -> tuple[list[int], list[float]]:
        """Greedy continuation (stops after an end-of-generation token, which it includes) and
        llama.cpp's top-2 logit gap at every step."""
        self.reset()
        row = self._decode(prompt_ids, 0, all_logits=False)[-1]
        out, gaps, pos = [], [], len(prompt_ids)
        for _ in range(n):
            tok = int(row.argmax())
            top2 = np.partition(row, -2)[-2:]
            gaps.append(round(float(abs(top2[1] - top2[0])), 5))
            out.append(tok)
            if self.is_eog(tok):
                break
            row = self._decode([tok], pos, all_logits=False)[-1]
            pos += 1
        return out, gaps

    def close(self):
        if self.ctx:
            lc.llama_free(self.ctx)
            self.ctx = None
        if self.model:
            lc.llama_model_free(self.model)
            self.model = None

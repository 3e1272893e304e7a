"""Persistent KV per conversation: a turn's K/V saved to disk, hydrated at the next turn — even
after a restart — so a long conversation never re-prefills what it already computed.

One file per conversation under `$TALLOW_HOME/kv/`, named by a hash of the conversation id:

    magic  b"TALLOWKV"  | u32 version | u32 header length | header (JSON, utf-8)
    tokens int32 × n    | per layer: K (n_kv_heads, n, head_dim) then V (n_kv_heads, n, v_head_dim), f16
    sha256 of everything above (32 bytes)

The header carries the model fingerprint (sha256 of the GGUF header and tensor table), the KV
dtype and the per-layer layout; only the n used positions are stored. Why so strict: loading
K/V computed by another model, or half-written, would silently produce wrong text. So a file
is used only if its magic, version, fingerprint, layout, size and checksum all agree; anything
else is ignored with a warning. Writes go to a temporary file that is fsynced and renamed over
the old one, so a crash leaves the old file or the new one, never a mix.

A byte bound (LRU by modification time, refreshed on every load) keeps the folder small.
`TALLOW_PERSIST_KV=0` turns the store off.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import warnings
from pathlib import Path

import numpy as np
import torch

from ..spec import ModelSpec
from .kv_pool import KVPool

MAGIC = b"TALLOWKV"
VERSION = 1
DEFAULT_MAX_BYTES = 2 << 30
_DTYPES = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32"}


def persist_enabled() -> bool:
    return os.environ.get("TALLOW_PERSIST_KV", "1").strip().lower() not in ("0", "false", "no", "off")


def default_dir() -> Path:
    from ..registry import home_dir

    return home_dir() / "kv"


def model_fingerprint(header_bytes: bytes) -> str:
    """sha256 of the GGUF header and tensor table: changes whenever the weights could differ."""
    return hashlib.sha256(header_bytes).hexdigest()


def _layout(spec: ModelSpec) -> list[list[int]]:
    return [[layer.n_kv_heads, spec.head_dim, spec.v_head_dim] for layer in spec.layers]


class KVStoreWarning(UserWarning):
    """A cache file was ignored (corrupt, truncated, foreign model): generation goes on without it."""


class KVStore:
    """Saves and hydrates the KV pool of one model, one file per conversation id."""

    def __init__(self, spec: ModelSpec, fingerprint: str, directory: str | os.PathLike | None = None,
                 max_bytes: int | None = None):
        self.spec = spec
        self.fingerprint = fingerprint
        self.dir = Path(directory) if directory is not None else default_dir()
        env = os.environ.get("TALLOW_KV_STORE_BYTES")
        self.max_bytes = max_bytes if max_bytes is not None else int(env) if env else DEFAULT_MAX_BYTES

    def path(self, conversation_id: str) -> Path:
        """File of a conversation: the id is hashed, so any string is a safe file name."""
        if not isinstance(conversation_id, str) or not conversation_id:
            raise ValueError(f"a conversation id must be a non-empty string, not {conversation_id!r}")
        return self.dir / (hashlib.sha256(conversation_id.encode()).hexdigest()[:32] + ".kv")

    # -- saving --------------------------------------------------------------------------
    def save(self, conversation_id: str, kv: KVPool) -> Path | None:
        """Write the pool's used positions atomically; returns the path (None when nothing to save)."""
        n = len(kv.tokens)
        if n == 0:
            return None
        target = self.path(conversation_id)
        self.dir.mkdir(parents=True, exist_ok=True)
        header = json.dumps({
            "fingerprint": self.fingerprint,
            "dtype": _DTYPES[kv.dtype],
            "layout": _layout(self.spec),
            "order": "tokens int32; per layer K (n_kv_heads, n, head_dim) then V (n_kv_heads, n, v_head_dim)",
            "n_tokens": n,
            "conversation_id": conversation_id,
        }).encode()
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        digest = hashlib.sha256()
        try:
            with open(tmp, "wb") as f:
                def put(data: bytes | memoryview) -> None:
                    digest.update(data)
                    f.write(data)

                put(MAGIC + struct.pack("<II", VERSION, len(header)) + header)
                put(np.asarray(kv.tokens, dtype=np.int32).tobytes())
                for layer in range(len(kv.k)):
                    self._write_layer(put, kv, layer, n)
                f.write(digest.digest())
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)  # atomic: readers see the old file or the new one
        finally:
            if tmp.exists():
                tmp.unlink()
        _fsync_dir(self.dir)
        self.evict()
        return target

    @staticmethod
    def _write_layer(put, kv: KVPool, layer: int, n: int) -> None:
        # One layer staged at a time: the budget counts exactly this buffer (prefix_cache_bytes).
        for t in (kv.k[layer], kv.v[layer]):
            put(memoryview(t[:, :n].contiguous().view(torch.uint8).numpy()).cast("B"))

    # -- loading -------------------------------------------------------------------------
    def peek_tokens(self, conversation_id: str) -> list[int]:
        """The token ids a conversation's file holds (header only; `load` verifies the rest)."""
        path = self.path(conversation_id)
        try:
            with open(path, "rb") as f:
                head = f.read(16)
                if len(head) < 16 or head[:8] != MAGIC:
                    return []
                _, header_len = struct.unpack("<II", head[8:])
                header = json.loads(f.read(header_len))
                if header.get("fingerprint") != self.fingerprint:
                    return []
                n = int(header["n_tokens"])
                return np.frombuffer(f.read(4 * n), dtype=np.int32).tolist()
        except (OSError, ValueError, KeyError, struct.error):
            return []

    def load(self, conversation_id: str, kv: KVPool) -> int:
        """Hydrate the pool from the conversation's file; returns the number of tokens loaded.

        Returns 0 (and warns, unless the file is simply absent) when the file cannot be trusted;
        the pool's token list is then empty, so nothing it holds is ever reused.
        """
        path = self.path(conversation_id)
        if not path.exists():
            return 0
        try:
            n = self._load(path, kv)
        except (OSError, ValueError, KeyError, struct.error, json.JSONDecodeError) as exc:
            kv.truncate(0)
            warnings.warn(f"ignoring the KV cache file {path}: {exc}", KVStoreWarning, stacklevel=3)
            return 0
        os.utime(path)  # most recently used
        return n

    def _load(self, path: Path, kv: KVPool) -> int:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(16)
            if len(head) < 16 or head[:8] != MAGIC:
                raise ValueError("not a tallow KV file (wrong magic or truncated)")
            version, header_len = struct.unpack("<II", head[8:])
            if version != VERSION:
                raise ValueError(f"format version {version}, this tallow reads {VERSION}")
            raw_header = f.read(header_len)
            header = json.loads(raw_header)
            if header["fingerprint"] != self.fingerprint:
                raise ValueError("it was written by another model (fingerprint mismatch)")
            if header["dtype"] != _DTYPES[kv.dtype] or header["layout"] != _layout(self.spec):
                raise ValueError("its KV dtype or layout differs from this pool's")
            n = int(header["n_tokens"])
            if not 0 < n <= kv.n_ctx:
                raise ValueError(f"it holds {n} tokens, the context holds {kv.n_ctx}")
            item = kv.k[0].element_size()
            body = 4 * n + n * item * sum(h * (kd + vd) for h, kd, vd in header["layout"])
            if size != 16 + header_len + body + 32:
                raise ValueError(f"it is {size} bytes, its header promises {16 + header_len + body + 32} (truncated?)")
            digest = hashlib.sha256(head + raw_header)
            raw_tokens = f.read(4 * n)
            digest.update(raw_tokens)
            kv.truncate(0)  # from here on the pool's positions are being overwritten
            for layer in range(len(kv.k)):
                for t in (kv.k[layer], kv.v[layer]):
                    heads, _, dim = t.shape
                    raw = f.read(heads * n * dim * item)
                    digest.update(raw)
                    block = torch.frombuffer(bytearray(raw), dtype=kv.dtype).view(heads, n, dim)
                    t[:, :n] = block
            if f.read(32) != digest.digest():
                raise ValueError("its checksum does not match (corrupt)")
        kv.tokens.extend(np.frombuffer(raw_tokens, dtype=np.int32).tolist())  # only now is it reusable
        return n

    # -- bounding ------------------------------------------------------------------------
    def evict(self) -> list[Path]:
        """Delete least recently used files until the folder holds at most max_bytes."""
        try:
            files = [(p.stat().st_mtime, p.stat().st_size, p) for p in self.dir.glob("*.kv")]
        except OSError:
            return []
        files.sort()
        total = sum(size for _, size, _ in files)
        removed = []
        for _, size, p in files:
            if total <= self.max_bytes:
                break
            try:
                p.unlink()
            except FileNotFoundError:
                pass
            total -= size
            removed.append(p)
        return removed

    def delete(self, conversation_id: str) -> None:
        try:
            self.path(conversation_id).unlink()
        except FileNotFoundError:
            pass


def _fsync_dir(directory: Path) -> None:
    """Make the rename itself durable (POSIX needs the directory entry flushed too)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)

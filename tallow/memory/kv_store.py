"""Persistent KV per conversation: a turn's K/V saved to disk, hydrated at the next turn — even
after a restart — so a long conversation never re-prefills what it already computed.

One file per conversation under `$TALLOW_HOME/kv/`, named by a hash of the conversation id:

    magic  b"TALLOWKV"  | u32 version | u32 header length | header (JSON, utf-8)
    tokens int32 × n    | per layer, for its stored positions lo..n-1 in position order:
                          K (n_kv_heads, m, head_dim), V (n_kv_heads, m, v_head_dim) in the
                          pool's storage dtype, then for int8/fp8 the K and V scales
                          (n_kv_heads, m) float32
                        | a recurrent memory's states (memory/recurrent.py): per saved position
                          (header "states"), each layer's conv and SSM state, float32
    sha256 of everything above (32 bytes)

The header carries the model fingerprint (sha256 of the GGUF header and tensor table), the KV
dtype and the per-layer layout (heads, dims and slots: a sliding-window ring holds fewer slots
than the context); only used positions are stored. It also says how many leading positions
are canonical (bit for bit a cold prefill's K/V, engine/prefill_plan.py) and under which
numerics (device, kernels, switches): a restored prefix is reused only that far, and only where
the numerics agree, so an answer is the same whether its prefix came from disk or from nowhere. A global layer stores positions 0..n-1; a
ring stores the positions it still holds (at most its slots, `lo` per layer in the header), and
the hydrated ring remembers that nothing before lo is there, so the engine never reuses a
shorter prefix whose window would reach before it (KVPool.reusable). Version 1 files (f16, no
rings) are refused like any other mismatch. Why so strict: loading
K/V computed by another model, or half-written, would silently produce wrong text. So a file
is used only if its magic, version, fingerprint, layout, size and checksum all agree; anything
else is ignored with a warning. Writes go to a temporary file that is fsynced and renamed over
the old one, so a crash leaves the old file or the new one, never a mix; a `kill -9` mid-write leaves
the temporary file, which the next save of any process removes once its writer is dead. A save
that fails (full disk, unwritable folder) warns once and the answer goes on; while saves keep
failing the same way nothing more is logged (tests/test_faults.py injects each of these).

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
from ..durable import fsync_dir, pid_alive
from .. import switches

MAGIC = b"TALLOWKV"
VERSION = 2


def persist_enabled() -> bool:
    return switches.enabled("TALLOW_PERSIST_KV")


def default_dir() -> Path:
    from ..registry import home_dir

    return home_dir() / "kv"


def model_fingerprint(header_bytes: bytes) -> str:
    """sha256 of the GGUF header and tensor table: changes whenever the weights could differ."""
    return hashlib.sha256(header_bytes).hexdigest()


def _layout(spec: ModelSpec, kv: KVPool) -> list[list[int]]:
    """Per layer [KV heads, K dim, V dim, slots]; a shared-KV layer (gemma4), which stores
    nothing of its own, [0, 0, 0, the layer whose cache it reads]."""
    return [[layer.n_kv_heads, layer.head_dim, layer.v_head_dim, cap] if layer.owns_kv else [0, 0, 0, layer.kv_source]
            for layer, cap in zip(spec.layers, kv.caps)]


def _stored_from(kv: KVPool) -> list[int]:
    """Per layer, the first position a save stores: 0 for a global layer, the oldest position a
    ring still holds (it forgot what came before) for a sliding-window one."""
    n = len(kv.tokens)
    high = max(kv._high, n - 1)
    return [n if not kv.owns(i) else 0 if cap >= kv.n_ctx else max(0, kv._intact_from[i], high - cap + 1, n - cap)
            for i, cap in enumerate(kv.caps)]  # a shared-KV layer stores nothing: from n


MAX_HEADER_BYTES = 1 << 20  # a real header is a few KB; a bigger length is a corrupt file
MAX_ID_IN_HEADER = 256
# What reading an untrusted file can raise; each means "ignore it, with a warning".
UNTRUSTED = (OSError, ValueError, KeyError, TypeError, struct.error, UnicodeDecodeError, OverflowError)

# The header's fields and the JSON types they must have before anything uses them: a file with
# valid JSON but `"lo": null` or a list for a header made every later turn a 500.
_HEADER_TYPES = {"fingerprint": str, "dtype": str, "layout": list, "n_tokens": int, "lo": list}


def _read_header(f, fingerprint: str) -> tuple[dict, bytes, bytes]:
    """(header, the 16 leading bytes, the raw header) of an open file, every field type-checked;
    ValueError when the file is not a KV file of this model."""
    head = f.read(16)
    if len(head) < 16 or head[:8] != MAGIC:
        raise ValueError("not a tallow KV file (wrong magic or truncated)")
    version, header_len = struct.unpack("<II", head[8:])
    if version != VERSION:
        raise ValueError(f"format version {version}, this tallow reads {VERSION}")
    if header_len > MAX_HEADER_BYTES:
        raise ValueError(f"its header claims {header_len} bytes (corrupt)")
    raw_header = f.read(header_len)
    header = json.loads(raw_header)
    if not isinstance(header, dict):
        raise ValueError("its header is not a JSON object")
    for key, kind in _HEADER_TYPES.items():
        value = header.get(key)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise ValueError(f"its header field {key!r} is {type(value).__name__}, not {kind.__name__}")
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in header["lo"]):
        raise ValueError("its header field 'lo' holds something other than integers")
    if not all(isinstance(row, list) and len(row) == 4 and all(isinstance(x, int) and not isinstance(x, bool) for x in row) for row in header["layout"]):
        raise ValueError("its header field 'layout' is not a list of 4 integers per layer")
    if header["fingerprint"] != fingerprint:
        raise ValueError("it was written by another model (fingerprint mismatch)")
    return header, head, raw_header


def _state_header(kv: KVPool) -> dict:
    """A recurrent memory's header fields: the positions of the states saved (the live one at the
    end of the tokens, and the checkpoints) and each state's tensor shapes; nothing for a KVPool."""
    if getattr(kv, "state", None) is None:
        return {}
    return {"states": kv.saved_positions(), "state_layout": [list(t.shape) for t in kv.state.tensors()]}


def _state_tensors(kv: KVPool) -> list:
    if getattr(kv, "state", None) is None:
        return []
    return [t for saved in kv.saved_states() for t in saved]


def _check_states(header: dict, kv: KVPool, n: int) -> list[int]:
    """The saved state positions of a file, checked against this memory (none for a KVPool)."""
    if getattr(kv, "state", None) is None:
        if header.get("states"):
            raise ValueError("it holds recurrent states, this model has none")
        return []
    positions = header.get("states")
    if header.get("state_layout") != [list(t.shape) for t in kv.state.tensors()]:
        raise ValueError("its recurrent state layout differs from this model's")
    if (not isinstance(positions, list) or not positions or len(positions) > 64
            or not all(isinstance(p, int) and not isinstance(p, bool) and 0 < p <= n for p in positions)
            or len(set(positions)) != len(positions)):
        raise ValueError("its recurrent state positions are not distinct positions within its tokens")
    return positions


class KVStoreWarning(UserWarning):
    """A cache file was ignored (corrupt, truncated, foreign model): generation goes on without it."""


class KVStore:
    """Saves and hydrates the KV pool of one model, one file per conversation id."""

    def __init__(self, spec: ModelSpec, fingerprint: str, directory: str | os.PathLike | None = None,
                 max_bytes: int | None = None):
        self.spec = spec
        self.fingerprint = fingerprint
        self.dir = Path(directory) if directory is not None else default_dir()
        self.max_bytes = max_bytes if max_bytes is not None else switches.value("TALLOW_KV_STORE_BYTES")
        self.numerics = ""  # the engine's numerics key: a file's canonical prefix counts only under the same one
        self._failing: str | None = None  # the error of the last failed save, until one succeeds

    def path(self, conversation_id: str) -> Path:
        """File of a conversation: the id is hashed, so any string is a safe file name."""
        if not isinstance(conversation_id, str) or not conversation_id:
            raise ValueError(f"a conversation id must be a non-empty string, not {conversation_id!r:.80}")
        # surrogatepass: any Python str hashes (the server refuses lone surrogates earlier).
        return self.dir / (hashlib.sha256(conversation_id.encode("utf-8", "surrogatepass")).hexdigest()[:32] + ".kv")

    # -- saving --------------------------------------------------------------------------
    def try_save(self, conversation_id: str, kv: KVPool) -> bool:
        """save(), but a failure (full disk, unwritable folder) is a warning, not an error: the
        answer was already given. Warns once per kind of failure, not once per turn."""
        try:
            self.save(conversation_id, kv)
        except OSError as exc:
            reason = f"{type(exc).__name__}: {exc.strerror or exc}"
            if reason != self._failing:
                warnings.warn(f"could not save the KV cache of conversation {conversation_id!r} in {self.dir} ({reason}); "
                              "answers go on, without it for the next turn", KVStoreWarning, stacklevel=3)
            self._failing = reason
            return False
        self._failing = None
        return True

    def save(self, conversation_id: str, kv: KVPool) -> Path | None:
        """Write the pool's used positions atomically; returns the path (None when nothing to save)."""
        n = len(kv.tokens)
        if n == 0:
            return None
        target = self.path(conversation_id)
        self.dir.mkdir(parents=True, exist_ok=True)
        lo = _stored_from(kv)
        header = json.dumps({
            "fingerprint": self.fingerprint,
            "dtype": kv.kv_dtype,
            "layout": _layout(self.spec, kv),
            "order": "tokens int32; per layer, positions lo..n-1: K, V (n_kv_heads, m, dim), then K and V scales (n_kv_heads, m) f32 if int8/fp8",
            "n_tokens": n,
            "n_ctx": kv.n_ctx,
            "lo": lo,
            "canonical": kv.canonical,
            "numerics": self.numerics,
            **_state_header(kv),
            "conversation_id": conversation_id[:MAX_ID_IN_HEADER],  # for a person reading the file; the name is the hash
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
                for layer in kv.owners:
                    self._write_layer(put, kv, layer, lo[layer], n)
                for t in _state_tensors(kv):  # a recurrent memory's states (memory/recurrent.py), fixed size
                    put(memoryview(t.contiguous().cpu().view(torch.uint8).numpy()).cast("B"))
                f.write(digest.digest())
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)  # atomic: readers see the old file or the new one
        finally:
            if tmp.exists():
                tmp.unlink()
        fsync_dir(self.dir)
        self.evict()
        return target

    @staticmethod
    def _write_layer(put, kv: KVPool, layer: int, lo: int, n: int) -> None:
        # One layer staged at a time: the budget counts exactly this buffer (prefix_cache_bytes).
        for t in kv.layer_tensors(layer):
            parts = [t[:, a:b] for a, b in kv._spans(layer, lo, n)] if n > lo else [t[:, :0]]
            block = (parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)).contiguous().cpu()
            put(memoryview(block.view(torch.uint8).numpy()).cast("B"))

    # -- loading -------------------------------------------------------------------------
    def peek_tokens(self, conversation_id: str) -> list[int]:
        """The token ids a conversation's file holds (header only; `load` verifies the rest)."""
        return self.peek(conversation_id)[0]

    def peek(self, conversation_id: str) -> tuple[list[int], int]:
        """The token ids a conversation's file holds and how many of them are canonical here
        (`_canonical`); header only, `load` verifies the rest. An absent file is ([], 0); an
        untrusted one is ([], 0) with a KVStoreWarning (it is then replaced by the turn's save)."""
        path = self.path(conversation_id)
        try:
            with open(path, "rb") as f:
                header, _, _ = _read_header(f, self.fingerprint)
                n = header["n_tokens"]
                raw = f.read(4 * n)
                if len(raw) != 4 * n:
                    raise ValueError("it is truncated inside its token list")
                return np.frombuffer(raw, dtype=np.int32).tolist(), self._canonical(header, n)
        except (FileNotFoundError, NotADirectoryError):  # no file (or no folder) to read: nothing to warn about
            return [], 0
        except UNTRUSTED as exc:
            warnings.warn(f"ignoring the KV cache file {path}: {exc}", KVStoreWarning, stacklevel=3)
            return [], 0

    def _canonical(self, header: dict, n: int) -> int:
        """How many leading positions of a file with this header hold cold-prefill K/V as this
        engine computes them: its count where the numerics agree, else none."""
        count = header.get("canonical", 0)
        if not self.numerics or header.get("numerics") != self.numerics or not isinstance(count, int) or isinstance(count, bool):
            return 0
        return max(0, min(count, n))

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
        except UNTRUSTED as exc:
            kv.truncate(0)
            warnings.warn(f"ignoring the KV cache file {path}: {exc}", KVStoreWarning, stacklevel=3)
            return 0
        os.utime(path)  # most recently used
        return n

    def _load(self, path: Path, kv: KVPool) -> int:
        size = path.stat().st_size
        with open(path, "rb") as f:
            header, head, raw_header = _read_header(f, self.fingerprint)
            header_len = len(raw_header)
            if header["dtype"] != kv.kv_dtype:
                raise ValueError(f"its KV dtype is {header['dtype']}, this pool's is {kv.kv_dtype}")
            if header["layout"] != _layout(self.spec, kv):
                raise ValueError("its KV layout (heads, dimensions or ring slots) differs from this pool's")
            n = header["n_tokens"]
            if not 0 < n <= kv.n_ctx:
                raise ValueError(f"it holds {n} tokens, the context holds {kv.n_ctx}")
            lo = header["lo"]
            owners = kv.owners
            if len(lo) != len(kv.caps) or any(not 0 <= a <= n or n - a > cap or (a and cap >= kv.n_ctx)
                                              for i, (a, cap) in enumerate(zip(lo, kv.caps)) if i in owners):
                raise ValueError("its stored position ranges do not fit this pool")
            item = kv.format.torch_dtype.itemsize  # (a mamba memory has no K/V tensors to ask)
            scale_bytes = 2 * kv.format.scale_bytes  # K's and V's
            layout = header["layout"]
            body = 4 * n + sum((n - lo[i]) * layout[i][0] * ((layout[i][1] + layout[i][2]) * item + scale_bytes)
                               for i in owners)
            positions = _check_states(header, kv, n)
            state_size = getattr(kv, "state", None)
            state_size = state_size.nbytes if state_size is not None else 0
            body += len(positions) * state_size
            if size != 16 + header_len + body + 32:
                raise ValueError(f"it is {size} bytes, its header promises {16 + header_len + body + 32} (truncated?)")
            digest = hashlib.sha256(head + raw_header)
            raw_tokens = f.read(4 * n)
            digest.update(raw_tokens)
            kv.truncate(0)  # from here on the pool's positions are being overwritten
            for layer in owners:  # shared-KV layers read their source's cache: nothing of their own
                m = n - lo[layer]
                for t in kv.layer_tensors(layer):
                    heads, dim = t.shape[0], (t.shape[2] if t.dim() == 3 else 1)
                    raw = f.read(heads * m * dim * t.element_size())
                    digest.update(raw)
                    if m == 0:
                        continue
                    block = torch.frombuffer(bytearray(raw), dtype=t.dtype).view(heads, m, *t.shape[2:])
                    done = 0
                    for a, b in kv._spans(layer, lo[layer], n):
                        t[:, a:b] = block[:, done : done + b - a].to(t.device)
                        done += b - a
            states = []
            for _ in positions:
                raw = f.read(state_size)
                digest.update(raw)
                states.append(raw)
            if f.read(32) != digest.digest():
                raise ValueError("its checksum does not match (corrupt)")
        kv.tokens.extend(np.frombuffer(raw_tokens, dtype=np.int32).tolist())  # only now is it reusable
        kv._high = n - 1
        kv._intact_from = [lo[i] if kv.owns(i) else 0 for i in range(len(lo))]
        kv.canonical = self._canonical(header, n)
        if positions:
            kv.load_states(positions, [bytearray(raw) for raw in states])
        return n

    # -- bounding ------------------------------------------------------------------------
    def evict(self) -> list[Path]:
        """Delete least recently used files until the folder holds at most max_bytes."""
        self.remove_stale_tmp()
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

    def remove_stale_tmp(self) -> list[Path]:
        """Delete temporary files whose writer died mid-save (kill -9, power loss): `.NAME.PID.tmp`
        with PID no longer running. A live writer's file (another server on the same folder) stays."""
        removed = []
        for p in self.dir.glob(".*.kv.*.tmp"):
            pid = p.name.rsplit(".", 2)[-2]
            if not pid.isdigit() or int(pid) == os.getpid() or pid_alive(int(pid)):
                continue
            try:
                p.unlink()
                removed.append(p)
            except OSError:
                pass
        return removed

    def delete(self, conversation_id: str) -> None:
        try:
            self.path(conversation_id).unlink()
        except FileNotFoundError:
            pass

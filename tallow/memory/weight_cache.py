"""The repacked weights on disk: a warm start maps them instead of repacking the GGUF blocks.

Repacking (quant/pack.py: int4 nibbles, int8 requantization, group scales, stacked Q/K/V and
gate/up) costs seconds to minutes on a small CPU, every start (docs/performance.md, "Load
time"). So the CPU layers a cold start builds are written once to

    $TALLOW_HOME/packed/<model>-<key>.tallowpack

and the next start memory-maps that file: every layer's tensors are views of the map
(copy-on-write, never written), so a warm load costs a map, and the first token a page-in.

The key is a hash of everything that can change the packed bytes: the GGUF's fingerprint (its
header and tensor table, its size and sampled data pages — twins share a header), the format
version, a digest of the packing code's source, the device, the linear mode, the value of every
TALLOW_* switch that code reads at construction, the torch version (the int4 layout is an
opaque aten format), torch's CPU capability and the C kernel's code level (none where it was
not built). Anything else gives another file.

File layout (little-endian):

    magic b"TALLOWPK" | u32 FORMAT_VERSION | u32 0 | u64 header length | header (JSON, utf-8)
    zero padding to DATA_ALIGN | the tensors, each at a multiple of TENSOR_ALIGN
    sha256 of the header (32 bytes) | magic b"TALLOWPK"

The header holds the key, the file size and one entry per layer: its class (one of the CPU
linear classes below, nothing else is ever instantiated), its plain attributes and, for each
tensor attribute, dtype, shape and offset. A file whose magic, version, key, size, trailer or
entries disagree (torn, truncated, foreign) is ignored with one warning and rewritten. Files are
written to a temporary name, fsynced and renamed, so readers see a whole file or none. Tensor
bytes are not checksummed (hashing 1 GB would cost the second we are saving).

An unwritable or full cache folder costs one warning; the load goes on with the weights in memory.
Folder size is bounded (TALLOW_WEIGHT_CACHE_BYTES, default 8 GiB): least recently used files go first.
TALLOW_WEIGHT_CACHE=0 turns the cache off. The GPU path packs on the device and is not cached.
"""

from __future__ import annotations

import functools
import hashlib
import json
import mmap
import os
import re
import shutil
import struct
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from .. import switches
from ..gguf_file import GGUFFile
from ..kernels.cpu import ggml_dot
from ..durable import fsync_dir, pid_alive
from ..families.tensors import TOKEN_EMBD, is_tied, model_roles

MAGIC = b"TALLOWPK"
FORMAT_VERSION = 1
DATA_ALIGN = 4096
TENSOR_ALIGN = 64
DISK_HEADROOM = 256 << 20  # never fill the disk to the last byte for a cache
_PREFIX = struct.Struct("<8sIIQ")
_TRAILER = 32 + len(MAGIC)
_SAMPLED_PAGES = 64  # data pages hashed into the fingerprint: ~0.3 ms, tells twins apart
_PAGE = 4096

# The code whose output the file holds (relative to the tallow package): a change to any of it
# must never be served stale packs.
PACKING_SOURCES = ("quant/pack.py", "quant/reference.py", "kernels/cpu/linear.py", "kernels/cpu/fused_linear.py",
                   "kernels/cpu/dequant_matmul.py", "kernels/dispatch.py", "models/*.py", "memory/weight_cache.py",
                   "kernels/cpu/ggml_dot.py")
_TENSOR_DTYPES = {str(d).removeprefix("torch."): d for d in
                  (torch.uint8, torch.int8, torch.int32, torch.bfloat16, torch.float16, torch.float32)}


class WeightCacheWarning(UserWarning):
    """The weight cache could not be used or written: the load goes on without it."""


def cache_enabled() -> bool:
    return switches.enabled("TALLOW_WEIGHT_CACHE")


def _progress_default() -> bool:
    """The packing bar shows on a terminal; TALLOW_PROGRESS=1 asks for it anywhere, =0 never."""
    forced = switches.value("TALLOW_PROGRESS")  # None: on a terminal
    return forced if forced is not None else sys.stderr.isatty()


def default_dir() -> Path:
    from ..registry import home_dir

    return home_dir() / "packed"


def _restorable() -> dict[str, type]:
    """The only classes a cache file may name: the CPU linear layers."""
    from ..kernels.cpu.fused_linear import FusedLinear
    from ..kernels.cpu.ggml_dot import GgmlDotGroup, GgmlDotLinear
    from ..kernels.cpu.linear import DenseLinear, GroupInt8Linear, Int4Linear, Int8Linear, ReferenceLinear

    return {c.__name__: c for c in (Int4Linear, GroupInt8Linear, Int8Linear, DenseLinear, ReferenceLinear, FusedLinear,
                                    GgmlDotLinear, GgmlDotGroup)}


# ------------------------------------------------------------------------------ the key


def gguf_fingerprint(gf: GGUFFile) -> str:
    """sha256 of the header and tensor table, the file size and a few evenly spaced data pages."""
    h = hashlib.sha256(gf.header_bytes())
    h.update(struct.pack("<Q", gf.file_size))
    span = gf.file_size - gf.data_start
    for i in range(_SAMPLED_PAGES if span > 0 else 0):
        at = gf.data_start + span * i // _SAMPLED_PAGES
        h.update(gf._mmap[at: min(at + _PAGE, gf.file_size)])
    return h.hexdigest()


@functools.lru_cache(maxsize=1)
def _code_identity() -> tuple[str, tuple[str, ...]]:
    """(digest of the packing sources, the switches that change packing: declared `pack=True`
    in tallow/switches.py — the ones read while the linears are built, not per call)."""
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for pattern in PACKING_SOURCES:
        for path in sorted(root.glob(pattern)):
            h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest(), tuple(name for name, _ in switches.key_values("pack"))


def cache_key(gf: GGUFFile, device: str, linear_mode: str | None) -> dict[str, Any]:
    digest, _ = _code_identity()
    return {
        "format": FORMAT_VERSION,
        "fingerprint": gguf_fingerprint(gf),
        "code": digest,
        "device": str(device),
        "linear_mode": linear_mode or "auto",
        "switches": {name: repr(value) for name, value in switches.key_values("pack")},
        "torch": torch.__version__,
        "cpu": torch.backends.cpu.get_cpu_capability(),
        "c_kernel": ggml_dot.simd(),  # its code level (PORTABLE: not built or not used): decides which layers exist
    }


def cache_path(gf: GGUFFile, key: dict[str, Any], directory: Path) -> Path:
    stem = re.sub(r"[^A-Za-z0-9._-]", "_", Path(gf.path).name.removesuffix(".gguf"))[:48]
    return directory / f"{stem}-{hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]}.tallowpack"


# ------------------------------------------------------------------------------ layers <-> entries


def _describe(obj: Any, tensors: list[torch.Tensor], seen: dict[int, int]) -> dict[str, Any]:
    """A layer as a JSON-able entry; its tensors appended to `tensors` (each once)."""
    cls = type(obj).__name__
    if _restorable().get(cls) is not type(obj):
        raise TypeError(f"a {cls} cannot be cached")
    attrs: dict[str, Any] = {}
    for name, value in vars(obj).items():
        attrs[name] = _describe_value(value, tensors, seen)
    return {"class": cls, "attrs": attrs}


def _describe_value(value: Any, tensors: list[torch.Tensor], seen: dict[int, int]) -> dict[str, Any]:
    if isinstance(value, torch.Tensor):
        if str(value.dtype).removeprefix("torch.") not in _TENSOR_DTYPES:
            raise TypeError(f"a {value.dtype} tensor cannot be cached")
        if id(value) not in seen:
            seen[id(value)] = len(tensors)
            tensors.append(value)
        return {"tensor": seen[id(value)]}
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, list) and value and not isinstance(value[0], (int, float, str, bool)):
        return {"objects": [_describe(v, tensors, seen) for v in value]}
    if value is None or isinstance(value, (int, float, str, bool)) or (
            isinstance(value, list) and all(isinstance(v, (int, float, str, bool)) for v in value)):
        return {"value": value}
    raise TypeError(f"a {type(value).__name__} attribute cannot be cached")


def _restore(entry: dict[str, Any], tensors: list[torch.Tensor]) -> Any:
    cls = _restorable()[entry["class"]]  # KeyError: a foreign file
    obj = object.__new__(cls)
    for name, spec in entry["attrs"].items():
        setattr(obj, name, _restore_value(spec, tensors))
    return obj


def _restore_value(spec: dict[str, Any], tensors: list[torch.Tensor]) -> Any:
    if "tensor" in spec:
        return tensors[spec["tensor"]]
    if "dtype" in spec:
        return _TENSOR_DTYPES[spec["dtype"]]
    if "objects" in spec:
        return [_restore(e, tensors) for e in spec["objects"]]
    return spec["value"]


# ------------------------------------------------------------------------------ the cache


class WeightCache:
    """The packed layers of one model load: served from a mapped file (a hit), or built, recorded
    and written after the build (a miss). `status` says which: hit, written, off, not written."""

    def __init__(self, gf: GGUFFile, key: dict[str, Any], path: Path, progress: bool):
        self.gf = gf
        self.key = key
        self.path = path
        self.status = "miss"
        self._entries: dict[str, dict[str, Any]] = {}
        self._tensors: list[torch.Tensor] = []
        self._built: dict[str, Any] = {}
        self._map: mmap.mmap | None = None
        self._progress_wanted = progress
        self._bar = None
        self._warned = False
        self._read()

    @classmethod
    def open(cls, gf: GGUFFile, device: str, linear_mode: str | None = None, progress: bool | None = None,
             numerics: str = "default") -> "WeightCache | None":
        """The cache for this load, or None where it does not apply (TALLOW_WEIGHT_CACHE=0, a GPU,
        the fp32 reference path, llama.cpp's numerics: numerics_choice.py).
        progress: show a bar on stderr while packing (None: see _progress_default)."""
        if not cache_enabled() or not str(device).startswith("cpu"):
            return None
        reference = linear_mode == "reference" or (linear_mode in (None, "auto") and switches.enabled("TALLOW_REFERENCE"))
        if numerics == "ggml":
            return None  # nothing to pack: the C kernel reads the file's map (GgmlLinear's fp32 weights for other types)
        if reference:  # fp32 weights are 4-8x the file (15 GiB for a 4B model) and quick to dequantize
            return None
        show = progress if progress is not None else _progress_default()
        key = cache_key(gf, device, linear_mode)
        return cls(gf, key, cache_path(gf, key, default_dir()), show)

    @property
    def hit(self) -> bool:
        return self._map is not None

    # -- reading -------------------------------------------------------------------------
    def _read(self) -> None:
        try:
            f = open(self.path, "rb")
        except (FileNotFoundError, NotADirectoryError):
            return  # nothing cached yet (or the folder cannot exist: saving will say so)
        except OSError as exc:
            self._warn(f"the weight cache {self.path} could not be read ({exc.strerror}); repacking")
            return
        with f:
            try:
                header, mapped = self._validate(f)
            except (ValueError, KeyError, TypeError, AttributeError, IndexError, OverflowError, RuntimeError, struct.error) as exc:
                self._warn(f"the weight cache {self.path} is damaged or foreign ({exc}); repacking, it will be rewritten")
                return
            except OSError as exc:
                self._warn(f"the weight cache {self.path} could not be read ({exc.strerror}); repacking")
                return
        self._map, self._tensors, self._entries = mapped, header["tensors_mapped"], header["layers"]
        if hasattr(mmap, "MADV_WILLNEED"):
            mapped.madvise(mmap.MADV_WILLNEED)  # start reading from disk now, if not in the page cache

    def _validate(self, f) -> tuple[dict[str, Any], mmap.mmap]:
        size = os.fstat(f.fileno()).st_size
        head = f.read(_PREFIX.size)
        if len(head) < _PREFIX.size:
            raise ValueError("shorter than its prefix")
        magic, version, _, header_len = _PREFIX.unpack(head)
        if magic != MAGIC:
            raise ValueError("wrong magic number")
        if version != FORMAT_VERSION:
            raise ValueError(f"format version {version}, expected {FORMAT_VERSION}")
        if header_len > size - _PREFIX.size - _TRAILER:
            raise ValueError("its header runs past the end")
        raw = f.read(header_len)
        header = json.loads(raw)
        if header.get("file_size") != size:
            raise ValueError(f"{size} bytes, its header says {header.get('file_size')} (truncated?)")
        f.seek(size - _TRAILER)
        if f.read(_TRAILER) != hashlib.sha256(raw).digest() + MAGIC:
            raise ValueError("its trailer does not match its header (torn write?)")
        if header.get("key") != self.key:
            raise ValueError("it was written for another model, version or set of switches")
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)  # private: kernels never write back
        data_start, data_end = header["data_start"], size - _TRAILER
        tensors = []
        for dtype_name, shape, offset in header["tensors"]:
            dtype = _TENSOR_DTYPES[dtype_name]
            numel = 1
            for d in shape:
                if int(d) < 0:
                    raise ValueError("a tensor has a negative dimension")
                numel *= int(d)
            nbytes = numel * dtype.itemsize
            if offset < data_start or offset + nbytes > data_end or offset % TENSOR_ALIGN:
                raise ValueError("a tensor lies outside the data region")
            if nbytes == 0:
                tensors.append(torch.empty(shape, dtype=dtype))
            else:
                tensors.append(torch.frombuffer(mapped, dtype=torch.uint8, count=nbytes, offset=offset)
                               .view(dtype).reshape(shape))
        for entry in header["layers"].values():
            _check_entry(entry, len(tensors))
        header["tensors_mapped"] = tensors
        return header, mapped

    # -- building ------------------------------------------------------------------------
    def layer(self, names: list[str], build: Callable[[], Any]) -> Any:
        """The layer over the GGUF tensors `names`: restored from the file, or built (and recorded)."""
        key = "+".join(names)
        entry = self._entries.get(key)
        if entry is not None:
            return _restore(entry, self._tensors)
        self._tick_start()
        obj = build()
        self._built[key] = obj
        self._tick(names)
        return obj

    def _tick_start(self) -> None:
        if not self._progress_wanted or self._bar is not None:
            return
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

        self._bar = Progress(TextColumn("packing weights (once; cached for the next start)"), BarColumn(bar_width=24),
                             TaskProgressColumn(), TimeElapsedColumn(), console=Console(stderr=True, force_terminal=True))
        tied = is_tied(self.gf.tensors)  # else the embedding stays in the GGUF map, unpacked
        roles = model_roles(self.gf.tensors)
        total = sum(t.n_bytes for t in self.gf.tensors.values() if len(t.shape) >= 2 and t.n_rows > 1
                    and (tied or roles.get(t.name) != TOKEN_EMBD))
        self._task = self._bar.add_task("pack", total=total)
        self._bar.start()

    def _tick(self, names: list[str]) -> None:
        if self._bar is not None:
            self._bar.advance(self._task, sum(self.gf.tensors[n].n_bytes for n in names if n in self.gf.tensors))

    def stop_progress(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    # -- writing -------------------------------------------------------------------------
    def save(self) -> str:
        """After the build: write what was packed (atomically), or refresh a hit's LRU time."""
        self.stop_progress()
        if self.hit and not self._built:
            self.status = "hit"
            _touch(self.path)
            return self.status
        if self.hit:
            self._warn(f"the weight cache {self.path} lacked some layers; it will be rewritten")
        try:
            self._write()
        except (OSError, TypeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            self._warn(f"the packed weights were not cached in {self.path.parent} ({reason}); the next start repacks")
            self.status = "not written"
            return self.status
        self.status = "written"
        evict(self.path.parent, _max_bytes(), keep=self.path)
        return self.status

    def _write(self) -> None:
        tensors: list[torch.Tensor] = []
        seen: dict[int, int] = {}
        layers = {key: _describe(obj, tensors, seen) for key, obj in self._built.items()}
        if self.hit:  # keep the layers that came from the old file too
            for key, entry in self._entries.items():
                layers.setdefault(key, _describe(_restore(entry, self._tensors), tensors, seen))
        table, offset = [], 0
        for t in tensors:
            offset = -(-offset // TENSOR_ALIGN) * TENSOR_ALIGN
            table.append((offset, t))
            offset += t.numel() * t.element_size()
        data_bytes = offset
        header: dict[str, Any] = {"key": self.key, "layers": layers, "data_start": 0, "file_size": 0, "tensors": []}
        # The header's length depends on the offsets it lists: fix it up until it stops moving.
        for _ in range(4):
            data_start = -(-(_PREFIX.size + len(json.dumps(header).encode())) // DATA_ALIGN) * DATA_ALIGN
            header["data_start"] = data_start
            header["file_size"] = data_start + data_bytes + _TRAILER
            header["tensors"] = [(str(t.dtype).removeprefix("torch."), list(t.shape), data_start + off) for off, t in table]
        raw = json.dumps(header).encode()
        if _PREFIX.size + len(raw) > header["data_start"]:
            raise OSError(0, "the cache header did not settle")
        directory = self.path.parent
        directory.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(directory).free
        if header["file_size"] + DISK_HEADROOM > free:
            raise OSError(28, f"{_mib(header['file_size'])} needed, {_mib(free)} free on that disk")
        if header["file_size"] > _max_bytes():
            raise OSError(0, f"{_mib(header['file_size'])} exceeds TALLOW_WEIGHT_CACHE_BYTES")
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(_PREFIX.pack(MAGIC, FORMAT_VERSION, 0, len(raw)) + raw)
                f.write(b"\0" * (header["data_start"] - f.tell()))
                for off, t in table:
                    f.write(b"\0" * (header["data_start"] + off - f.tell()))
                    if t.numel():
                        f.write(memoryview(t.detach().contiguous().view(torch.uint8).reshape(-1).numpy()))
                f.write(hashlib.sha256(raw).digest() + MAGIC)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)  # atomic: readers see the old file or the new one
        finally:
            if tmp.exists():
                tmp.unlink()
        fsync_dir(directory)

    def _warn(self, message: str) -> None:
        """One warning per load at most: a folder that cannot be read usually cannot be written."""
        if not self._warned:
            self._warned = True
            warnings.warn(message, WeightCacheWarning, stacklevel=3)


def _check_entry(entry: dict[str, Any], n_tensors: int) -> None:
    if entry["class"] not in _restorable():
        raise ValueError(f"unknown layer class {entry['class']!r}")
    for spec in entry["attrs"].values():
        if "tensor" in spec and not 0 <= int(spec["tensor"]) < n_tensors:
            raise ValueError("a layer names a missing tensor")
        if "dtype" in spec and spec["dtype"] not in _TENSOR_DTYPES:
            raise ValueError(f"unknown dtype {spec['dtype']!r}")
        for sub in spec.get("objects", []):
            _check_entry(sub, n_tensors)


def _max_bytes() -> int:
    return switches.value("TALLOW_WEIGHT_CACHE_BYTES")


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.0f} MiB"


def _touch(path: Path) -> None:
    try:
        os.utime(path)
    except OSError:
        pass  # a read-only cache still serves


def evict(directory: Path, max_bytes: int, keep: Path | None = None) -> None:
    """Remove the least recently used cache files until the folder holds at most max_bytes, and
    the temporary files of writers that died (killed mid-write: their pid is gone)."""
    for tmp in directory.glob(".*.tallowpack.*.tmp"):
        pid = tmp.name.rsplit(".", 2)[-2]
        if pid.isdigit() and not pid_alive(int(pid)):
            try:
                tmp.unlink()
            except OSError:
                pass
    try:
        files = [(p.stat().st_mtime, p.stat().st_size, p) for p in directory.glob("*.tallowpack")]
    except OSError:
        return
    total = sum(size for _, size, _ in files)
    for _, size, path in sorted(files, key=lambda f: f[0]):
        if total <= max_bytes:
            break
        if keep is not None and path == keep:
            continue
        try:
            path.unlink()
            total -= size
        except OSError:
            pass

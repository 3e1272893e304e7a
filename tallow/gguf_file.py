"""Memory-mapped GGUF: header, metadata and tensor index, with clear errors for bad files.

The header is parsed here with `struct` rather than `gguf.GGUFReader`: the reader builds a
Python object per array element, which takes ~8 s for gemma's 262k-token vocabulary. We
still take the format's constants (value types, quant block sizes) from the `gguf` package,
and a test checks that this parser agrees with `gguf.GGUFReader` on every real model.
Tensor data is never copied: each tensor is a numpy view into one read-only memory map.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from .errors import ModelFileError

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
MAX_ARRAY_NESTING = 4  # arrays of arrays: real files use none; deeper is a corrupt (or hostile) file
MAX_DIM = 1 << 40  # one tensor dimension (ggml's are int64; 2^40 elements is far past any model)

_SCALAR_FORMATS = {
    GGUFValueType.UINT8: "<B",
    GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I",
    GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f",
    GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d",
}
_NUMPY_DTYPES = {
    GGUFValueType.UINT8: np.uint8,
    GGUFValueType.INT8: np.int8,
    GGUFValueType.UINT16: np.uint16,
    GGUFValueType.INT16: np.int16,
    GGUFValueType.UINT32: np.uint32,
    GGUFValueType.INT32: np.int32,
    GGUFValueType.FLOAT32: np.float32,
    GGUFValueType.BOOL: np.bool_,
    GGUFValueType.UINT64: np.uint64,
    GGUFValueType.INT64: np.int64,
    GGUFValueType.FLOAT64: np.float64,
}


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of the file. `shape` is in ggml order: shape[0] is the row length."""

    name: str
    qtype: GGMLQuantizationType
    shape: tuple[int, ...]
    offset: int  # absolute byte offset in the file
    n_bytes: int
    data: np.ndarray = field(repr=False)  # uint8 view of the raw bytes, (n_rows, bytes_per_row)
    file: "GGUFFile | None" = field(default=None, repr=False, compare=False)  # where read_rows reads (None: only `data`)

    def read_rows(self, idx: np.ndarray) -> np.ndarray:
        """Rows `idx` copied out, (len(idx), bytes_per_row): read from the file (GGUFFile.read_rows)
        where it can be read, else gathered from `data`."""
        return self.file.read_rows(self, idx) if self._readable else self.data[idx]

    def streamed(self) -> "np.ndarray | FileRows":
        """The rows as a builder that reads the tensor once, in row slices, should take them: read
        from the file per slice (FileRows) where the tensor has one, else `data`. Through the map,
        every page read would stay resident until the load releases the map."""
        return FileRows(self) if self._readable else self.data

    def private_view(self) -> np.ndarray:
        """The bytes as a writable array over a private copy-on-write map of the file
        (GGUFFile.private_map): kernels that read the file's own blocks keep them there, in the
        page cache, instead of a copy in anonymous memory; nothing ever writes them. A tensor
        without a file gets a copy of `data`."""
        if self.file is None:
            return np.array(self.data, copy=True)
        return np.frombuffer(self.file.private_map(), dtype=np.uint8, count=self.n_bytes,
                             offset=self.offset).reshape(self.data.shape)

    @property
    def _readable(self) -> bool:
        return self.file is not None and self.file.can_read

    @property
    def n_rows(self) -> int:
        n = 1
        for d in self.shape[1:]:
            n *= d
        return n

    @property
    def n_cols(self) -> int:
        return self.shape[0]


class SkippedStrings:
    """A string array left undecoded (GGUFFile(skip_strings=True)): only its length is known."""

    def __init__(self, count: int):
        self.count = count

    def __len__(self) -> int:
        return self.count


_U64 = struct.Struct("<Q")


class _Cursor:
    def __init__(self, buf: memoryview, path: str, skip_strings: bool = False):
        self.buf = buf
        self.pos = 0
        self.path = path
        self.skip_strings = skip_strings

    def take(self, n: int) -> memoryview:
        end = self.pos + n
        if end > len(self.buf):
            raise ModelFileError(f"{self.path}: the file is truncated (its header runs past the end of the file).")
        out = self.buf[self.pos:end]
        self.pos = end
        return out

    def scalar(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        n = self.scalar("<Q")
        raw = bytes(self.take(n))
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return raw.decode("utf-8", errors="replace")

    def string_array(self, count: int) -> list[str]:
        """`count` strings in one tight loop: the generic path costs ~2.5 µs a string, which is
        2 s for Gemma 4's 262k tokens and 515k merges; this costs about a fifth of that."""
        buf, pos, end = self.buf, self.pos, len(self.buf)
        length_at = _U64.unpack_from
        out: list[str] = []
        append = out.append
        for _ in range(count):  # each item: an 8-byte length, then the UTF-8 bytes
            if pos + 8 > end:
                break
            (n,) = length_at(buf, pos)
            pos += 8
            if n > end - pos:
                break
            raw = buf[pos:pos + n]
            pos += n
            if not self.skip_strings:
                try:
                    append(str(raw, "utf-8"))
                except UnicodeDecodeError:
                    append(str(raw, "utf-8", "replace"))
        else:
            self.pos = pos
            return out
        raise ModelFileError(f"{self.path}: the file is truncated (its header runs past the end of the file).")

    def value(self, vtype: int, depth: int = 0) -> Any:
        try:
            vtype = GGUFValueType(vtype)
        except ValueError:
            raise ModelFileError(f"{self.path}: the header has an unknown value type {vtype}; the file is corrupt.") from None
        if vtype == GGUFValueType.STRING:
            return self.string()
        if vtype == GGUFValueType.ARRAY:
            item_type = self.scalar("<I")
            count = self.scalar("<Q")
            if count > len(self.buf) - self.pos:  # every item takes at least one byte
                raise ModelFileError(f"{self.path}: the header declares an array of {count} items, longer than the file; the file is corrupt.")
            if item_type == GGUFValueType.STRING:
                strings = self.string_array(count)
                return SkippedStrings(count) if self.skip_strings else strings
            if item_type in _NUMPY_DTYPES:
                dtype = np.dtype(_NUMPY_DTYPES[GGUFValueType(item_type)]).newbyteorder("<")
                raw = self.take(count * dtype.itemsize)
                return np.frombuffer(raw, dtype=dtype).copy()
            if item_type == GGUFValueType.ARRAY and depth >= MAX_ARRAY_NESTING:
                raise ModelFileError(f"{self.path}: the header nests arrays deeper than {MAX_ARRAY_NESTING} levels; the file is corrupt.")
            return [self.value(item_type, depth + 1) for _ in range(count)]
        return self.scalar(_SCALAR_FORMATS[vtype])


class FileRows:
    """A tensor's rows, read from the file per slice (GGUFFile.read_span): what TensorInfo.streamed
    gives a builder that walks a tensor once in row chunks (quant/pack.py's packers)."""

    def __init__(self, tensor: TensorInfo):
        self.tensor = tensor
        self.shape = tensor.data.shape

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, rows: slice) -> np.ndarray:
        if not isinstance(rows, slice):
            raise TypeError("FileRows reads slices of rows only")
        r0, r1, step = rows.indices(self.shape[0])
        if step != 1:
            raise TypeError("FileRows reads contiguous rows only")
        return self.tensor.file.read_span(self.tensor, r0, max(r0, r1))


class GGUFFile:
    """A GGUF file opened read-only and memory-mapped. Closing it invalidates tensor views.

    skip_strings=True leaves string arrays (the vocabulary, the merges) undecoded — all that
    `tallow plan` needs is their length, and decoding a 262k-entry vocabulary costs ~0.3 s.
    """

    def __init__(self, path: str | os.PathLike, skip_strings: bool = False):
        self.path = str(path)
        try:
            fd = open(self.path, "rb")
        except FileNotFoundError:
            raise ModelFileError(f"{self.path}: no such file.") from None
        except IsADirectoryError:
            raise ModelFileError(f"{self.path}: is a directory, not a GGUF file.") from None
        except PermissionError:
            raise ModelFileError(f"{self.path}: permission denied.") from None
        with fd:
            size = os.fstat(fd.fileno()).st_size
            if size < 24:
                raise ModelFileError(f"{self.path}: the file is too small to be a GGUF model ({size} bytes).")
            self._mmap = mmap.mmap(fd.fileno(), 0, access=mmap.ACCESS_READ)
            self._fd = os.dup(fd.fileno()) if hasattr(os, "preadv") else None  # read_rows' own descriptor
        self._private = None  # private_map, opened on first use
        self.file_size = size
        buf = memoryview(self._mmap)
        cur = _Cursor(buf, self.path, skip_strings)
        if bytes(cur.take(4)) != GGUF_MAGIC:
            raise ModelFileError(f"{self.path}: not a GGUF file (wrong magic number).")
        self.version = cur.scalar("<I")
        if self.version not in (2, 3):
            raise ModelFileError(f"{self.path}: GGUF version {self.version} is not supported (2 or 3 are).")
        n_tensors = cur.scalar("<Q")
        n_kv = cur.scalar("<Q")
        if n_tensors > 1_000_000 or n_kv > 1_000_000:
            raise ModelFileError(f"{self.path}: the header claims {n_tensors} tensors and {n_kv} keys; the file is corrupt.")
        self.metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = cur.string()
            if key in self.metadata:
                raise ModelFileError(f"{self.path}: the metadata key {key[:100]!r} appears twice; the file is corrupt.")
            self.metadata[key] = cur.value(cur.scalar("<I"))
        raw_tensors = []
        for _ in range(n_tensors):
            name = cur.string()
            n_dims = cur.scalar("<I")
            if n_dims > 4:
                raise ModelFileError(f"{self.path}: tensor {name!r} has {n_dims} dimensions; the file is corrupt.")
            shape = tuple(cur.scalar("<Q") for _ in range(n_dims))
            if n_dims == 0 or any(d > MAX_DIM for d in shape):
                raise ModelFileError(f"{self.path}: tensor {name[:100]!r} has shape {list(shape)}; the file is corrupt.")
            type_id = cur.scalar("<I")
            rel_offset = cur.scalar("<Q")
            raw_tensors.append((name, shape, type_id, rel_offset))
        self.header_size = cur.pos
        alignment = self.metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if isinstance(alignment, bool) or not isinstance(alignment, (int, np.integer)) or not 0 < alignment <= 1 << 30 or alignment & (alignment - 1):
            raise ModelFileError(f"{self.path}: general.alignment is {alignment!r:.40}, not a power of two; the file is corrupt.")
        alignment = int(alignment)
        data_start = (cur.pos + alignment - 1) // alignment * alignment
        self.tensors: dict[str, TensorInfo] = {}
        spans = []
        for name, shape, type_id, rel_offset in raw_tensors:
            if name in self.tensors:
                raise ModelFileError(f"{self.path}: tensor {name[:100]!r} appears twice; the file is corrupt.")
            if rel_offset % alignment:
                raise ModelFileError(f"{self.path}: tensor {name[:100]!r} starts at offset {rel_offset}, not a multiple of the alignment {alignment}.")
            try:
                qtype = GGMLQuantizationType(type_id)
            except ValueError:
                raise ModelFileError(f"{self.path}: tensor {name!r} has unknown tensor type {type_id}.") from None
            block_size, type_size = GGML_QUANT_SIZES[qtype]
            if shape[0] % block_size:
                raise ModelFileError(
                    f"{self.path}: tensor {name!r} has row length {shape[0]}, not a multiple of {qtype.name}'s block of {block_size}."
                )
            n_rows = 1
            for d in shape[1:]:  # Python ints: numpy's int64 product wraps (and then passed the size check)
                n_rows *= d
            row_bytes = shape[0] // block_size * type_size
            n_bytes = n_rows * row_bytes
            offset = data_start + rel_offset
            if offset + n_bytes > size:
                raise ModelFileError(
                    f"{self.path}: the file is truncated (tensor {name!r} ends at byte {offset + n_bytes}, the file has {size})."
                )
            data = np.frombuffer(self._mmap, dtype=np.uint8, count=n_bytes, offset=offset).reshape(n_rows, row_bytes)
            self.tensors[name] = TensorInfo(name, qtype, shape, offset, n_bytes, data, self)
            spans.append((offset, offset + n_bytes, name))
        spans.sort()
        for (_, end, first), (start, _, second) in zip(spans, spans[1:]):
            if start < end:
                raise ModelFileError(f"{self.path}: tensors {first[:100]!r} and {second[:100]!r} overlap; the file is corrupt.")
        self.data_start = data_start

    @property
    def architecture(self) -> str:
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise ModelFileError(f"{self.path}: the file has no general.architecture key.")
        return arch

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def arch_get(self, key: str, default: Any = None) -> Any:
        """Look up `<architecture>.<key>`, e.g. arch_get('block_count')."""
        return self.metadata.get(f"{self.architecture}.{key}", default)

    def header_bytes(self) -> bytes:
        """The header and tensor table: a fingerprint of the model that changes when its weights do not match."""
        return bytes(self._mmap[: self.header_size])

    VOCABULARY_KEYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type", "tokenizer.ggml.merges")

    def drop_vocabulary(self) -> None:
        """Forget the vocabulary arrays once the tokenizer has its own structures built from them
        (for a 150k-token vocabulary they are tens of MB of Python strings held twice)."""
        for key in self.VOCABULARY_KEYS:
            self.metadata.pop(key, None)

    def release_pages(self) -> None:
        """Drop this process's resident copies of the mapped pages (they stay in the page cache).

        Loading touches every weight once to repack it; afterwards only embedding rows are
        read from the map, so keeping the rest resident would count the model twice.
        """
        if hasattr(mmap, "MADV_DONTNEED"):
            self._mmap.madvise(mmap.MADV_DONTNEED)

    def private_map(self) -> mmap.mmap:
        """A second map of the file, private and copy-on-write (writable to numpy and torch, which
        the shared read-only map is not), opened on first use. Arrays over it keep it alive after
        close()."""
        if self._private is None:
            if self._fd is not None:  # the file opened at load, even if its path now names another
                self._private = mmap.mmap(self._fd, 0, access=mmap.ACCESS_COPY)
            else:
                with open(self.path, "rb") as fd:
                    self._private = mmap.mmap(fd.fileno(), 0, access=mmap.ACCESS_COPY)
        return self._private

    @property
    def can_read(self) -> bool:
        """Whether rows can be read from the file rather than the map (os.preadv exists)."""
        return self._fd is not None

    def read_span(self, tensor: TensorInfo, r0: int, r1: int) -> np.ndarray:
        """Rows r0..r1 of `tensor` copied from the file (one pread), (r1 - r0, bytes_per_row)."""
        row_bytes = tensor.data.shape[1]
        out = np.empty((r1 - r0, row_bytes), np.uint8)
        self._pread(out.reshape(-1), tensor.offset + r0 * row_bytes, tensor.name)
        return out

    def _pread(self, into: np.ndarray, offset: int, name: str) -> None:
        view, done = memoryview(into).cast("B"), 0
        while done < len(view):  # a pread may return fewer bytes than asked (over 2 GiB on Linux)
            n = os.preadv(self._fd, [view[done:]], offset + done)
            if n <= 0:
                raise ModelFileError(f"{self.path}: the file was cut short while in use (tensor {name!r}).")
            done += n

    def read_rows(self, tensor: TensorInfo, idx: np.ndarray) -> np.ndarray:
        """Rows `idx` of `tensor` copied from the file with pread, not through the map: a fault on
        the map makes its neighbouring pages resident too (the kernel maps up to 64 KiB around a
        fault on pages already in the page cache), so a long prompt's scattered embedding rows would
        make most of the table resident in this process, memory the plan does not count."""
        row_bytes = tensor.data.shape[1]
        out = np.empty((len(idx), row_bytes), np.uint8)
        for i, row in enumerate(idx.tolist()):
            self._pread(out[i], tensor.offset + row * row_bytes, tensor.name)
        return out

    def close(self) -> None:
        self.tensors.clear()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._private = None  # (unmapped when the last array over it goes)
        try:
            self._mmap.close()
        except BufferError:
            # Views into the map are still alive somewhere; the OS unmaps when they are collected.
            pass

    def __del__(self) -> None:
        fd = getattr(self, "_fd", None)  # (None too when __init__ failed before opening it)
        if fd is not None:
            os.close(fd)

    def __enter__(self) -> "GGUFFile":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

"""What the twin generators (make_gemma4_twin.py, make_moe_twin.py, make_ssm_twin.py) share: the
block sizes of the types they write, a tensor's bytes, llama.cpp's Q4_K_M `use_more_bits` rule, random
quant blocks with sane fp16 scales, and the GGUF sequence up to the first tensor's data. Each generator
keeps its own shapes (from its model's published config), metadata and float values.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# type -> (block elements, block bytes, byte offsets of the fp16 scale fields set to a sane value)
BLOCKS = {"Q4_K": (256, 144, (0, 2)), "Q6_K": (256, 210, (208,)), "Q5_0": (32, 22, (0,)), "Q8_0": (32, 34, (0,)),
          "NVFP4": (64, 36, ()), "F32": (1, 4, ()), "BF16": (1, 2, ())}
SCALE = np.frombuffer(np.float16(0.002).tobytes(), np.uint8)


@dataclass(frozen=True)
class Tensor:
    name: str
    shape: tuple[int, ...]  # numpy order: (experts,) rows, cols = ggml's ne1, ne0; (n,) for vectors
    type: str

    @property
    def nbytes(self) -> int:
        elems, size, _ = BLOCKS[self.type]
        assert self.shape[-1] % elems == 0, (self.name, self.shape, self.type)
        return int(np.prod(self.shape)) // elems * size


def more_bits(i: int, n: int) -> bool:
    """llama-quant.cpp's use_more_bits: the layers Q4_K_M gives Q6_K for attn_v and ffn_down."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def random_blocks(t: Tensor, rng: np.random.Generator, chunk: int = 1 << 26):
    """A quantized tensor's bytes in chunks: random blocks with their fp16 scales set to 0.002."""
    size, scales = BLOCKS[t.type][1:]
    per_chunk, left = chunk // size, t.nbytes // size
    while left:
        k = min(left, per_chunk)
        b = np.frombuffer(rng.bytes(k * size), np.uint8).reshape(k, size).copy()
        for o in scales:
            b[:, o:o + 2] = SCALE
        yield b.tobytes()
        left -= k


def start_gguf(out, arch: str, add_metadata, table: list[Tensor]):
    """A GGUFWriter for `out` with the metadata `add_metadata(writer)` adds and `table`'s tensor
    infos written, the file positioned at the aligned start of the data. Returns (writer, file,
    alignment); the caller writes each tensor's bytes, pads it to the alignment, and closes."""
    from gguf import GGMLQuantizationType as Q, GGUFWriter

    w = GGUFWriter(str(out), arch)
    add_metadata(w)
    for t in table:
        w.add_tensor_info(t.name, t.shape, np.dtype(np.float32), t.nbytes, raw_dtype=Q[t.type])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    f = w.fout[0]
    align = w.data_alignment
    f.write(b"\0" * (-f.tell() % align))
    return w, f, align

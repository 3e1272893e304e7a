"""Where prefill may start and how it is cut into chunks, so that the cache never changes the numbers.

A greedy answer must not depend on what the KV pool happened to hold. It did: a request that
reused 34 cached tokens prefilled the rest as one short chunk, which rounds differently from
the cold prompt's one long chunk, and a near-tie flipped (issue 13). Two facts decide what
is safe (measured; docs/performance.md, "determinism"):

- Row invariance. On the CPU, the int4/int8/int8g/int4x2 kernels and the dequantized-bf16
  GEMM each give row i the same bits however many rows share the call — but a chunk of fewer
  than dequant_matmul.MIN_ROWS rows goes through the low-bit kernel and a longer one through
  the dequantized tile, which round apart. Prefill attention is made row-invariant too
  (models/step.EagerAttention pads its keys to whole layers.KEY_BLOCK blocks at absolute positions, as
  SDPA's CPU flash kernel splits them). Dense fp32 F.linear is not (its 1- and 9-row calls
  round apart), nor is anything on the GPU (cuBLAS and the prefill graphs choose their kernel
  by the chunk's length bucket).
- Canonical KV. The pool's `canonical` counts the leading positions whose K/V are bit for
  bit what a cold prefill of the same tokens writes. Decode steps, speculative passes and
  chunks computed any other way leave it where it was.

So with row-invariant kernels (the CPU's quantized paths), prefill may start at any canonical
position r as long as every chunk has at least `min_rows` rows: r <= n - min_rows, chunks of
at most `chunk` tokens, the last one never shorter than min_rows. A second request with a long
shared system prompt re-prefills at most min_rows (64) tokens beyond what is new.
Otherwise (the GPU, dense float weights) chunks are aligned to absolute multiples of `chunk`
and reuse stops at such a boundary, so a warm request replays exactly the cold one's chunks;
it re-prefills up to one chunk (512 tokens: a few ms on the GPU).

TALLOW_ALIGNED_REUSE=0 brings back the old reuse: any common prefix, the rest in one go from
there (more reuse, and the answer may change with the cache state).
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import switches
from ..numerics_mode import GGML
from ..layers import block_aligned_keys_enabled as aligned_reuse_enabled  # one switch: TALLOW_ALIGNED_REUSE


@dataclass(frozen=True)
class PrefillPlan:
    """chunk: the longest prefill call. row_invariant: whether a row's numbers are independent
    of the chunk it is computed in, given that the chunk has >= min_rows rows. stable: False
    for TALLOW_ALIGNED_REUSE=0 (any reuse, nothing canonical)."""

    chunk: int
    row_invariant: bool
    min_rows: int = 1
    stable: bool = True

    def start(self, shared: int, canonical: int, n: int) -> int:
        """Where prefill of an n-token prompt starts, given `shared` tokens in common with the
        pool, of which the first `canonical` hold cold-prefill K/V. The last prompt token is
        always evaluated: its logits choose the first new token."""
        r = min(shared, n - 1)
        if not self.stable:
            return max(r, 0)
        r = min(r, canonical)
        if self.row_invariant:
            r = min(r, n - self.min_rows)
        else:
            r -= r % self.chunk
        return max(r, 0)

    def chunks(self, start: int, n: int) -> list[tuple[int, int]]:
        """The [a, b) chunks covering positions start..n-1."""
        out = []
        a = start
        while a < n:
            if self.stable and not self.row_invariant:
                b = min(n, (a // self.chunk + 1) * self.chunk)  # up to the next aligned boundary
            else:
                b = min(n, a + self.chunk)
                if self.stable and 0 < n - b < self.min_rows:  # never leave a too-short last chunk
                    b = max(a + self.min_rows, n - self.min_rows)
            out.append((a, b))
            a = b
        return out

    def extends_canonical(self, a: int, b: int, canonical: int) -> bool:
        """Whether chunk [a, b), computed right after `canonical` cold-prefill positions,
        writes K/V a cold prefill would write too."""
        if not self.stable or a != canonical:
            return False
        if self.row_invariant:
            return b - a >= self.min_rows
        return a % self.chunk == 0 and b - a == self.chunk


def model_linears(model) -> list:
    """Every matrix layer of `model`: the output projection and each block's."""
    return [model.output] + [t for layer in model.layers for t in layer.tensors.values() if hasattr(t, "kind")]


def plan_for(model, chunk: int) -> PrefillPlan:
    """The plan for `model`: row-invariant where every matrix runs in a row-exact CPU kernel and
    attention goes through SDPA (no logit softcap), aligned chunks elsewhere."""
    from ..kernels.cpu import dequant_matmul
    from .speculate import rows_are_exact

    if not aligned_reuse_enabled():
        return PrefillPlan(chunk, row_invariant=False, stable=False)
    if model.device.type == "cpu" and model.numerics == GGML and model.spec.attn_logit_softcap is None and all(
            set(str(t.kind).split("+")) == {"ggml_dot"} for t in model_linears(model)):
        # llama.cpp's numerics (numerics_choice.py): a chunk of TILED_MIN_ROWS or more rows computes each row's
        # products in the tiled order and its attention over that row's own keys, whatever the chunk's length.
        from ..kernels.cpu.ggml_dot import TILED_MIN_ROWS

        return PrefillPlan(chunk, row_invariant=True, min_rows=min(TILED_MIN_ROWS, chunk))
    if model.device.type == "cpu" and model.spec.attn_logit_softcap is None and rows_are_exact(model):
        # Fewer rows than MIN_ROWS run in the low-bit kernel instead of the dequantized tile;
        # one row would take the decode attention instead of the padded prefill one.
        # The C kernel takes up to GgmlDotLinear.MAX_ROWS rows (its groups too), the torch fallback more.
        from ..kernels.cpu.ggml_dot import GgmlDotLinear

        c_kernel = any("ggml_dot" in str(t.kind).split("+") for t in model_linears(model))
        min_rows = dequant_matmul.MIN_ROWS if dequant_matmul.enabled() else (GgmlDotLinear.MAX_ROWS + 1 if c_kernel else 2)
        return PrefillPlan(chunk, row_invariant=True, min_rows=min(min_rows, chunk))
    return PrefillPlan(chunk, row_invariant=False)


def numerics_key(model, plan: PrefillPlan) -> str:
    """What a saved pool's canonical K/V depend on besides the model file and the tokens: the
    device (GPU name, CPU vector ISA), torch, threads, kernels, the plan and the switches. A
    conversation's KV file is reused past its canonical prefix only where this key agrees."""
    import hashlib

    import torch

    if model.device.type == "cuda":
        where = torch.cuda.get_device_name(model.device)
    else:
        where = f"{torch.backends.cpu.get_cpu_capability()} threads={torch.get_num_threads()}"
    kinds = sorted({str(t.kind) for t in model_linears(model)})
    numeric = switches.key_values("numeric")  # the switches declared to change a prefill's numbers
    text = repr((model.device.type, where, torch.__version__, kinds, plan, numeric, model.numerics))
    return hashlib.sha256(text.encode()).hexdigest()[:16]

"""The KV cache: one pre-allocated pool per layer, sized for the context before inference.

K and V are stored in float16, as llama.cpp stores them by default, so attention sees the
same rounded keys and values. `tokens` records which token ids the resident positions hold;
the engine uses it to reuse the longest common prefix between requests.
"""

from __future__ import annotations

import torch

from ..spec import ModelSpec


class KVPool:
    def __init__(self, spec: ModelSpec, n_ctx: int, dtype: torch.dtype = torch.float16, device: torch.device | str = "cpu"):
        self.n_ctx = n_ctx
        self.dtype = dtype
        self.device = torch.device(device)
        self.k = [torch.zeros(layer.n_kv_heads, n_ctx, spec.head_dim, dtype=dtype, device=device) for layer in spec.layers]
        self.v = [torch.zeros(layer.n_kv_heads, n_ctx, spec.v_head_dim, dtype=dtype, device=device) for layer in spec.layers]
        self.tokens: list[int] = []  # ids whose K/V occupy positions 0..len(tokens)-1

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

    def store(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write k (n_tokens, n_kv_heads, head_dim) and v at positions start.. of one layer."""
        n = k.shape[0]
        self.k[layer][:, start : start + n] = k.transpose(0, 1)
        self.v[layer][:, start : start + n] = v.transpose(0, 1)

    def store_at(self, layer: int, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Like `store`, at positions given as a device tensor (n_tokens,): nothing is read back
        to the host, so a CUDA graph can capture it and replay it at any position."""
        self.k[layer].index_copy_(1, positions, k.transpose(0, 1).to(self.dtype))
        self.v[layer].index_copy_(1, positions, v.transpose(0, 1).to(self.dtype))

    def view(self, layer: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of positions 0..end-1 as float32: (n_kv_heads, end, head_dim)."""
        return self.k[layer][:, :end].float(), self.v[layer][:, :end].float()

    def truncate(self, n_tokens: int) -> None:
        """Forget positions from n_tokens on (their memory is simply overwritten later)."""
        del self.tokens[n_tokens:]

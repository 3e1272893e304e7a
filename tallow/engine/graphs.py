"""CUDA-graph decode: the whole one-token step, greedy argmax included, captured once and
replayed per token.

From Python on an H200 an eager kernel launch costs ~10 µs and a kernel inside a replayed
graph ~1 µs; a decode step is a few hundred kernels, so eager decode is launch-bound. The
step reads its token and position from static device buffers, writes K/V at that position
(index_copy_), attends over `seq_len` keys read on the device, and leaves the logits and the
argmax in static buffers: per token, Python only writes two small buffers, replays the
graph and reads one id back.

TALLOW_CUDA_GRAPHS=0 runs the same step eagerly (for bisecting).
"""

from __future__ import annotations

import os

import torch

from ..memory.kv_pool import KVPool


def graphs_enabled() -> bool:
    return os.environ.get("TALLOW_CUDA_GRAPHS", "1") != "0"


class GraphDecoder:
    """Replays model.forward_step(token, position, seq_len, kv) for one token at a time."""

    def __init__(self, model, kv: KVPool, device: torch.device):
        self.model = model
        self.kv = kv
        self.device = device
        self.token = torch.zeros(1, dtype=torch.long, device=device)
        self.position = torch.zeros(1, dtype=torch.long, device=device)
        self.seq_len = torch.ones(1, dtype=torch.int32, device=device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: torch.Tensor | None = None
        self.next_token: torch.Tensor | None = None
        if graphs_enabled():
            self._capture()

    def _run(self) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.model.forward_step(self.token, self.position, self.seq_len, self.kv)  # (1, vocab)
        return logits, torch.argmax(logits[0]).reshape(1)

    def _capture(self) -> None:
        # Warm-up runs execute, so they write K/V: point them at the next position, which the
        # real step writes before any step reads it (a ring's last slot may hold live keys).
        # (Capturing itself runs nothing.)
        self.position.fill_(min(len(self.kv.tokens), self.kv.n_ctx - 1))
        self.seq_len.fill_(1)
        # Warm up on a side stream (Triton compiles, cuBLAS picks algorithms), then capture.
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._run()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.logits, self.next_token = self._run()

    def step(self, token: int, position: int) -> torch.Tensor:
        """Run `token` at `position` (writing its K/V); return the logits (vocab,) on the device."""
        self.token.fill_(token)
        self.position.fill_(position)
        self.seq_len.fill_(position + 1)
        if self.graph is None:
            self.logits, self.next_token = self._run()
        else:
            self.graph.replay()
        return self.logits[0]

    def greedy(self) -> int:
        """The argmax of the last step's logits, computed on the device."""
        return int(self.next_token.item())

"""CUDA-graph decode: the whole one-token step, captured once and replayed per token.

From Python on an H200 an eager kernel launch costs ~10 µs and a kernel inside a replayed
graph ~1 µs; a decode step is a few hundred kernels, so eager decode is launch-bound. The
step reads its token and position from static device buffers, writes K/V at that position
(index_copy_), attends over `seq_len` keys read on the device, and leaves the logits in a
static buffer: per token, Python only writes small buffers and replays the graph; the sampler
takes the token from the logits on the device (sampling.greedy: one id comes back).

TALLOW_CUDA_GRAPHS=0 runs the same step eagerly (for bisecting).
"""

from __future__ import annotations


import torch

from ..memory.kv_pool import KVPool
from ..models.step import ALL, DECODE, PREFILL, VERIFY, Step
from .. import switches


def graphs_enabled() -> bool:
    return switches.enabled("TALLOW_CUDA_GRAPHS")


def capture(run, device: torch.device, pool=None, kv=None):
    """(graph, run's outputs): `run` warmed up twice on a side stream (Triton compiles, cuBLAS
    picks algorithms; its K/V writes are the ones a replay makes anyway), then captured. The
    warm-ups fold their rows into a recurrent state (memory/recurrent.py, kv.state) for real:
    it is put back as it was before the capture."""
    state = getattr(kv, "state", None)
    saved = state.snapshot() if state is not None else None
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(2):
            run()
    torch.cuda.current_stream(device).wait_stream(stream)
    if saved is not None:
        state.restore(saved, state.position)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = run()
    return graph, out


class GraphDecoder:
    """Replays model.run of one decode Step (token, position and seq_len in static device
    buffers) for one token at a time."""

    def __init__(self, model, kv: KVPool, device: torch.device):
        self.model = model
        self.kv = kv
        self.device = device
        self.token = torch.zeros(1, dtype=torch.long, device=device)
        self.position = torch.zeros(1, dtype=torch.long, device=device)
        self.seq_len = torch.ones(1, dtype=torch.int32, device=device)
        self.decode = Step(DECODE, self.token, self.position, self.position, self.seq_len, logits=ALL)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: torch.Tensor | None = None
        if graphs_enabled():
            self._capture()

    def _run(self) -> torch.Tensor:
        return self.model.run(self.decode, self.kv)  # (1, vocab)

    def _capture(self) -> None:
        # Warm-up runs execute, so they write K/V: point them at the next position, which the
        # real step writes before any step reads it (a ring's last slot may hold live keys).
        # (Capturing itself runs nothing.)
        self.position.fill_(min(len(self.kv.tokens), self.kv.n_ctx - 1))
        self.seq_len.fill_(1)
        self.graph, self.logits = capture(self._run, self.device, kv=self.kv)

    def step(self, token: int, position: int) -> torch.Tensor:
        """Run `token` at `position` (writing its K/V); return the logits (vocab,) on the device."""
        self.token.fill_(token)
        self.position.fill_(position)
        self.seq_len.fill_(position + 1)
        with self.kv.folding(position, 1):  # a recurrent state's position (a no-op for K/V)
            if self.graph is None:
                self.logits = self._run()
            else:
                self.graph.replay()
        return self.logits[0]


class RowGraphs:
    """Verification passes of speculative decoding: m = 2..max_rows consecutive decode tokens in
    one replayed graph of model.run of a VERIFY Step, one graph per m, captured on first use.

    Each row comes out bit for bit as a replay of the one-token GraphDecoder would compute it
    (step.RowsAttention: the GEMVs read the weights once for all rows but compute each row
    alone; attention runs row by row through the decode step's own kernels), so accepting drafts by comparing
    them with the tokens these rows yield leaves greedy text exactly as plain decoding writes
    it. A pass costs little more than one step: decode is bound by reading the weights.
    """

    def __init__(self, model, kv: KVPool, device: torch.device, max_rows: int):
        from ..kernels.gpu.linear import GEMV_MAX_ROWS

        if max_rows > GEMV_MAX_ROWS:  # more rows would leave the GEMV for cuBLAS: not row-exact
            raise ValueError(f"verification passes of {max_rows} rows exceed the GEMV's {GEMV_MAX_ROWS}")
        self.model = model
        self.kv = kv
        self.device = device
        self.max_rows = max_rows
        self.pool = torch.cuda.graph_pool_handle()  # one memory pool for all sizes: one replays at a time
        self.graphs: dict[int, tuple] = {}

    def _capture(self, inputs: torch.Tensor):
        tokens, positions = inputs[0], inputs[1]

        def run():
            return self.model.run(_rows_step(tokens, positions), self.kv)

        return capture(run, self.device, self.pool, self.kv)  # warmed up with the real inputs

    def run(self, tokens: list[int], start: int) -> torch.Tensor:
        """Logits (m, vocab) of `tokens` at positions start.., writing their K/V there. The
        caller updates kv.tokens."""
        m = len(tokens)
        if not 2 <= m <= self.max_rows or start + m > self.kv.n_ctx:
            raise ValueError(f"a verification pass takes 2..{self.max_rows} tokens inside the context, got {m} at {start}")
        host = torch.tensor([tokens, list(range(start, start + m))], dtype=torch.long).pin_memory()
        if not graphs_enabled():  # TALLOW_CUDA_GRAPHS=0: the same pass, eagerly
            inputs = host.to(self.device)
            logits = self.model.run(_rows_step(inputs[0], inputs[1]), self.kv)
            self.kv.mark_written(start + m - 1)
            return logits
        if m not in self.graphs:
            inputs = torch.empty((2, m), dtype=torch.long, device=self.device)  # outlives the graph
            inputs.copy_(host)
            self.graphs[m] = (inputs, *self._capture(inputs))
        inputs, graph, logits = self.graphs[m]
        inputs.copy_(host, non_blocking=True)
        graph.replay()
        self.kv.mark_written(start + m - 1)
        return logits.clone()  # the pool is shared: the next size's replay may reuse this memory


def _rows_step(tokens: torch.Tensor, positions: torch.Tensor) -> Step:
    """The verification Step of `tokens` at `positions` = p..p+m-1 (device tensors)."""
    return Step(VERIFY, tokens, positions, positions[:1], positions.int() + 1, logits=ALL)


def prefill_graphs_enabled() -> bool:
    return graphs_enabled() and switches.enabled("TALLOW_PREFILL_GRAPHS")


class PrefillGraphs:
    """Prefill chunks replayed from CUDA graphs, one per power-of-two bucket of 16..max_chunk
    tokens, captured on first use.

    Eager prefill on the GPU is host-bound: ~50 launches per layer from Python (dequantize,
    matmul, norms, RoPE, K/V writes, attention) cost more than the GPU's work below a few
    thousand tokens (measured: 89 ms of host time against 24 ms of kernels for 512 tokens on the
    qwen3-4b twin). A chunk of n tokens runs in the graph of the smallest bucket >= n, padded:
    the padding rows come after the real ones, so causal attention keeps them out of every real
    row, and their K/V land in positions the next tokens overwrite before anything reads them
    (a ring's slots too: the padding is shorter than the ring's chunk margin). Token ids, the
    chunk's start and its last real row are the only inputs, copied in with one transfer.
    TALLOW_PREFILL_GRAPHS=0 (or TALLOW_CUDA_GRAPHS=0) prefills eagerly.
    """

    MIN_BUCKET = 16

    def __init__(self, model, kv: KVPool, device: torch.device):
        self.model = model
        self.kv = kv
        self.device = device
        self.max_bucket = 1 << (max(kv.max_chunk, self.MIN_BUCKET).bit_length() - 1)  # a power of two <= max_chunk
        self.pool = torch.cuda.graph_pool_handle()  # one memory pool for all buckets: one replays at a time
        self.graphs: dict[int, tuple] = {}

    def bucket(self, n: int, start: int) -> int | None:
        size = self.MIN_BUCKET
        while size < n:
            size *= 2
        if size > self.max_bucket or start + size > self.kv.n_ctx:
            return None
        return size

    def _capture(self, size: int, inputs: torch.Tensor, arange: torch.Tensor):
        tokens, start, last = inputs[:size], inputs[size : size + 1], inputs[size + 1 :]

        def run():
            # Rows after `last` are padding: their K/V land in positions rewritten before anything reads them.
            return self.model.run(Step(PREFILL, tokens, arange + start, start, logits=last), self.kv)

        return capture(run, self.device, self.pool, self.kv)  # warmed up with the real inputs

    def run(self, chunk: list[int], start: int) -> torch.Tensor | None:
        """Logits (vocab,) of the chunk's last token after writing its K/V at start.., or None
        when no bucket fits (the caller prefills eagerly). The caller updates kv.tokens."""
        size = self.bucket(len(chunk), start)
        if size is None:
            return None
        host = torch.zeros(size + 2, dtype=torch.long, pin_memory=True)
        host[: len(chunk)] = torch.tensor(chunk, dtype=torch.long)
        host[size], host[size + 1] = start, len(chunk) - 1
        if size not in self.graphs:
            # Every tensor the graph reads must outlive it: a freed input's memory is reused and
            # the replay would read whatever lands there (found on the GPU: positions from a
            # freed arange indexed the RoPE table out of bounds).
            inputs = torch.empty(size + 2, dtype=torch.long, device=self.device)
            inputs.copy_(host)
            arange = torch.arange(size, device=self.device)
            self.graphs[size] = (inputs, arange, *self._capture(size, inputs, arange))
        inputs, _, graph, logits = self.graphs[size]
        inputs.copy_(host, non_blocking=True)
        with self.kv.folding(start, len(chunk)):  # a recurrent state folds the real rows only (n_valid on the device)
            graph.replay()
        self.kv.mark_written(start + size - 1)  # the padding wrote K/V up to there
        return logits[0].clone()  # the pool is shared: a later bucket's replay may reuse this memory

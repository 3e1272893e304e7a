"""Which CPU kernels give row i the same bits however many rows share the call (docs/performance.md,
"The same greedy answer whatever the cache holds"). Prints the (M, offset) or (start, end) cases
that differ from the full call; an empty list means row-invariant. Dev only:

    PYTHONPATH=. python scripts/row_invariance.py
"""

import torch
import torch.nn.functional as F

from tallow.kernels.cpu import dequant_matmul as dm

torch.manual_seed(0)


def rows(name, fn, k):
    x = torch.randn(512, k)
    ref = fn(x)
    bad = [(m, off) for m in (1, 2, 9, 32, 63, 64, 65, 66, 100, 130, 192, 256, 300, 511) for off in (0, 512 - m, 7)
           if off + m <= 512 and not torch.equal(fn(x[off:off + m].contiguous()), ref[off:off + m])]
    print(f"{name}: {bad[:8]}")


for k, n in ((576, 1536), (1536, 576)):
    w = torch.randn(n, k)
    rows(f"F.linear fp32 K={k}", lambda x: F.linear(x, w), k)
    q = torch.randint(0, 16, (n, k), dtype=torch.int32)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
    sz = (torch.randn(k // 32, n, 2) / 20).bfloat16()
    rows(f"int4 kernel K={k}", lambda x: torch.ops.aten._weight_int4pack_mm_for_cpu(x.bfloat16(), packed, 32, sz), k)
    rows(f"int4 dequantized tile K={k}", lambda x: dm.int4_dequant_mm(x.bfloat16(), packed, sz, n), k)
    w8 = torch.randint(-127, 127, (n, k), dtype=torch.int8)
    s8 = (torch.rand(n) / 50).bfloat16()
    rows(f"int8 kernel K={k}", lambda x: torch.ops.aten._weight_int8pack_mm(x.bfloat16(), w8, s8), k)
    rows(f"int8 dequantized tile K={k}", lambda x: dm.int8_dequant_mm(x.bfloat16(), w8, s8), k)

H, KVH, D, T = 9, 3, 64, 1600
q, k, v = torch.randn(H, T, D), torch.randn(KVH, T, D), torch.randn(KVH, T, D)


def attn(s, e, window, pad):
    """Queries s..e-1 over the keys they may see, as models/step.EagerAttention calls SDPA (pad: the
    row-invariant form, keys to whole 512-blocks, queries to a multiple of 64)."""
    lo = max(0, s - window + 1) if window else 0
    a, b = (lo // 512 * 512, -(-e // 512) * 512) if pad else (lo, e)
    kk, vv = torch.zeros(KVH, b - a, D), torch.zeros(KVH, b - a, D)
    kk[:, lo - a:e - a], vv[:, lo - a:e - a] = k[:, lo:e], v[:, lo:e]
    extra = -(e - s) % 64 if pad else 0
    qq = torch.cat([q[:, s:e], q[:, e - 1:e].expand(-1, extra, -1)], 1)
    pos = torch.cat([torch.arange(s, e), torch.full((extra,), e - 1)])
    diff = pos[:, None] - torch.arange(a, b)[None, :]
    mask = (diff >= 0) & (diff < window) if window else diff >= 0
    return F.scaled_dot_product_attention(qq[None], kk[None], vv[None], attn_mask=mask, scale=0.125, enable_gqa=True)[0][:, :e - s]


for window in (None, 512):
    for pad in (False, True):
        full = torch.cat([attn(s, min(T, s + 512), window, pad) for s in range(0, T, 512)], dim=1)
        cases = [(s, e) for s in range(0, 1100, 37) for e in (s + 64, s + 66, s + 130, s + 500)]
        bad = [(s, e) for s, e in cases if not torch.equal(attn(s, e, window, pad), full[:, s:e])]
        print(f"SDPA window={window} padded={pad}: {len(bad)} of {len(cases)} differ {bad[:4]}")

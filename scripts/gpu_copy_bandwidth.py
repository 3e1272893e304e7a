"""The device's copy bandwidth (read + write of a 4 GiB buffer, 10 copies after 3 warm-ups), and with the bytes
a token reads, the decode floor (bytes / bandwidth). Used by the GPU lease scripts (gpu_moegpu.sh, gpu_moe_s12.sh).

    python3 scripts/gpu_copy_bandwidth.py [BYTES_PER_TOKEN]
"""

import sys

import torch

x = torch.empty(1 << 31, dtype=torch.float16, device="cuda")
y = torch.empty_like(x)
for _ in range(3):
    y.copy_(x)
torch.cuda.synchronize()
s, e = torch.cuda.Event(True), torch.cuda.Event(True)
s.record()
for _ in range(10):
    y.copy_(x)
e.record()
torch.cuda.synchronize()
bw = 2 * x.numel() * 2 * 10 / (s.elapsed_time(e) / 1e3)
print(f"device copy bandwidth {bw / 1e9:.0f} GB/s (read+write, 4 GiB, 10 copies)")
active = int(sys.argv[1]) if len(sys.argv) > 1 else 0
if active:
    print(f"bandwidth floor: {active / 1e9:.3f} GB read per token / {bw / 1e9:.0f} GB/s = {active / bw * 1e3:.3f} ms "
          f"= {bw / active:.0f} tok/s at most")

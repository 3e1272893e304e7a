"""What glibc's one malloc arena holds after each prefill chunk of a long prompt on the CPU, beside the
process's resident size and high-water mark (MiB above the post-import baseline):

    python scripts/heap_trace.py MODEL CTX

A fresh process loads MODEL at context CTX, prefills CTX - 17 tokens (the bench's depth context) and
decodes 16. After every chunk it prints the position reached, then from mallinfo2 the heap's size
(`arena`), the bytes in use there (`inuse`) and free but kept (`free`), the bytes in mmapped blocks;
then VmRSS and VmHWM. Last, the plan's total and the peak."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from proc_memory import MALLINFO_SOURCE, STATUS_SOURCE  # noqa: E402

exec(STATUS_SOURCE + MALLINFO_SOURCE)  # status(key) and mallinfo(), as the tests read them
os.environ.setdefault("TALLOW_PERSIST_KV", "0")

import tallow  # noqa: E402
from tallow import bench  # noqa: E402
from tallow.engine.engine import Engine  # noqa: E402

MiB = 1 << 20
path, ctx = sys.argv[1], int(sys.argv[2])
base = status("VmRSS:")
open("/proc/self/clear_refs", "w").write("5")  # VmHWM := VmRSS now
llm = tallow.LLM(path, ctx=ctx, device="cpu")
chunk_at = Engine.prefill_chunk_at


def traced(self, chunk, start):
    out = chunk_at(self, chunk, start)
    m = mallinfo()
    print(start + len(chunk), *(f"{v / MiB:.1f}" for v in (m.arena, m.uordblks, m.fordblks, m.hblkhd,
                                                          status("VmRSS:") - base, status("VmHWM:") - base)), flush=True)
    return out


Engine.prefill_chunk_at = traced
print("pos arena inuse free mmapped rss hwm")
llm.generate(bench._context(llm, ctx - 17), max_tokens=16, temperature=0)
print(f"plan {llm.memory.total / MiB:.1f} peak {(status('VmHWM:') - base) / MiB:.1f}")

"""scripts/peak_at_depth.py's run, then what glibc's one malloc arena holds at its end (mallinfo2, MiB):
`arena` the heap's size, `uordblks` in use there, `fordblks` free but kept, `hblkhd` in mmapped blocks.

    python scripts/heap_at_depth.py MODEL CTX [DECODE]
"""
import ctypes
import json
import os
import runpy
import sys


class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
sys.argv = ["peak_at_depth.py", *sys.argv[1:]]
runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "peak_at_depth.py"), run_name="__main__")
info = libc.mallinfo2()
print(json.dumps({k: round(getattr(info, k) / (1 << 20), 1) for k in ("arena", "hblkhd", "uordblks", "fordblks", "keepcost")}
                 | {"hblks": info.hblks}))

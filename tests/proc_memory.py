"""Memory figures of a test's child process, as sources the peak-memory scripts (run with `python -c`,
or exec'd by scripts/) start with:
- STATUS_SOURCE: `status(key)`, bytes of a /proc/self/status field such as "VmRSS:" or "VmHWM:";
- SMAPS_SOURCE: `mapping_rss(name)`, the resident bytes of the mappings /proc/self/smaps names `name`
  (a file's path, or "[heap]": glibc's main arena);
- MALLINFO_SOURCE: `mallinfo()`, glibc's mallinfo2 (fields arena, uordblks: in use, fordblks: free, hblkhd: mmapped)."""

STATUS_SOURCE = '''
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
'''

SMAPS_SOURCE = '''
def mapping_rss(name):
    total, inside = 0, False
    for line in open("/proc/self/smaps"):
        head = line.split()
        if "-" in head[0] and len(head) >= 5:
            inside = head[-1] == name
        elif inside and head[0] == "Rss:":
            total += int(head[1]) * 1024
    return total
'''

MALLINFO_SOURCE = '''
import ctypes as _ctypes
class _MallInfo2(_ctypes.Structure):
    _fields_ = [(_n, _ctypes.c_size_t) for _n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                                                 "uordblks", "fordblks", "keepcost")]
_libc = _ctypes.CDLL("libc.so.6")
_libc.mallinfo2.restype = _MallInfo2
def mallinfo():
    return _libc.mallinfo2()
'''

"""Memory figures of a test's child process, read from /proc/self/status: the source of a
`status(key)` function (bytes of a field such as "VmRSS:" or "VmHWM:") that the peak-memory
scripts, run with `python -c`, start with."""

STATUS_SOURCE = '''
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
'''

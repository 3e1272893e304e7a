"""Shared test setup.

tallow parses its TALLOW_* variables once (tallow/switches.py) and re-parses them at each model
load. Tests that flip a switch with monkeypatch and then call a kernel directly must see the new
value, and the next test must see the old one again: monkeypatch's setenv, delenv and undo
forget the parsed snapshot when they touch a TALLOW_* name.
"""

import os

# Under pytest-xdist (the README's `-n 2`) each worker is a process with its own torch: left at
# torch's default (one thread per core) two workers would run 2 x cores threads and OpenMP's
# spinning threads would fight over the cores. Each worker gets its share of the cores instead,
# set before any test module imports torch, so that torch's pool, the C kernel (which takes torch's
# thread count) and the CLI/server subprocesses the tests spawn (they inherit the variable) agree.
# An OMP_NUM_THREADS already set is left alone.
_WORKER_THREADS = None
if os.environ.get("PYTEST_XDIST_WORKER") and "OMP_NUM_THREADS" not in os.environ:
    _workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    _WORKER_THREADS = max(1, len(os.sched_getaffinity(0)) // _workers)
    os.environ["OMP_NUM_THREADS"] = str(_WORKER_THREADS)

import pytest  # noqa: E402

from tallow import switches  # noqa: E402

if _WORKER_THREADS is not None:
    import torch

    torch.set_num_threads(_WORKER_THREADS)  # in case a plugin imported torch before us

_setenv, _delenv, _undo = pytest.MonkeyPatch.setenv, pytest.MonkeyPatch.delenv, pytest.MonkeyPatch.undo


def _setenv_refreshing(self, name, value, prepend=None):
    _setenv(self, name, value, prepend)
    if str(name).startswith("TALLOW_"):
        switches.refresh()


def _delenv_refreshing(self, name, raising=True):
    _delenv(self, name, raising)
    if str(name).startswith("TALLOW_"):
        switches.refresh()


def _undo_refreshing(self):
    _undo(self)
    switches.refresh()


pytest.MonkeyPatch.setenv = _setenv_refreshing
pytest.MonkeyPatch.delenv = _delenv_refreshing
pytest.MonkeyPatch.undo = _undo_refreshing



# Triton's interpreter re-patches triton.language at every @triton.jit helper call; most of the
# interpreted kernel tests' time went there (tests/fast_interpreter.py). Applied once some test
# module has imported triton (under the TRITON_INTERPRET it chose): importing it here, first,
# would make triton.language's own @jit helpers compiled-mode functions.
def pytest_runtest_setup(item):
    import sys

    if "triton" in sys.modules:
        import fast_interpreter

        fast_interpreter.apply()

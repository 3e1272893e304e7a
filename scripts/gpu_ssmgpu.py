"""mamba, mamba2 and falcon-h1 on the GPU (issue 17): correctness against the CPU and llama.cpp,
then speed. Run on the GPU machine by scripts/gpu_ssmgpu.sh; one JSON line per result.

    python scripts/gpu_ssmgpu.py final [--work DIR]     the lead's 60-second call: a short check, then speed beside llama.cpp
    python scripts/gpu_ssmgpu.py check [--work DIR]     correctness (PASS/FAIL lines, exit 1 on a FAIL)
    python scripts/gpu_ssmgpu.py kernels                the conv and scan alone: Triton vs torch, µs
    python scripts/gpu_ssmgpu.py bench [--work DIR]     tallow bench on mid-size models (and twins)

check, for each tiny model of tests/tiny_models.py (F32, as the fixtures; and Q8_0, the Triton
GEMV path):
  fixture_logits  the eager GPU forward of the fixture's 40-token prompt against llama.cpp's
                  logits (tests/fixtures/tiny_<arch>.json; F32 only)
  greedy          tallow.load(..., device="cuda").generate: prefill through the padded chunk
                  graphs, decode through the decode graph: the fixture's 16 greedy tokens (F32),
                  or the CPU's (Q8_0)
  graph_decode    teacher-forced: prefill 20 tokens (a graph bucket of 32, padded), then 20 decode
                  graph replays, logits against the CPU's one-pass logits (max |Δ|, top-1 agreement)
  switches        the same greedy tokens with TALLOW_SSM_TRITON=0 (torch ops on the GPU, in the
                  graphs) and with TALLOW_CUDA_GRAPHS=0 (eager)
  prefix_reuse    a second prompt sharing 24 tokens reuses a state checkpoint and decodes as cold
bench: pp512 and tg64 (tallow/bench.py's loops, in this process) on mid-size random Q8_0
models (shapes below) with the Triton mixer (and tg64 after 4096 tokens), and with
TALLOW_SSM_TRITON=0; SSMGPU_TWINS=1 adds the study's twins (scripts/make_ssm_twin.py, where the
branch has it: mamba-1.4b, falcon-h1-0.5b, Q4_K_M).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import torch  # noqa: E402
from gpu_timing import time_us  # noqa: E402

ARCHS = ("mamba", "mamba2", "falcon-h1")
# Mid-size shapes for timing (24 layers each; random weights, byte vocabulary): Mamba-1 of
# dim 1024; Mamba-2 with 32 heads of 64 and d_state 128; Falcon-H1 0.5B-like mixer and attention.
MID = {
    "mamba": dict(dim=1024, d_inner=2048, d_state=16, dt_rank=64),
    "mamba2": dict(dim=1024, d_inner=2048, d_state=128, n_head=32),
    "falcon-h1": dict(dim=1024, d_inner=1536, d_state=128, n_head=24, n_heads=8, n_kv=2, head_dim=64, ffn=2048),
}
FAILED = []
# max |Δlogit| GPU vs the CPU's fp32 reference: F32 weights run fp32 products on both sides;
# Q8_0 prefill rounds activations to bf16 for cuBLAS (~1e-2 on these logits of std ~1).
BOUND = {"f32": 1e-3, "q8_0": 0.15}
# falcon-h1's attention: the flash prefill kernel rounds P to fp16 for P @ V (as llama.cpp's CUDA
# flash attention does): 1.5e-3 measured on the H200 (21:12 run), so 5e-3 there.
HYBRID_F32_BOUND = 5e-3
DEVICE = os.environ.get("SSMGPU_DEVICE", "cuda")  # cpu: a dry run of the script's logic without a GPU


def report(name: str, ok: bool | None, **fields) -> None:
    status = "INFO" if ok is None else ("PASS" if ok else "FAIL")
    if ok is False:
        FAILED.append(name)
    print(json.dumps({"check": name, "status": status, **fields}), flush=True)


def _env(**values):
    """Set TALLOW_* variables for the next load (tallow.load re-reads them)."""
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def _teacher_forced(llm, ids: list[int]) -> torch.Tensor:
    """Logits after ids[:20] prefilled through the engine (on the GPU: a padded chunk graph),
    then after each of ids[20:39] through engine.decode_step (the decode graph): (20, vocab)."""
    from tallow.engine.engine import GenerationStats

    llm.engine.reset()
    rows = [llm.engine.prefill(ids[:20], GenerationStats()).float().cpu()]
    rows += [llm.engine.decode_step(t).float().cpu() for t in ids[20:39]]
    assert llm.engine.kv.state.position == 39
    return torch.stack(rows)


def _greedy(engine, prompt: list[int], n: int = 8) -> tuple[list[int], int]:
    """(greedy tokens, prompt tokens reused) through engine.generate."""
    from tallow.engine.engine import GenerationStats
    from tallow.sampling import Sampler, SamplingParams

    stats = GenerationStats()
    sampler = Sampler(SamplingParams(temperature=0.0), engine.model.spec.vocab_size)
    return list(engine.generate(prompt, n, sampler, set(), stats)), stats.reused_tokens


def check(work: Path) -> None:
    import tallow
    from gguf import GGMLQuantizationType as QT

    from tallow.engine.engine import Engine, GenerationStats
    from tallow.memory.recurrent import make_memory
    from tiny_models import tiny_prompt, write_tiny_ssm

    for arch in ARCHS:
        fixture = json.loads((ROOT / "tests" / "fixtures" / f"tiny_{arch}.json").read_text())
        ids = fixture["ids"]
        for qname, qtype in (("f32", QT.F32), ("q8_0", QT.Q8_0)):
            tag = f"{arch}/{qname}"
            path = write_tiny_ssm(arch, work / f"tiny-{arch}-{qname}.gguf", qtype=qtype)
            try:
                # The CPU reference: every weight dequantized to fp32 (the GPU's Q8_0 prefill runs
                # bf16 GEMMs, its decode fp32 GEMVs: BOUND says how far each may drift).
                cpu = tallow.load(str(path), ctx=128, device="cpu", linear_mode="reference")
                want = cpu.model.forward(ids, 0, make_memory(cpu.spec, 64, "f32"), all_logits=True).float()
                cpu_greedy = cpu.generate(ids, max_tokens=16).tokens
                cpu_rows = _teacher_forced(cpu, ids)
                bound = HYBRID_F32_BOUND if arch == "falcon-h1" and qname == "f32" else BOUND[qname]
                gpu = tallow.load(str(path), ctx=128, device=DEVICE)
                got = gpu.model.forward(ids, 0, make_memory(gpu.spec, 64, "f32", device=gpu.model.device),
                                        all_logits=True).float().cpu()  # F32 K/V, as the fixture
                report(f"{tag} eager_vs_cpu", (got - want).abs().max().item() < bound,
                       max_abs=(got - want).abs().max().item(), top1=(got.argmax(-1) == want.argmax(-1)).float().mean().item())
                if qname == "f32":
                    ref = torch.tensor(fixture["logits"])
                    report(f"{tag} fixture_logits", (got - ref).abs().max().item() < bound, max_abs=(got - ref).abs().max().item())
                expected = fixture["greedy"]["ids"] if qname == "f32" else cpu_greedy
                t0 = time.perf_counter()
                out = gpu.generate(ids, max_tokens=16)
                # speculation steps aside on the GPU (RecurrentMemory.can_rollback): no drafts there
                no_drafts = out.stats.draft_tokens == 0 or DEVICE == "cpu"
                report(f"{tag} greedy", out.tokens == expected and no_drafts, tokens=out.tokens,
                       expected=expected, drafts=out.stats.draft_tokens,
                              cpu_equal=cpu_greedy == expected, s=round(time.perf_counter() - t0, 3))
                # teacher-forced: a graph prefill, then decode graph replays, against the CPU engine
                got_rows, want_rows = _teacher_forced(gpu, ids), cpu_rows
                report(f"{tag} graph_decode", (got_rows - want_rows).abs().max().item() < bound,
                       max_abs=(got_rows - want_rows).abs().max().item(),
                       top1=(got_rows.argmax(-1) == want_rows.argmax(-1)).float().mean().item())
                for switch in ("TALLOW_SSM_TRITON", "TALLOW_CUDA_GRAPHS"):
                    _env(**{switch: "0"})
                    try:
                        alt = tallow.load(str(path), ctx=128, device=DEVICE)
                        tokens = alt.generate(ids, max_tokens=16).tokens
                        report(f"{tag} {switch}=0 greedy", tokens == expected, tokens=tokens)
                        del alt
                    finally:
                        _env(**{switch: None})
                # prefix reuse: an engine with chunks of 32 (prefill graphs of bucket 32) keeps state
                # checkpoints at 32, 64, 96, 100; a second prompt leaving the first after 90 tokens
                # restores the one at 64 and must answer bit for bit as a cold engine
                prompt = tiny_prompt(100, seed=3)
                second = prompt[:90] + tiny_prompt(20, seed=4)
                warm = Engine(gpu.model, 256, prefill_chunk=32)
                _greedy(warm, prompt)
                tokens, reused = _greedy(warm, second)
                cold_tokens, _ = _greedy(Engine(gpu.model, 256, prefill_chunk=32), second)
                a, b = Engine(gpu.model, 256, prefill_chunk=32), Engine(gpu.model, 256, prefill_chunk=32)
                a.prefill(prompt, GenerationStats())
                same = torch.equal(a.prefill(second, GenerationStats()).cpu(), b.prefill(second, GenerationStats()).cpu())
                report(f"{tag} prefix_reuse", reused == 64 and tokens == cold_tokens and same,
                       reused=reused, warm=tokens, cold=cold_tokens, logits_equal=same)
                del gpu, warm, a, b
            except Exception as e:  # one model's failure must not hide the others'
                import traceback

                traceback.print_exc()
                report(f"{tag} error", False, error=f"{type(e).__name__}: {e}")
            torch.cuda.empty_cache()


def bench(work: Path) -> None:
    """In one process (the lead's run has ~2 minutes): pp512 (3 runs after a warm-up: Triton
    compiles, graphs capture) and tg64 at depth 0, and tg64 after 4096 tokens, through the
    engine's real paths (tallow/bench.py: prefill chunks through the prefill graphs, decode
    through the decode graph); then pp512 and tg16 once with TALLOW_SSM_TRITON=0 (and prefill
    graphs off: a chunk of the torch scan is ~150k launches, too many to capture)."""
    import tallow
    from gguf import GGMLQuantizationType as QT

    from tallow.bench import bench_decode, bench_prefill
    from tiny_models import write_tiny_ssm

    models = []
    for arch, shape in MID.items():
        path = work / f"mid-{arch}-q8_0.gguf"
        if not path.exists():
            t0 = time.perf_counter()
            write_tiny_ssm(arch, path, qtype=QT.Q8_0, n_layers=24, shape={**shape, "context": 8192})
            report(f"write {path.name}", None, s=round(time.perf_counter() - t0, 1), mib=round(path.stat().st_size / 2**20, 1))
        models.append(path)
    twin_script = ROOT / "scripts" / "make_ssm_twin.py"
    if twin_script.exists() and os.environ.get("SSMGPU_TWINS") == "1":
        for name in ("mamba-1.4b", "falcon-h1-0.5b"):
            path = work / f"{name}.gguf"
            if not path.exists():
                t0 = time.perf_counter()
                subprocess.run([sys.executable, str(twin_script), name, str(path)], check=True)
                report(f"write {path.name}", None, s=round(time.perf_counter() - t0, 1))
            models.append(path)
    depth = int(os.environ.get("SSMGPU_DEPTH", "4096"))
    pp, tg = int(os.environ.get("SSMGPU_PP", "512")), int(os.environ.get("SSMGPU_TG", "64"))
    for path in models:
        for triton_on in (True, False):
            _env(TALLOW_SSM_TRITON=None if triton_on else "0", TALLOW_PREFILL_GRAPHS=None if triton_on else "0")
            t0 = time.perf_counter()
            try:
                llm = tallow.load(str(path), ctx=depth + pp + 16, device=DEVICE)
                g = torch.Generator().manual_seed(0)
                reps = 3 if triton_on else 1
                pps = [bench_prefill(llm, pp, 0, g) for _ in range(reps + 1)][1:]
                tgs = [bench_decode(llm, tg if triton_on else max(1, tg // 4), 0, g) for _ in range(reps + 1)][1:]
                fields = {"pp": round(sorted(pps)[len(pps) // 2], 1), "tg": round(sorted(tgs)[len(tgs) // 2], 1),
                          "pp_runs": [round(v, 1) for v in pps], "tg_runs": [round(v, 1) for v in tgs]}
                if triton_on and depth:
                    fields[f"tg_at_{depth}"] = round(bench_decode(llm, tg, depth, g), 1)
                fields["weights_mib"] = round(llm.model.nbytes / 2**20, 1)
                fields["state_mib"] = round(llm.engine.kv.state.nbytes / 2**20, 2)
                report(f"bench {path.name} ssm_triton={int(triton_on)}", None, n_prompt=pp, n_gen=tg, **fields,
                       wall_s=round(time.perf_counter() - t0, 1))
                del llm
            except Exception as e:
                report(f"bench {path.name} ssm_triton={int(triton_on)}", False, error=f"{type(e).__name__}: {e}")
            finally:
                _env(TALLOW_SSM_TRITON=None, TALLOW_PREFILL_GRAPHS=None)
            if DEVICE == "cuda":
                torch.cuda.empty_cache()


def final(work: Path) -> None:
    """The lead's last call gives this 60 s: the most valuable results first, each step only if
    the time left (SSMGPU_BUDGET_S, default 48 s from the start of this process: the shell and the imports take the rest) fits it.
    1. correctness of this HEAD on the GPU, short: for each tiny model (F32), greedy through the
       graphs against llama.cpp's 16 tokens, no drafts, and teacher-forced decode-graph logits
       against the CPU; the Q8_0 falcon-h1 greedy (Triton GEMVs, fused attention inputs).
    2. speed beside llama.cpp on the same file: the 24-layer Q8_0 mid models (MID; mamba first,
       then falcon-h1, then mamba2): tallow pp512 and tg64 (median of 2 after a warm-up), then
       `$LLAMA_BENCH -p 512 -n 64 -r 2 -ngl 99 -fa 1` on it when LLAMA_BENCH is given."""
    import tallow
    from gguf import GGMLQuantizationType as QT

    from tallow.bench import bench_decode, bench_prefill
    from tiny_models import write_tiny_ssm

    t_start = time.perf_counter()
    budget = float(os.environ.get("SSMGPU_BUDGET_S", "48"))
    # The mid models are written by processes of their own (numpy, other cores) while the check runs.
    writers = {}
    for arch in ("mamba", "falcon-h1", "mamba2"):
        path = work / f"mid-{arch}-q8_0.gguf"
        if not path.exists():
            code = (f"import sys; sys.path[:0] = [{str(ROOT)!r}, {str(ROOT / 'tests')!r}]\n"
                    "from gguf import GGMLQuantizationType as QT\nfrom tiny_models import write_tiny_ssm\n"
                    f"write_tiny_ssm({arch!r}, {str(path) + '.part'!r}, qtype=QT.Q8_0, n_layers=24, "
                    f"shape={ {**MID[arch], 'context': 8192}!r})\n"
                    f"import os; os.replace({str(path) + '.part'!r}, {str(path)!r})")
            writers[arch] = subprocess.Popen([sys.executable, "-c", code])

    def fits(seconds: float, what: str) -> bool:
        left = budget - (time.perf_counter() - t_start)
        if left < seconds:
            report(f"skipped {what}", None, left_s=round(left, 1), needs_s=seconds)
            return False
        return True

    for arch, qname in (("mamba", "f32"), ("mamba2", "f32"), ("falcon-h1", "f32"), ("falcon-h1", "q8_0")):
        if not fits(4, f"{arch}/{qname} check"):
            break
        tag = f"{arch}/{qname}"
        try:
            fixture = json.loads((ROOT / "tests" / "fixtures" / f"tiny_{arch}.json").read_text())
            ids = fixture["ids"]
            path = write_tiny_ssm(arch, work / f"tiny-{arch}-{qname}.gguf", qtype=QT.F32 if qname == "f32" else QT.Q8_0)
            cpu = tallow.load(str(path), ctx=128, device="cpu", linear_mode="reference")
            expected = fixture["greedy"]["ids"] if qname == "f32" else cpu.generate(ids, max_tokens=16).tokens
            gpu = tallow.load(str(path), ctx=128, device=DEVICE)
            out = gpu.generate(ids, max_tokens=16)
            no_drafts = out.stats.draft_tokens == 0 or DEVICE == "cpu"
            report(f"{tag} greedy", out.tokens == expected and no_drafts, tokens=out.tokens, expected=expected,
                   drafts=out.stats.draft_tokens)
            got, want = _teacher_forced(gpu, ids), _teacher_forced(cpu, ids)
            bound = HYBRID_F32_BOUND if arch == "falcon-h1" and qname == "f32" else BOUND[qname]
            report(f"{tag} graph_decode", (got - want).abs().max().item() < bound, max_abs=(got - want).abs().max().item(),
                   top1=(got.argmax(-1) == want.argmax(-1)).float().mean().item())
            del cpu, gpu
        except Exception as e:
            import traceback

            traceback.print_exc()
            report(f"{tag} error", False, error=f"{type(e).__name__}: {e}")
    llama_bench = os.environ.get("LLAMA_BENCH")
    pp, tg = int(os.environ.get("SSMGPU_PP", "512")), int(os.environ.get("SSMGPU_TG", "64"))
    for arch in ("mamba", "falcon-h1", "mamba2"):
        if not fits(14 if llama_bench else 9, f"{arch} speed"):
            break
        path = work / f"mid-{arch}-q8_0.gguf"
        try:
            if arch in writers:
                t0 = time.perf_counter()
                writers[arch].wait(timeout=max(1.0, budget - (time.perf_counter() - t_start)))
                report(f"write {path.name}", path.exists() or None, waited_s=round(time.perf_counter() - t0, 1),
                       done_at_s=round(time.perf_counter() - t_start, 1))
            t0 = time.perf_counter()
            llm = tallow.load(str(path), ctx=1024, device=DEVICE)
            g = torch.Generator().manual_seed(0)
            pps = [bench_prefill(llm, pp, 0, g) for _ in range(3)][1:]
            tgs = [bench_decode(llm, tg, 0, g) for _ in range(3)][1:]
            report(f"speed {path.name} tallow", None, **{f"pp{pp}": [round(v, 1) for v in pps], f"tg{tg}": [round(v, 1) for v in tgs]},
                   weights_mib=round(llm.model.nbytes / 2**20, 1), wall_s=round(time.perf_counter() - t0, 1))
            del llm
            if DEVICE == "cuda":
                torch.cuda.empty_cache()
            if llama_bench and fits(6, f"{arch} llama-bench"):
                t0 = time.perf_counter()
                r = subprocess.run([llama_bench, "-m", str(path), "-p", str(pp), "-n", str(tg), "-r", "2", "-ngl", "99", "-fa", "1"],
                                   capture_output=True, text=True, timeout=max(5.0, budget - (time.perf_counter() - t_start)))
                rows = [line for line in r.stdout.splitlines() if line.startswith("|") and (f"pp{pp}" in line or f"tg{tg}" in line)]
                report(f"speed {path.name} llama.cpp", None if r.returncode == 0 else False, rows=rows,
                       stderr=r.stderr[-600:] if r.returncode else "", wall_s=round(time.perf_counter() - t0, 1))
        except Exception as e:
            report(f"speed {path.name}", False, error=f"{type(e).__name__}: {e}")
    for w in writers.values():  # a skipped model's writer: not left running
        if w.poll() is None:
            w.kill()


# (heads, head_dim, groups, d_state, version) of one mixer layer; the rows of a call
KERNEL_SHAPES = {"mamba-1.4b": (4096, 1, 1, 16, 1), "falcon-h1-0.5b": (24, 64, 1, 128, 2),
                 "falcon-h1-1.5b": (48, 64, 1, 256, 2), "falcon-h1-3b": (32, 128, 1, 256, 2)}
KERNEL_ROWS = (1, 512)


def kernels(work: Path) -> None:
    """The mixer's ops alone on the study's shapes (Mamba-1.4B's layer: 4096 channels, d_state 16;
    Falcon-H1-0.5B's: 24 heads of 64, d_state 128, one group), a decode step and a 512-token
    chunk: Triton (the scan at several rows per program) against the torch references, µs per
    call from CUDA events over 20 calls after 3 warm-ups."""
    from tallow.kernels.ssm_ops import TorchMixerOps
    from tallow.kernels.triton.ssm import ssm_conv, ssm_scan

    dev = torch.device(DEVICE)

    def timed(fn, reps: int = 20) -> float:
        return time_us(fn, reps, 3, dev.type)

    g = torch.Generator(device=dev).manual_seed(0)
    for name, (heads, head_dim, groups, d_state, version) in KERNEL_SHAPES.items():
        rows, conv_ch = heads * head_dim, heads * head_dim + (2 * groups * d_state if version == 2 else 0)
        for n in KERNEL_ROWS:
            r = lambda *shape: torch.randn(*shape, generator=g, device=dev)
            x, dt, bc, z = r(n, rows), r(n, heads), r(n, 2 * groups * d_state), r(n, rows)
            A = -r(heads, d_state).abs() if version == 1 else -r(heads).abs()
            state, D, dtb = r(heads, head_dim, d_state), r(heads), r(heads) if version == 2 else None
            B, C = bc[:, : groups * d_state], bc[:, groups * d_state :]
            cx, cstate, cw, cb = r(n, conv_ch), r(3, conv_ch), r(conv_ch, 4), r(conv_ch)
            torch_ops = TorchMixerOps()
            # Correctness at these shapes first (many conv row tiles, many scan programs): outputs
            # and updated states against the torch ops from the same starting states.
            errs = {}
            for op, triton_fn, torch_fn, st in (
                    ("conv", lambda s_: ssm_conv(cx, s_, cw, cb), lambda s_: torch_ops.conv(cx, s_, cw, cb), cstate),
                    ("scan", lambda s_: ssm_scan(s_, x, dt, A, B, C, None, dtb, D, z),
                     lambda s_: torch_ops.scan(s_, x, dt, A, B, C, None, dtb, D, z), state)):
                s1, s2 = st.clone(), st.clone()
                y1, y2 = triton_fn(s1), torch_fn(s2)
                errs[op] = max(((y1 - y2).norm() / y2.norm()).item(), ((s1 - s2).norm() / s2.norm()).item())
            report(f"kernels {name} n={n} vs torch", max(errs.values()) < 1e-4, **{f"{k}_rel_err": v for k, v in errs.items()})
            fields = {"conv_triton_us": timed(lambda: ssm_conv(cx, cstate, cw, cb)),
                      "conv_torch_us": timed(lambda: torch_ops.conv(cx, cstate, cw, cb)),
                      "scan_torch_us": timed(lambda: torch_ops.scan(state, x, dt, A, B, C, None, dtb, D, z), 3 if n > 1 else 20)}
            for block_r in (1, 2, 4, 8, 16, 32):
                if block_r * triton_pow2(d_state) <= 4096:
                    fields[f"scan_triton_r{block_r}_us"] = timed(lambda: ssm_scan(state, x, dt, A, B, C, None, dtb, D, z, block_r=block_r))
            fields["scan_triton_default_us"] = timed(lambda: ssm_scan(state, x, dt, A, B, C, None, dtb, D, z))
            report(f"kernels {name} n={n}", None, **{k: round(v, 1) for k, v in fields.items()})


def triton_pow2(v: int) -> int:
    return 1 << (v - 1).bit_length()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=("final", "check", "kernels", "bench"))
    p.add_argument("--work", type=Path, default=Path("/tmp/ssmgpu"))
    a = p.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    print(json.dumps({"device": torch.cuda.get_device_name(0) if DEVICE == "cuda" else DEVICE,
                      "torch": torch.__version__}), flush=True)
    {"final": final, "check": check, "kernels": kernels, "bench": bench}[a.what](a.work)
    if FAILED:
        print(f"FAILED: {', '.join(FAILED)}", flush=True)
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())

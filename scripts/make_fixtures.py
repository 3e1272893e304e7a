"""Regenerate the llama.cpp conformance fixtures (dev only: needs llama-cpp-python for its
bindings, and llama.cpp b11434 unpacked to /tmp/llama, see scripts/numerics_reference.py).

    pip install ../shared/wheels/llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl
    mkdir -p /tmp/llama && tar xJf ../shared/llama.cpp/llama-b11434-cpu.tar.xz -C /tmp/llama
    python scripts/make_fixtures.py [--models DIR] [--only real]

Writes tests/fixtures/conformance_<model>.json for the three real models:
  - greedy: 64-token greedy continuations of 12 prompts, raw and chat-templated, with the
    prompt ids and, per generated step, llama.cpp's top-2 logit gap (to judge near-ties);
  - teacher_forced: over a ~500-token text, per position llama.cpp's top-10 token ids and
    logits (full logit rows would be hundreds of MB);
  - decode_steps (--only steps adds it): the same over the same text with one token per ubatch,
    i.e. llama.cpp's decode-step arithmetic at every position.
and tests/fixtures/tiny_<arch>.json: llama.cpp's full logits on the random-weight tiny
models of tests/tiny_models.py (F32 weights and F32 KV, so no activation quantization), and for
the state-space tiny models (mamba, mamba2, falcon-h1) also their greedy continuation.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

sys.path.insert(0, str(ROOT / "scripts"))
import numerics_reference  # noqa: E402,F401  (b11434's libraries first: the import below binds to them)
import llama_cpp  # noqa: E402

from tallow.chat.template import ChatTemplate  # noqa: E402
from tallow.gguf_file import GGUFFile  # noqa: E402
from tiny_models import ARCHITECTURES, MOE_ARCHITECTURES, SSM_ARCHITECTURES, tiny_prompt, write_tiny_model, write_tiny_ssm  # noqa: E402

MODELS = ("smollm2-135m", "gemma3-270m", "qwen2.5-coder-1.5b-instruct")
N_GEN = 64
TOP = 10

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Here is a list of five fruits:\n1.",
    "Once upon a time, in a small village by the sea,",
    "Q: What is 17 multiplied by 23?\nA:",
    "Translate to French: 'The weather is nice today.'\nFrench:",
    '{"name": "Alice", "age": 30, "skills": [',
    "The three laws of thermodynamics are",
    "Write a haiku about autumn leaves.",
    "SELECT customer_id, COUNT(*) FROM orders",
    "In 1969, the Apollo 11 mission",
    "Turn on the kitchen lights and set the thermostat to 21 degrees.",
]

TEACHER_TEXT = (
    "The history of computing is a story of abstraction. Early machines were programmed by "
    "rewiring panels; then came stored programs, assemblers, and compilers. Each layer hid the "
    "one below it. In 1957, FORTRAN let scientists write formulas instead of machine code, and "
    "by the 1970s, C gave systems programmers portable control over memory. Today a Python "
    "programmer can write:\n\n"
    "def mean(xs):\n    return sum(xs) / len(xs) if xs else 0.0\n\n"
    "print(mean([3, 1, 4, 1, 5, 9, 2, 6]))\n\n"
    "and never think about registers, caches, or instruction pipelines. Yet performance still "
    "depends on them. A modern CPU core can retire four or more instructions per cycle, but a "
    "cache miss to main memory costs hundreds of cycles. That is why inference engines for "
    "large language models care so much about memory bandwidth: generating one token requires "
    "reading every weight of the model once. A model with 1.5 billion parameters stored in "
    "4-bit blocks occupies roughly 0.9 GB, so at 40 GB/s the floor is about 22 ms per token. "
    "Quantization formats such as Q4_K store weights in blocks of 256 with per-block scales and "
    "minimums; the dot product can be computed directly on the packed integers. "
    "Les ordinateurs modernes sont rapides, mais la mémoire reste le goulot d'étranglement. "
    "现代计算机速度很快，但内存仍然是瓶颈。 Современные компьютеры быстры, но память остаётся узким местом. "
    "In the end, the best optimization is the one you measure: profile first, then change one "
    "thing, then measure again, and write down what you found, including what did not work."
)


def top2_gap(row: np.ndarray) -> float:
    a = np.partition(row, -2)[-2:]
    return float(abs(a[1] - a[0]))


def greedy(llm: llama_cpp.Llama, prompt_ids: list[int]) -> dict:
    llm.reset()
    llm.eval(prompt_ids)
    out, gaps = [], []
    for _ in range(N_GEN):
        row = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        tok = int(row.argmax())
        gaps.append(round(top2_gap(row), 5))
        if llm_is_eog(llm, tok):
            out.append(tok)
            break
        out.append(tok)
        llm.eval([tok])
    text = llm.detokenize([t for t in out if not llm_is_eog(llm, t)]).decode("utf-8", errors="replace")
    return {"prompt_ids": prompt_ids, "ids": out, "gaps": gaps, "text": text}


def llm_is_eog(llm: llama_cpp.Llama, tok: int) -> bool:
    return bool(llama_cpp.llama_vocab_is_eog(llama_cpp.llama_model_get_vocab(llm.model), tok))


def real_model_fixture(path: Path) -> dict:
    """The conformance fixture of one real model from llama.cpp b11434 built for this machine
    (scripts/numerics_reference.py: llama-cpp-python's bindings over b11434's libraries, in its
    CONFIG: flash attention off, f16 K/V, no repacking, 2 threads, ubatch 512), the configuration
    TALLOW_NUMERICS=ggml mirrors. llama-cpp-python 0.3.36's own libggml-cpu dies of SIGILL on
    quantized products on the AMD development machine."""
    from numerics_reference import CONFIG, Reference

    ref = Reference(path)
    gf = GGUFFile(path)
    template = ChatTemplate.from_gguf(gf)
    add_bos = ref.add_bos()
    cases = []
    for prompt in PROMPTS:
        raw_ids = ref.tokenize(prompt, add_bos=True, special=True)
        text = template.render([{"role": "user", "content": prompt}], add_generation_prompt=True)
        text = template.prompt_for_tokenizer(text, add_bos)
        chat_ids = ref.tokenize(text, add_bos=True, special=True)
        for mode, ids in (("raw", raw_ids), ("chat", chat_ids)):
            out, gaps = ref.greedy(ids, N_GEN)
            cases.append({"mode": mode, "prompt": prompt, "prompt_ids": ids, "ids": out, "gaps": gaps,
                          "text": ref.detokenize([t for t in out if not ref.is_eog(t)])})
        print(f"  {prompt[:30]!r}: raw {cases[-2]['text'][:40]!r} | chat {cases[-1]['text'][:40]!r}", flush=True)
    ids = ref.tokenize(TEACHER_TEXT, add_bos=True, special=True)
    scores = ref.logits(ids)
    ref.close()
    top_ids = np.argsort(-scores, axis=1)[:, :TOP]
    teacher = {
        "ids": ids,
        "top_ids": top_ids.tolist(),
        "top_logits": np.take_along_axis(scores, top_ids, 1).round(5).tolist(),
    }
    provenance = {"llama_cpp": "b11434 built for this machine (../shared/llama.cpp), through llama-cpp-python "
                               f"{llama_cpp.__version__}'s bindings (scripts/numerics_reference.py)", "config": CONFIG}
    return {"model": path.stem, **provenance, "greedy": cases, "teacher_forced": teacher}


def decode_steps_fixture(path: Path, ids: list[int]) -> dict:
    """llama.cpp's own decode steps over the teacher-forced text: the same CONFIG but one token per ubatch, so
    every position is computed as a decode step computes it (products of one row in vec_dot's order, the
    one-query attention), where the fixture's ubatch of 512 sums its prompt rows in other orders (tiled K-quant
    products, tinyBLAS's lanes). Per position the top-10 token ids and logits, as teacher_forced."""
    from numerics_reference import CONFIG, Reference

    saved = CONFIG["n_ubatch"]
    CONFIG["n_ubatch"] = 1
    try:
        ref = Reference(path)
        scores = ref.logits(ids)
        ref.close()
        config = dict(CONFIG)
    finally:
        CONFIG["n_ubatch"] = saved
    top_ids = np.argsort(-scores, axis=1)[:, :TOP]
    return {"config": config, "top_ids": top_ids.tolist(),
            "top_logits": np.take_along_axis(scores, top_ids, 1).round(5).tolist()}


LONG_N_PROMPT = 1300  # past gemma3's 512-token window and its 1023-slot ring (window + chunk - 1)
LONG_N_GEN = 32


def long_context_fixture(path: Path) -> dict:
    """A prompt longer than the sliding window, so ring-buffer KV layers wrap: llama.cpp's
    teacher-forced top-10 over every position and a greedy continuation with its top-2 gaps.
    The text is this repository's README (stored in the fixture with its ids)."""
    llm = llama_cpp.Llama(str(path), n_ctx=2048, n_batch=512, logits_all=True, n_threads=2, verbose=False)
    text = (ROOT / "README.md").read_text()
    ids = llm.tokenize(text.encode(), add_bos=True, special=False)[:LONG_N_PROMPT]
    if len(ids) < LONG_N_PROMPT:
        raise SystemExit(f"README.md gives only {len(ids)} tokens")
    llm.reset()
    llm.eval(ids)
    scores = np.array(llm.scores[: len(ids)], dtype=np.float32)
    top_ids = np.argsort(-scores, axis=1)[:, :TOP]
    n_gen = N_GEN
    globals()["N_GEN"] = LONG_N_GEN
    try:
        cont = greedy(llm, ids)
    finally:
        globals()["N_GEN"] = n_gen
    return {"model": path.stem, "llama_cpp_python": llama_cpp.__version__, "ids": ids,
            "top_ids": top_ids.tolist(), "top_logits": np.take_along_axis(scores, top_ids, 1).round(5).tolist(),
            "greedy": cont}


TINY_N_GEN = 16  # gemma4's greedy continuation: 24 prompt + 16 tokens, far past the window of 8


def _llama_run(llm, arch: str, qtype: str, ids: list[int], greedy: bool = True) -> dict:
    """llama.cpp's logits over `ids` (evaluated here), then, if greedy, its greedy continuation
    with the top-2 gap of every step."""
    llm.eval(ids)
    data = {"arch": arch, "qtype": qtype, "ids": ids,
            "logits": np.array(llm.scores[: len(ids)], dtype=np.float32).round(6).tolist()}
    if greedy:
        out, gaps = [], []
        for _ in range(TINY_N_GEN):
            row = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
            out.append(int(row.argmax()))
            gaps.append(round(top2_gap(row), 5))
            llm.eval([out[-1]])
        data["greedy"] = {"ids": out, "gaps": gaps}
    return data


def tiny_fixture(arch: str, folder: Path, qtype=None) -> dict:
    """llama.cpp's logits over the tiny prompt (F32 KV); for gemma4 also its greedy continuation
    with the top-2 gap of every step. qtype: the matrices' type (default F32)."""
    from gguf import GGMLQuantizationType as QT

    qtype = qtype or QT.F32
    path = write_tiny_model(arch, folder / f"tiny-{arch}-{qtype.name}.gguf", qtype=qtype)
    ids = tiny_prompt()
    llm = llama_cpp.Llama(str(path), n_ctx=256, logits_all=True, n_threads=2, verbose=False, type_k=0, type_v=0)
    return _llama_run(llm, arch, qtype.name, ids, greedy=arch.startswith("gemma4"))


SSM_N_PROMPT = 40  # ten times the conv kernel of 4


def tiny_ssm_fixture(arch: str, folder: Path) -> dict:
    """llama.cpp's logits over a 40-token prompt on the tiny mamba/mamba2/falcon-h1 (F32 weights,
    F32 KV for falcon-h1's attention; the recurrent state is F32), then its greedy continuation
    with each step's top-2 gap."""
    path = write_tiny_ssm(arch, folder / f"tiny-{arch}.gguf")
    ids = tiny_prompt(SSM_N_PROMPT)
    llm = llama_cpp.Llama(str(path), n_ctx=256, logits_all=True, n_threads=2, verbose=False, type_k=0, type_v=0)
    return _llama_run(llm, arch, "F32", ids)


def tiny_greedy_llama_server(path: Path, ids: list[int], n: int) -> dict:
    """Greedy continuation of `ids` by llama.cpp's own server build (../shared/llama.cpp, unpacked
    to $LLAMA_DIR, default /tmp/llama), with each step's top-2 log-probability gap (= the logit
    gap). For quantized tiny models: llama-cpp-python 0.3.36 dies of SIGILL in its quantized
    matrix products on the development machine."""
    import os
    import socket
    import subprocess
    import time

    import httpx

    folder = Path(os.environ.get("LLAMA_DIR", "/tmp/llama"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "LD_LIBRARY_PATH": str(folder)}
    server = subprocess.Popen([str(folder / "llama-server"), "-m", str(path), "-c", "256", "-t", "2", "-fa", "off",
                               "-ctk", "f32", "-ctv", "f32", "--no-warmup", "--port", str(port)],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(600):
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        r = httpx.post(url + "/completion", timeout=120, json={
            "prompt": ids, "n_predict": n, "temperature": 0, "n_probs": 2, "return_tokens": True,
            "cache_prompt": False}).json()
    finally:
        server.terminate()
        server.wait()
    if "tokens" not in r:
        raise SystemExit(f"llama-server answered {str(r)[:300]}")
    # The server leaves a step's probabilities out when its text is not whole UTF-8 (a byte
    # token), so the gaps come as (token id, gap) pairs, not one per step.
    gaps = [[p["id"], round(p["top_logprobs"][0]["logprob"] - p["top_logprobs"][1]["logprob"], 5)]
            for p in r.get("completion_probabilities") or []]
    return {"ids": r["tokens"], "gaps_by_id": gaps, "llama_cpp": "llama-server b11434 (../shared/llama.cpp)"}


# The quantized check's prompt: of tiny_prompt's seeds 1-12, the one whose 16 greedy steps on
# the Q8_0 gemma4 have the largest smallest top-2 gap (0.28; seed 1's first step is a 0.08 tie,
# which llama.cpp's 8-bit activation rounding alone decides).
QUANTIZED_PROMPT_SEED = 11


# The tiny routed-expert models': of seeds 1-12, one where tallow's greedy tokens on the Q8_0 and
# Q4_0 models of both families are llama-server's. Identical over 16 tokens: qwen3moe 8 (Q8_0)
# and 7 (Q4_0) of the 12 prompts, gemma4-moe 11 and 9. The others diverge where llama.cpp's 8-bit
# activation rounding flips a near-tie: a token (llama.cpp's top-2 gap 0.002-0.09, or a byte
# token the server gives no gap for) or a router's top-k boundary (qwen3moe Q4_0 seed 12: layer 1's
# boundary gap 0.0003, then a token gap of 1.03 — TALLOW_NUMERICS=ggml picks llama.cpp's experts
# and token there).
QUANTIZED_MOE_PROMPT_SEED = 4
# Its MXFP4 and NVFP4 models (4-bit float experts, Q8_0 elsewhere): identical over 16 tokens for 7
# and 8 of the 12 prompts; the first that both give identically (seed 4 diverges on MXFP4 at a
# 0.002 top-2 gap).
QUANTIZED_FP4_PROMPT_SEED = 1


def tiny_quantized_fixture(arch: str, folder: Path, qtype) -> dict:
    path = write_tiny_model(arch, folder / f"tiny-{arch}-{qtype.name}.gguf", qtype=qtype)
    if qtype.name in ("MXFP4", "NVFP4"):
        ids = tiny_prompt(seed=QUANTIZED_FP4_PROMPT_SEED)
    else:
        ids = tiny_prompt(seed=QUANTIZED_MOE_PROMPT_SEED if arch in MOE_ARCHITECTURES else QUANTIZED_PROMPT_SEED)
    return {"arch": arch, "qtype": qtype.name, "ids": ids, "greedy": tiny_greedy_llama_server(path, ids, TINY_N_GEN)}


def _moe_probe():
    """An eval callback for llama-cpp-python that copies out every `ffn_moe_logits-<layer>`
    (router logits, f32 [n_experts, n_tokens]) and `ffn_moe_topk-<layer>` (chosen expert ids,
    i32 [n_used, n_tokens], a strided view) as ggml computes them. Returns (callback, store)."""
    import ctypes

    class Tensor(ctypes.Structure):  # struct ggml_tensor of ggml.h (GGML_MAX_DIMS 4, MAX_OP_PARAMS 64, MAX_SRC 10)
        _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4),
                    ("nb", ctypes.c_size_t * 4), ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16),
                    ("flags", ctypes.c_int32), ("src", ctypes.c_void_p * 10), ("view_src", ctypes.c_void_p),
                    ("view_offs", ctypes.c_size_t), ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64),
                    ("extra", ctypes.c_void_p), ("padding", ctypes.c_char * 8)]

    store: dict[str, list] = {}

    def callback(t, ask, _user):
        g = Tensor.from_address(t)
        name = g.name.decode()
        wanted = name.startswith("ffn_moe_topk-") or name.startswith("ffn_moe_logits-")
        if ask or not wanted:
            return wanted if ask else True
        ne0, ne1, nb1 = g.ne[0], g.ne[1], g.nb[1]
        raw = ctypes.string_at(g.data, nb1 * (ne1 - 1) + ne0 * 4)
        dtype = np.int32 if name.startswith("ffn_moe_topk-") else np.float32
        rows = [np.frombuffer(raw[r * nb1 : r * nb1 + ne0 * 4], dtype=dtype) for r in range(ne1)]
        store.setdefault(name, []).extend(r.tolist() for r in rows)
        return True

    return llama_cpp.llama_cpp.ggml_backend_sched_eval_callback(callback), store


def tiny_moe_fixture(arch: str, folder: Path) -> dict:
    """llama.cpp on the tiny F32 routed-expert model: logits over the tiny prompt, a 16-token
    greedy continuation with its top-2 gaps, and per layer the router logits and the chosen
    experts of every token it evaluated (prompt, then each greedy step)."""
    path = write_tiny_model(arch, folder / f"tiny-{arch}.gguf")
    callback, store = _moe_probe()
    defaults = llama_cpp.llama_cpp.llama_context_default_params

    def with_probe():
        params = defaults()
        params.cb_eval = callback
        return params

    llama_cpp.llama_cpp.llama_context_default_params = with_probe
    try:
        llm = llama_cpp.Llama(str(path), n_ctx=256, logits_all=True, n_threads=2, verbose=False, type_k=0, type_v=0)
    finally:
        llama_cpp.llama_cpp.llama_context_default_params = defaults
    data = _llama_run(llm, arch, "F32", tiny_prompt())
    n_layers = GGUFFile(path).arch_get("block_count")
    data["routing"] = [{"experts": store[f"ffn_moe_topk-{il}"], "router_logits": store[f"ffn_moe_logits-{il}"]}
                       for il in range(n_layers)]
    return data


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="/root/models", help="folder with <name>.gguf files")
    ap.add_argument("--only", choices=("tiny", "real", "long", "steps"), default=None,
                    help="steps: add llama.cpp's decode steps (ubatch 1) over the teacher-forced text to the real models' fixtures")
    ap.add_argument("--arch", default=None, help="with --only tiny: just this tiny architecture (and its quantized variant)")
    ap.add_argument("--model", default=None, choices=MODELS, help="with --only real or steps: just this real model")
    args = ap.parse_args()
    out = ROOT / "tests" / "fixtures"
    out.mkdir(parents=True, exist_ok=True)
    if args.only == "steps":
        for name in [m for m in MODELS if args.model in (None, m)]:
            fixture = out / f"conformance_{name}.json"
            data = json.loads(fixture.read_text())
            data["decode_steps"] = decode_steps_fixture(Path(args.models) / f"{name}.gguf", data["teacher_forced"]["ids"])
            fixture.write_text(json.dumps(data))
            print("wrote", fixture.name, "decode_steps", flush=True)
        return
    if args.only in (None, "long"):
        name = "gemma3-270m"  # the model with sliding-window layers
        data = long_context_fixture(Path(args.models) / f"{name}.gguf")
        (out / f"long_context_{name}.json").write_text(json.dumps(data))
        print("wrote", f"long_context_{name}.json")
        if args.only == "long":
            return
    if args.only != "real":
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            for arch in [a for a in ARCHITECTURES if args.arch in (None, a)]:
                (out / f"tiny_{arch}.json").write_text(json.dumps(tiny_fixture(arch, Path(tmp))))
                print("wrote", f"tiny_{arch}.json")
            for arch in [a for a in MOE_ARCHITECTURES if args.arch in (None, a)]:
                (out / f"tiny_{arch}.json").write_text(json.dumps(tiny_moe_fixture(arch, Path(tmp))))
            for arch in [a for a in SSM_ARCHITECTURES if args.arch in (None, a)]:
                (out / f"tiny_{arch}.json").write_text(json.dumps(tiny_ssm_fixture(arch, Path(tmp))))
                print("wrote", f"tiny_{arch}.json")
            from gguf import GGMLQuantizationType as QT

            for arch, qtype in (("gemma4", QT.Q8_0), ("gemma4-31b", QT.Q4_0), ("qwen3moe", QT.Q8_0), ("qwen3moe", QT.Q4_0),
                                ("gemma4-moe", QT.Q8_0), ("gemma4-moe", QT.Q4_0), ("qwen3moe", QT.MXFP4),
                                ("qwen3moe", QT.NVFP4)):  # llama.cpp quantizes activations
                if args.arch not in (None, arch):
                    continue
                name = f"tiny_{arch}-{qtype.name.lower()}.json"
                (out / name).write_text(json.dumps(tiny_quantized_fixture(arch, Path(tmp), qtype)))
                print("wrote", name)
    if args.only not in ("tiny", "steps"):
        for name in [m for m in MODELS if args.model in (None, m)]:
            print(name, flush=True)
            data = real_model_fixture(Path(args.models) / f"{name}.gguf")
            data["decode_steps"] = decode_steps_fixture(Path(args.models) / f"{name}.gguf", data["teacher_forced"]["ids"])
            (out / f"conformance_{name}.json").write_text(json.dumps(data))
            print("wrote", f"conformance_{name}.json")


if __name__ == "__main__":
    main()

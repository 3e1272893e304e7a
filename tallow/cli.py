"""The `tallow` command: parses flags, calls the Python API, prints. Text on stdout, stats on stderr."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from typing import Any

from . import switches
from .errors import TallowError, UsageError


def _err(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _add_model_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("-m", "--model", default=None, help="registry name or path to a GGUF file (default: qwen2.5-coder-1.5b-instruct)")


def _add_device_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: $TALLOW_DEVICE, else cuda when a GPU is present)")


def _add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-n", "--max-tokens", type=int, default=None, help="most tokens to generate (default: the API's, 1024 for a chat answer, 256 with --raw)")
    p.add_argument("--temp", type=float, default=0.0, help="temperature; 0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=40)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--min-p", type=float, default=0.05)
    p.add_argument("--repeat-penalty", type=float, default=1.0)
    p.add_argument("--presence-penalty", type=float, default=0.0)
    p.add_argument("--frequency-penalty", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    p.add_argument("-c", "--ctx", type=int, default=None, help="context size in tokens (default: min(model, 4096))")


def _add_serve_sampling_args(p: argparse.ArgumentParser) -> None:
    """The server's defaults for requests that leave a field out (unset: llama-server's)."""
    p.add_argument("-n", "--max-tokens", type=int, default=None, help="default max_tokens (default: the rest of the context)")
    p.add_argument("--temp", type=float, default=None, help="default temperature (default 0.8, llama-server's)")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--min-p", type=float, default=None)
    p.add_argument("--repeat-penalty", type=float, default=None)
    p.add_argument("--presence-penalty", type=float, default=None)
    p.add_argument("--frequency-penalty", type=float, default=None)
    p.add_argument("--seed", type=int, default=None)


def _add_memory_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mem-budget", default=None, help="memory tallow may hold: 3GiB, 800MB or 80%% of available (default: all available; env TALLOW_MEM_BUDGET)")
    p.add_argument("--reserve", default=None, help="memory to keep free for other programs, e.g. 1GiB (subtracted from the budget)")
    _add_kv_dtype_arg(p)


def _add_kv_dtype_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kv-dtype", default=None, help="KV cache storage: f16, bf16, int8 or fp8 (default: f16, or $TALLOW_KV_DTYPE)")


# The API's field names in SamplingParams' messages, and the flags a CLI user typed.
_FLAG_OF = {"temperature": "--temp", "top_k": "--top-k", "top_p": "--top-p", "min_p": "--min-p",
            "repeat_penalty": "--repeat-penalty", "presence_penalty": "--presence-penalty",
            "frequency_penalty": "--frequency-penalty", "seed": "--seed"}


def check_flags(args: argparse.Namespace) -> None:
    """Sampling, length and context flags checked before the model loads (a bad value must not
    cost a load), each message naming the flag the user typed."""
    from .sampling import SamplingParams

    n = getattr(args, "max_tokens", None)
    if n is not None and n < 1:
        raise UsageError(f"-n/--max-tokens must be at least 1, not {n}.")
    ctx = getattr(args, "ctx", None)
    if ctx is not None and ctx < 16:
        raise UsageError(f"--ctx (the context size in tokens) must be at least 16, not {ctx}.")
    if hasattr(args, "temp"):
        try:
            SamplingParams(**{k: v for k, v in _sampling(args).items() if v is not None})
        except UsageError as exc:
            field = str(exc).split(" ", 1)[0]
            raise UsageError(str(exc).replace(field, _FLAG_OF.get(field, field), 1)) from None


def _sampling(args: argparse.Namespace) -> dict[str, Any]:
    return dict(
        temperature=args.temp,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        repeat_penalty=args.repeat_penalty,
        presence_penalty=args.presence_penalty,
        frequency_penalty=args.frequency_penalty,
        seed=args.seed,
    )


def _load(args: argparse.Namespace):
    from .api import load

    llm = load(args.model, ctx=getattr(args, "ctx", None), mem_budget=getattr(args, "mem_budget", None),
               reserve=getattr(args, "reserve", None), device=getattr(args, "device", None),
               kv_dtype=getattr(args, "kv_dtype", None))
    return llm


def _print_stats(llm) -> None:
    s = llm.stats.last
    load = llm.stats.load
    _err(
        f"\n[tallow] load {load.load_s * 1000:.0f} ms | prompt {s.prompt_tokens} tok"
        f" (reused {s.reused_tokens}{f', {s.reused_from_disk} from disk' if s.reused_from_disk else ''}, saved ~{s.saved_s * 1000:.0f} ms) | prefill {s.prefill_tokens} tok in {s.prefill_s * 1000:.1f} ms"
        f" = {s.prefill_tok_s:.1f} tok/s | decode {s.decode_tokens} tok in {s.decode_s * 1000:.1f} ms"
        f" = {s.decode_tok_s:.1f} tok/s{_drafts(s)} | TTFT {s.ttft_s * 1000:.1f} ms | finish: {s.finish_reason}"
        f"{f' (closed early: {s.grammar_steered} tokens steered to fit max_tokens)' if s.grammar_steered else ''}"
    )


def _drafts(s) -> str:
    """The speculative-decoding counters, when drafts were verified."""
    if not s.draft_tokens:
        return ""
    return f" (drafts: {s.accepted_tokens}/{s.draft_tokens} accepted = {s.acceptance_rate:.0%})"


def _read_text(flag: str, path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{flag} cannot read {path!r}: {getattr(exc, 'strerror', None) or exc}.") from None


def _constraint(args: argparse.Namespace) -> dict[str, Any]:
    """--json / --json-schema / --grammar as the API's response_format / grammar, checked before
    the model loads so a bad schema costs no wait."""
    from .grammar import GrammarError, GrammarSpec

    kwargs: dict[str, Any] = {}
    if args.json:
        kwargs["response_format"] = {"type": "json_object"}
    if args.json_schema is not None:
        inline = args.json_schema.lstrip().startswith("{")
        text = args.json_schema if inline else _read_text("--json-schema", args.json_schema)
        try:
            schema = json.loads(text)
        except json.JSONDecodeError as exc:
            where = "" if inline else f" in {args.json_schema!r}"
            raise UsageError(f"--json-schema{where} is not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno}).") from None
        except RecursionError:
            raise UsageError("--json-schema nests arrays and objects too deeply to parse.") from None
        kwargs["response_format"] = {"type": "json_schema", "json_schema": {"name": "cli", "schema": schema}}
    if args.grammar is not None:
        kwargs["grammar"] = _read_text("--grammar", args.grammar)
    try:
        GrammarSpec(**kwargs).lark(None, "")  # needs no tokenizer without tools
    except GrammarError as exc:  # it names the API's field; name the flag instead
        flag = "--grammar" if args.grammar is not None else "--json-schema"
        raise UsageError(str(exc).replace(f"'{exc.param}'", flag)) from None
    return kwargs


def cmd_run(args: argparse.Namespace) -> int:
    constraint = _constraint(args)
    llm = _load(args)
    length = {} if args.max_tokens is None else {"max_tokens": args.max_tokens}  # else the API's default
    kwargs = dict(stream=True, stop=args.stop, **length, **constraint, **_sampling(args))
    if args.raw:
        deltas = llm.generate(args.prompt, **kwargs)
    else:
        messages = ([{"role": "system", "content": args.system}] if args.system else []) + [{"role": "user", "content": args.prompt}]
        deltas = llm.chat(messages, **kwargs)
    for delta in deltas:
        sys.stdout.write(delta)
        sys.stdout.flush()
    sys.stdout.write("\n")
    _print_stats(llm)
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    if args.url:
        from .client import run_remote_repl

        return run_remote_repl(args)
    from .repl import run_repl

    return run_repl(_load(args), args, _sampling(args))


def cmd_serve(args: argparse.Namespace) -> int:
    from .server.app import serve

    if args.queue < 1:
        raise UsageError(f"--queue must be at least 1, not {args.queue}.")
    if not 1 <= args.port <= 65535:
        raise UsageError(f"--port must be between 1 and 65535, not {args.port}.")
    from .memory.budget import kv_dtype_arg

    kv_dtype_arg(args.kv_dtype)  # a bad value is one sentence before the port is bound
    defaults = {k: v for k, v in _sampling(args).items() if v is not None}  # the requests' defaults; a request overrides them
    return serve(args.model, host=args.host, port=args.port, api_key=args.api_key, ctx=args.ctx, queue=args.queue,
                 kv_dtype=args.kv_dtype, device=args.device, mem_budget=args.mem_budget, reserve=args.reserve,
                 sampling=defaults, max_tokens=args.max_tokens, log_requests=not args.quiet, verbose=args.verbose,
                 limits=_serve_limits(args))


def _serve_limits(args: argparse.Namespace):
    """The --max-body/--max-prompt-tokens/--max-tokens/--timeout flags, checked before the port is bound."""
    from .memory.budget import parse_size
    from .server.limits import Limits

    body, _ = parse_size(args.max_body, "--max-body")
    for flag, value in (("--max-body", body), ("--max-prompt-tokens", args.max_prompt_tokens),
                        ("--max-output-tokens", args.max_output_tokens), ("--timeout", args.timeout)):
        if value is not None and value <= 0:
            raise UsageError(f"{flag} must be positive, not {value:g}.")
    return Limits(body, args.max_prompt_tokens, args.max_output_tokens, args.timeout)


def cmd_tokenize(args: argparse.Namespace) -> int:
    from .gguf_file import GGUFFile
    from .registry import resolve_model
    from .tokenizer import Tokenizer

    tok = Tokenizer.from_gguf(GGUFFile(resolve_model(args.model)))
    ids = tok.encode(args.text, add_special=not args.no_bos, parse_special=not args.no_parse_special)
    print(json.dumps(ids))
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from .gguf_file import GGUFFile
    from .kernels.cpu import ggml_dot
    from .numerics_choice import describe as describe_numerics
    from .registry import resolve_model
    from .spec import spec_from_gguf

    path = resolve_model(args.model_pos or args.model, pull_missing=False)  # like plan: never a silent 1 GB download
    gf = GGUFFile(path)
    spec = spec_from_gguf(gf)
    if args.ctx is not None and not 16 <= args.ctx <= spec.context_length:
        raise UsageError(f"--ctx must be between 16 and the model's {spec.context_length} tokens, not {args.ctx}.")
    types = Counter(t.qtype.name for t in gf.tensors.values())
    n_params = sum(t.n_rows * t.n_cols for t in gf.tensors.values())
    tensor_bytes = sum(t.n_bytes for t in gf.tensors.values())
    ctx = args.ctx or min(spec.context_length, 4096)
    from .memory.budget import kv_bytes as pool_bytes

    kv_bytes = pool_bytes(spec, ctx)  # f16, sliding-window layers as rings (what the engine allocates)
    windows = sorted({layer.sliding_window for layer in spec.layers if layer.sliding_window})
    lines = [
        f"file          {path} ({gf.file_size / 2**20:.1f} MiB, GGUF v{gf.version})",
        f"name          {spec.name}",
        f"architecture  {spec.architecture}",
        f"parameters    {n_params / 1e6:.1f} M",
        f"layers        {spec.n_layers}   dim {spec.dim}   ffn {spec.ffn_dim}",
        f"attention     {spec.n_heads} heads, {spec.n_kv_heads} KV heads, head dim {spec.head_dim}"
        + (f", sliding window {windows} on {sum(1 for l in spec.layers if l.sliding_window)} layers" if windows else ""),
        f"rope          base {spec.rope_base:g} ({spec.rope_style})"
        + (f", local base {sorted({l.rope_base for l in spec.layers if l.sliding_window})}" if windows else ""),
        f"vocab         {spec.vocab_size}   context {spec.context_length}   tied embeddings: {spec.tied_embeddings}",
        "tensor types  " + ", ".join(f"{k}: {v}" for k, v in types.most_common()),
        f"memory @ctx {ctx}: weights {tensor_bytes / 2**20:.1f} MiB + KV (f16) {kv_bytes / 2**20:.1f} MiB"
        f" = {(tensor_bytes + kv_bytes) / 2**20:.1f} MiB  ({spec.kv_bytes_per_token_f16} KV bytes/token)",
        f"CPU C kernel  {ggml_dot.in_use_status()}",
        f"CPU numerics  {describe_numerics(gf)}",
    ]
    from .memory.budget import kv_bytes_per_token
    from .spec import layer_kind_lines

    lines += layer_kind_lines(spec)  # gemma4: per-layer head sizes, RoPE, shared-KV layers
    from .spec import expert_lines

    lines += expert_lines(spec, gf)  # qwen3moe, gemma4 26B-A4B: routed experts
    if spec.ssm is not None:  # mamba/mamba2/falcon-h1: a fixed state beside the KV (ssm_spec.py)
        from .memory.budget import state_bytes

        if not spec.layers:
            lines = [line for line in lines if not line.startswith("rope ")]
            lines = ["attention     none (a state-space model: no KV, no positions)" if line.startswith("attention ")
                     else line for line in lines]
        lines.append(f"recurrent state {spec.ssm.state_bytes / 2**20:.2f} MiB live, {state_bytes(spec) / 2**20:.2f} MiB"
                     f" with its checkpoints (TALLOW_STATE_CHECKPOINTS), at any context")
    if kv_bytes_per_token(spec, shared=False) != spec.kv_bytes_per_token_f16:
        lines.append(f"KV sharing    {spec.kv_bytes_per_token_f16} bytes/token (f16) with it,"
                     f" {kv_bytes_per_token(spec, shared=False)} were every layer to own a cache")
    print("\n".join(lines))
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    from .registry import list_models, models_dir

    print(f"  {'NAME':32s} {'ARCH':8s} {'QUANT':8s} {'SIZE':>12s}  WHERE (* = default; folder {models_dir()})")
    pulled = 0
    for entry, path in list_models():
        mark = "*" if entry.default else " "
        where = str(path) if path else "not pulled (tallow pull " + entry.name + ")"
        pulled += entry.size_bytes if path else 0
        print(f"{mark} {entry.name:32s} {entry.architecture:8s} {entry.quant:8s} {entry.size_bytes / 2**20:8.1f} MiB  {where}")
    print(f"pulled: {pulled / 2**20:.1f} MiB on disk")
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    from .registry import remove

    for name in args.names:
        freed = remove(name)
        print(f"removed {name} ({freed / 2**20:.1f} MiB freed)" if freed else f"{name} was not pulled; nothing to remove")
    return 0


def cmd_pull(args: argparse.Namespace) -> int:
    from .registry import pull

    for name in args.names:
        print(pull(name, verify=args.verify))
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    """The memory account from the header alone (no weights loaded); exit 3 if it does not fit."""
    from .memory.budget import default_budget, plan_memory
    from .registry import resolve_model

    path = resolve_model(args.model_pos or args.model, pull_missing=False)
    device = args.device or "cpu"  # resolving "the GPU if any" would import torch: plan stays header-only
    if device != "cpu":
        from .api import resolve_device

        device = resolve_device(device)
    plan = plan_memory(path, args.ctx, args.mem_budget if args.mem_budget is not None else default_budget(), args.reserve,
                       kv_dtype=args.kv_dtype, device=device)
    if args.ctx is not None and not 16 <= args.ctx <= plan.spec.context_length:
        raise UsageError(f"--ctx must be between 16 and the model's {plan.spec.context_length} tokens, not {args.ctx}.")
    print(plan.describe())
    if not plan.fits:
        _err(f"tallow: {plan.refusal()}")
        return 3
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    if args.depths is not None or len(args.models) > 1:  # the architecture study (bench_depths.py)
        from .bench_depths import run_depth_study

        return run_depth_study(args)
    from .bench import run_bench

    if args.models:
        args.model = args.models[0]
    args.n_prompt = args.n_prompt or "33,512"
    args.n_gen = args.n_gen or "64"
    return run_bench(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tallow", description="Run quantized GGUF models, greedy-identical to llama.cpp.")
    from . import __version__

    parser.add_argument("--version", action="version", version=f"tallow {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("run", help="generate a reply (or a raw continuation) for one prompt")
    _add_model_arg(p)
    p.add_argument("-p", "--prompt", required=True)
    p.add_argument("--raw", action="store_true", help="no chat template: continue the prompt text")
    p.add_argument("--system", default=None, help="system message (chat mode)")
    shape = p.add_mutually_exclusive_group()
    shape.add_argument("--json", action="store_true", help="the answer is one JSON object (response_format json_object)")
    shape.add_argument("--json-schema", default=None, metavar="FILE_OR_JSON", help="the answer is JSON valid under this schema (a file, or the schema inline)")
    shape.add_argument("--grammar", default=None, metavar="FILE", help="the answer follows this grammar file (Lark, or GBNF with a root rule)")
    _add_sampling_args(p)
    _add_memory_args(p)
    _add_device_arg(p)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("chat", help="interactive multi-turn chat")
    _add_model_arg(p)
    p.add_argument("--system", default=None)
    p.add_argument("--url", default=None, help="talk to a running `tallow serve` at this URL instead of loading a model")
    p.add_argument("--api-key", default=switches.value("TALLOW_API_KEY"), help="API key for --url (default: $TALLOW_API_KEY)")
    _add_sampling_args(p)
    _add_memory_args(p)
    _add_device_arg(p)
    p.set_defaults(func=cmd_chat)

    p = sub.add_parser("serve", help="OpenAI-compatible HTTP server with a web chat page")
    _add_model_arg(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--api-key", default=switches.value("TALLOW_API_KEY"), help="require 'Authorization: Bearer KEY' on /v1/ (default: $TALLOW_API_KEY)")
    p.add_argument("-c", "--ctx", type=int, default=None, help="context size in tokens (default: min(model, 4096))")
    p.add_argument("--queue", type=int, default=16, help="requests that may wait for the engine before 503 (default 16)")
    _add_memory_args(p)
    _add_device_arg(p)
    _add_serve_sampling_args(p)
    loud = p.add_mutually_exclusive_group()
    loud.add_argument("-q", "--quiet", action="store_true", help="no per-request log lines (the ready line and errors still print)")
    loud.add_argument("-v", "--verbose", action="store_true", help="per-request lines with client, cache reuse and speed; uvicorn's own log")
    p.add_argument("--max-body", default="8MiB", help="largest request body accepted, e.g. 8MiB (default); larger: 413")
    p.add_argument("--max-prompt-tokens", type=int, default=None, help="longest prompt accepted, in tokens (default: the context); longer: 400")
    p.add_argument("--max-output-tokens", type=int, default=None, help="longest answer, in tokens; a request asking for more gets this many (default: the context)")
    p.add_argument("--timeout", type=float, default=None, metavar="S",
                   help="seconds a request may take: still queued then: 503 + Retry-After; generating: ended, finish_reason 'length' (default: none)")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("tokenize", help="print token ids as JSON")
    _add_model_arg(p)
    p.add_argument("text")
    p.add_argument("--no-bos", action="store_true", help="do not add BOS/EOS")
    p.add_argument("--no-parse-special", action="store_true", help="treat special-token text as plain text")
    p.set_defaults(func=cmd_tokenize)

    p = sub.add_parser("inspect", help="architecture, hyperparameters, tensor types, memory")
    p.add_argument("model_pos", nargs="?", metavar="MODEL")
    _add_model_arg(p)
    p.add_argument("-c", "--ctx", type=int, default=None)
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("models", help="list registry models and which are pulled")
    p.set_defaults(func=cmd_models)

    p = sub.add_parser("rm", help="delete pulled registry models (and their leftovers)")
    p.add_argument("names", nargs="+", metavar="NAME")
    p.set_defaults(func=cmd_rm)

    p = sub.add_parser("pull", help="download registry models")
    p.add_argument("names", nargs="+")
    p.add_argument("--verify", action="store_true", help="re-hash a model already present")
    p.set_defaults(func=cmd_pull)

    p = sub.add_parser("bench", help="prefill/decode speed like llama-bench")
    _add_model_arg(p)
    p.add_argument("models", nargs="*", metavar="MODEL", help="models to compare (with --depths: the architecture study)")
    p.add_argument("-p", "--n-prompt", default=None, help="prompt lengths, comma-separated (default 33,512; with --depths one, 512)")
    p.add_argument("-n", "--n-gen", default=None, help="generation lengths, comma-separated (default 64)")
    p.add_argument("-r", "--repetitions", type=int, default=3)
    p.add_argument("-d", "--depth", default="0", help="KV depths for the tg tests, comma-separated (like llama-bench -d)")
    p.add_argument("--depths", default=None, help="the study: pp and tg after each of these context depths, per model, "
                   "with the memory held at each (e.g. 0,1024,4096,16384,32768)")
    p.add_argument("--llama-bench", default=None, metavar="PATH", help="with --depths: run this llama-bench on the same files, its figures beside")
    p.add_argument("--llama-args", default=None, metavar="ARGS", help="extra llama-bench arguments, e.g. '-ngl 99'")
    p.add_argument("--plot", default=None, metavar="FILE.png", help="with --depths: tok/s and MiB against depth, one line per model (needs matplotlib)")
    p.add_argument("--one-pool", action="store_true", help="with --depths: load each model once, its pool sized for the "
                   "largest depth (default: a pool sized for each depth, as llama-bench sizes its context per test)")
    p.add_argument("--json", action="store_true")
    _add_memory_args(p)
    _add_device_arg(p)
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("plan", help="the memory account for a model and context, without loading weights")
    p.add_argument("model_pos", nargs="?", metavar="MODEL")
    _add_model_arg(p)
    p.add_argument("--device", default=None, help="plan for cpu (default) or cuda[:N] (GPU memory against its free memory)")
    p.add_argument("-c", "--ctx", type=int, default=None, help="context size in tokens (default: min(model, 4096))")
    _add_memory_args(p)
    p.set_defaults(func=cmd_plan)
    return parser


def main(argv: list[str] | None = None) -> int:
    switches.refresh()  # the flags' defaults below read $TALLOW_API_KEY: parse the environment first
    try:
        switches.current()
    except TallowError as exc:
        _err(f"tallow: error: {exc}")
        return exc.exit_code
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    try:
        check_flags(args)
        return args.func(args)
    except TallowError as exc:
        _err(f"tallow: error: {exc}")
        return exc.exit_code
    except KeyboardInterrupt:
        _err("\ntallow: interrupted")
        return 130
    except BrokenPipeError:
        # stdout closed early (e.g. piped into head): not an error worth a traceback.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())

"""The endpoints agent tools probe (/tokenize, /detokenize, /props, /v1/embeddings) and the
any-`model`-name rule, on a tiny random-weight llama (loads in well under a second), and the
embeddings of a tiny gemma3 (sliding-window layers)."""

from __future__ import annotations

import math

import httpx
import pytest
import torch

from server_utils import LiveServer
from tiny_models import write_tiny_model


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    import tallow

    path = write_tiny_model("llama", tmp_path_factory.mktemp("tiny") / "tiny-llama.gguf")
    server = LiveServer(lambda: tallow.LLM(path, ctx=256, device="cpu"), "tiny-llama", str(path))
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def _post(live, path, body):
    return httpx.post(live.url + path, json=body, timeout=60)


def test_tokenize_and_detokenize_in_llama_servers_shapes(live):
    llm = live.worker.llm
    text = "hello world"
    r = _post(live, "/tokenize", {"content": text})
    assert r.status_code == 200
    ids = r.json()["tokens"]
    assert ids == llm.tokenize(text, add_special=False)  # llama-server's add_special defaults to false
    assert _post(live, "/tokenize", {"content": text, "add_special": True}).json()["tokens"] == llm.tokenize(text)
    pieces = _post(live, "/tokenize", {"content": text, "with_pieces": True}).json()["tokens"]
    assert [p["id"] for p in pieces] == ids
    assert "".join(p["piece"] for p in pieces if isinstance(p["piece"], str)) == text
    assert _post(live, "/detokenize", {"tokens": ids}).json() == {"content": text}
    bad = _post(live, "/detokenize", {"tokens": [10**9]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"
    assert _post(live, "/tokenize", {"content": 5}).json()["error"]["code"] == "invalid_type"


def test_props(live):
    props = httpx.get(live.url + "/props").json()
    assert props["default_generation_settings"]["n_ctx"] == 256
    assert props["default_generation_settings"]["params"]["temperature"] == 0.8  # llama-server's default
    assert props["total_slots"] == 1 and props["model_alias"] == "tiny-llama"
    assert props["model_path"].endswith("tiny-llama.gguf")
    assert props["thinking"] is False


def test_any_model_name_is_served_and_answered_with_the_served_name(live):
    for name in ("gpt-4o", "tiny-llama", "whatever/they-configured"):
        r = _post(live, "/v1/completions", {"model": name, "prompt": "hello", "max_tokens": 2, "temperature": 0})
        assert r.status_code == 200, r.text
        assert r.json()["model"] == "tiny-llama"
    assert httpx.get(live.url + "/v1/models/gpt-4o").status_code == 404  # a lookup by name is answered truthfully


def test_embeddings_are_the_final_hidden_states(live):
    llm = live.worker.llm
    r = _post(live, "/v1/embeddings", {"model": "text-embedding-3-small", "input": ["hello world", "world"]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == "tiny-llama" and [d["index"] for d in body["data"]] == [0, 1]
    assert body["usage"]["prompt_tokens"] == len(llm.tokenize("hello world")) + len(llm.tokenize("world"))
    vec = torch.tensor(body["data"][0]["embedding"])
    assert vec.shape == (llm.spec.dim,) and math.isclose(float(vec.norm()), 1.0, rel_tol=1e-5)
    assert not torch.allclose(vec, torch.tensor(body["data"][1]["embedding"]))

    # Mean pooling of the hidden states, and those states are the ones the logits come from:
    # the output projection of the last one gives the forward pass's last logits.
    ids = llm.tokenize("hello world")
    h = llm.model.hidden_states(ids, llm.engine.kv)
    assert torch.allclose(vec, torch.nn.functional.normalize(h.mean(0), dim=0), atol=1e-6)
    logits = llm.model.forward(ids, 0, llm.engine.kv)[-1]
    assert torch.allclose(llm.model.output(h[-1:].to(torch.float32))[-1].float(), logits.float(), atol=1e-4)
    llm.engine.reset()
    last = _post(live, "/v1/embeddings", {"input": ids, "pooling": "last"}).json()["data"][0]["embedding"]
    assert torch.allclose(torch.tensor(last), torch.nn.functional.normalize(h[-1], dim=0), atol=1e-6)


def test_embeddings_leave_generation_unchanged(live):
    body = {"prompt": "hello world hello", "max_tokens": 8, "temperature": 0}
    before = _post(live, "/v1/completions", body).json()
    assert _post(live, "/v1/embeddings", {"input": "something else entirely"}).status_code == 200
    after = _post(live, "/v1/completions", body).json()
    assert after["choices"][0]["text"] == before["choices"][0]["text"]
    assert after["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # the pool was overwritten, not reused


@pytest.mark.parametrize("body, param", [
    ({"input": 5}, "input"),
    ({"input": ""}, "input"),
    ({"input": "x", "encoding_format": "base64"}, "encoding_format"),
    ({"input": "x", "pooling": "cls"}, "pooling"),
    ({"input": [[1, 2], [10**9]]}, "input[1]"),
])
def test_embedding_errors_are_openai_shaped(live, body, param):
    r = _post(live, "/v1/embeddings", body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_embeddings_on_a_sliding_window_model(tmp_path):
    """gemma3's sliding-window layers (ring KV) with an input longer than the tiny model's window."""
    import tallow
    from tallow.server.probes import embed

    llm = tallow.LLM(write_tiny_model("gemma3", tmp_path / "g.gguf"), ctx=256, device="cpu")
    ids = list(range(5, 5 + 200))
    (vec,) = embed(llm, [ids], "mean")
    assert math.isclose(float(torch.tensor(vec).norm()), 1.0, rel_tol=1e-5) and all(map(math.isfinite, vec))


def test_serve_defaults_apply_to_requests_that_leave_fields_out(live, monkeypatch):
    """`tallow serve --temp 0 -n 3`: a request without temperature/max_tokens gets those."""
    monkeypatch.setattr(live.worker, "sampling_defaults", {"temperature": 0.0})
    monkeypatch.setattr(live.worker, "max_tokens_default", 3)
    body = {"prompt": "hello world", "seed": 1}
    a, b = (_post(live, "/v1/completions", body).json() for _ in range(2))
    assert a["usage"]["completion_tokens"] <= 3 and a["choices"][0]["text"] == b["choices"][0]["text"]
    greedy = _post(live, "/v1/completions", {**body, "temperature": 0, "max_tokens": 3}).json()
    assert greedy["choices"][0]["text"] == a["choices"][0]["text"]
    assert _post(live, "/v1/completions", {**body, "max_tokens": 5}).json()["usage"]["completion_tokens"] <= 5  # a request overrides
    params = httpx.get(live.url + "/props").json()["default_generation_settings"]["params"]
    assert params["temperature"] == 0.0 and params["n_predict"] == 3


def test_thinking_templates_are_recognised():
    from tallow.server.probes import thinks

    assert thinks("{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>{% endif %}")
    assert thinks("{{ '<think>' }}") and not thinks("{% for m in messages %}{{ m.content }}{% endfor %}")

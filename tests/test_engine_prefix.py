"""In-memory prefix cache: reuse gives the same tokens as no reuse, and the counters add up."""

from __future__ import annotations



from model_paths import require_model




SYSTEM = ("You are a careful assistant for a smart home. You control lights, blinds and the thermostat. "
          "Answer in one short sentence and never invent devices. ") * 4
QUESTIONS = ["Dim the kitchen lights.", "What is the capital of France?", "Close the blinds in the bedroom."]


def test_prefix_reuse_gives_identical_output_and_counts(monkeypatch):
    import tallow

    llm = tallow.LLM(require_model("smollm2-135m"), ctx=512)
    warm = []
    for q in QUESTIONS:
        out = llm.chat([{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}], max_tokens=10)
        s = out.stats
        assert s.prompt_tokens == s.reused_tokens + s.prefill_tokens
        assert s.reused_from_disk == 0
        warm.append((out.tokens, s))
    # The system prompt was reused by the second and third requests, up to the question or the last
    # min_rows prompt tokens, which a CPU prefill always recomputes (engine/prefill_plan.py: 8 in
    # llama.cpp's numerics, 64 in the torch paths').
    min_rows = llm.engine.prefill_plan().min_rows
    for _, s in warm[1:]:
        assert s.reused_tokens > 50 and s.prefill_tokens >= min_rows
    assert warm[1][1].saved_s > 0
    assert warm[0][1].saved_s == 0.0

    monkeypatch.setenv("TALLOW_PREFIX_CACHE", "0")
    for q, (tokens, _) in zip(QUESTIONS, warm):
        out = llm.chat([{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}], max_tokens=10)
        assert out.stats.reused_tokens == 0 and out.stats.saved_s == 0.0
        assert out.tokens == tokens

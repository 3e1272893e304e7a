"""Warm-vs-cold time to first token for requests sharing a ~500-token system prompt.

    python scripts/ttft_prefix.py /root/models/smollm2-135m.gguf

Cold: empty KV pool (engine.reset()). Warm: the next request with another user question,
reusing the system prompt's KV from memory. Three pairs, medians reported.
"""

import statistics
import sys

import torch

import tallow

llm = tallow.LLM(sys.argv[1], ctx=2048)
system = " ".join(f"Rule {i}: when the user asks about device number {i}, answer with its state and location in the house." for i in range(1, 20))
qs = ["Dim the kitchen lights.", "Is the garage door open?", "Set the thermostat to 20 degrees.", "Turn off the porch light."]


def req(q: str):
    return llm.chat([{"role": "system", "content": system}, {"role": "user", "content": q}], max_tokens=1).stats


cold, warm = [], []
for i, q in enumerate(qs[:3]):
    llm.engine.reset()
    c = req(q)
    cold.append(c.ttft_s)
    w = req(qs[i + 1])
    warm.append(w.ttft_s)
print(f"{sys.argv[1].split('/')[-1]}: prompt {c.prompt_tokens} tok, warm reused {w.reused_tokens} prefilled {w.prefill_tokens}; "
      f"TTFT cold {statistics.median(cold) * 1000:.0f} ms, warm {statistics.median(warm) * 1000:.1f} ms, "
      f"ratio {statistics.median(cold) / statistics.median(warm):.1f}x, saved est {w.saved_s * 1000:.0f} ms; "
      f"threads {torch.get_num_threads()}; cold {[round(x * 1000) for x in cold]} warm {[round(x * 1000, 1) for x in warm]}")

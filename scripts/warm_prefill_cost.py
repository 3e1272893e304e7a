"""Warm-request prefill cost after a 426-token system prompt: the remainder as TALLOW_ALIGNED_REUSE=1 prefills it (64 rows, padded attention) vs =0 (22 rows). Dev only: PYTHONPATH=.:tests python scripts/warm_prefill_cost.py smollm2-135m 5"""
import os, statistics, sys, time
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
import tallow
from model_paths import model_path
llm = tallow.LLM(model_path(sys.argv[1]), ctx=2048, device="cpu")
system = ("You are the support assistant of a hardware store. " + "Policy: returns within 30 days with a receipt; "
          "power tools carry a two-year warranty; paint is mixed to order and cannot be returned; deliveries "
          "leave at 8:00 and 14:00 on weekdays. " * 8)
ids = llm.chat_prompt([{"role": "system", "content": system}, {"role": "user", "content": "Question 1: can I return an opened can of paint bought 1 days ago?"}])
n = len(ids); eng = llm.engine; m = eng.model
t = time.perf_counter(); m.forward(ids, 0, eng.kv); cold = time.perf_counter() - t
times = {"1": [], "0": []}
for rep in range(int(sys.argv[2])):
    for mode, start in (("1", n - 64), ("0", 421 if n == 443 else n - 22)):
        os.environ["TALLOW_ALIGNED_REUSE"] = mode
        eng.kv.truncate(start); t = time.perf_counter(); m.forward(ids[start:], start, eng.kv); times[mode].append(time.perf_counter() - t)
print(f"prompt {n} tokens; cold prefill {cold*1000:.0f} ms; remainder prefill median: aligned (64 tokens) {statistics.median(times['1'])*1000:.0f} ms, "
      f"old (22 tokens) {statistics.median(times['0'])*1000:.0f} ms; n={len(times['1'])} each, alternating")

"""How far a one-ulp change of the input moves a model's logits (the chaos probe of docs/performance.md).

  PYTHONPATH=$PWD [TALLOW_NUMERICS=ggml | TALLOW_REFERENCE=1] python scripts/numerics_chaos.py MODEL

Runs the first 120 tokens of the conformance fixture's teacher-forced text twice, the second time
with every embedding value multiplied by 1 +- 2^-22 (random sign), and prints the median and max
|Δlogit| over positions 1.. (position 0 left out as in the conformance test).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


class NudgedEmbedding:
    """The model's embedding with each output value moved by about one ulp."""

    def __init__(self, embedding):
        self.embedding = embedding
        self.generator = torch.Generator().manual_seed(0)

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embedding(ids)
        sign = torch.randint(0, 2, x.shape, generator=self.generator).float() * 2 - 1
        return x * (1 + 2.0**-22 * sign)


def main() -> None:
    import tallow
    from model_paths import require_model

    name = sys.argv[1]
    ids = json.loads((ROOT / "tests" / "fixtures" / f"conformance_{name}.json").read_text())["teacher_forced"]["ids"][:120]
    llm = tallow.LLM(require_model(name), ctx=1024)

    def logits() -> np.ndarray:
        llm.engine.reset()
        return llm.model.forward(ids, 0, llm.engine.kv, all_logits=True).numpy()

    before = logits()
    llm.model.embedding = NudgedEmbedding(llm.model.embedding)
    delta = np.abs(logits() - before)[1:]
    print(f"{name}: embeddings x (1 +- 2^-22) -> logits median |Δ| {np.median(delta):.4f}, max {delta.max():.4f}")


if __name__ == "__main__":
    main()

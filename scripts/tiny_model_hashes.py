"""Print the sha256 of every tiny GGUF tests/tiny_models.py writes (architecture x quant type x
seed x block count, and write_tiny_gemma4_vocab), one line each, so a change to the writers can
be shown byte-identical: run it before and after and diff the outputs (the llama.cpp fixtures
in tests/fixtures were recorded from these files). A variant a writer cannot quantize prints
its error instead, which must not change either.

    PYTHONPATH=$PWD python scripts/tiny_model_hashes.py > before.txt
"""

from __future__ import annotations

import hashlib
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from gguf import GGMLQuantizationType as QT  # noqa: E402

import tiny_models  # noqa: E402
from shared_data import vocab_gguf  # noqa: E402

QTYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "TQ1_0", "TQ2_0", "MXFP4", "Q4_K", "Q6_K")


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def main() -> None:
    out = Path(tempfile.mkdtemp()) / "tiny.gguf"
    for arch in tiny_models.ARCHITECTURES:
        for qtype in QTYPES:
            for seed in (0, 1):
                for n_layers in ((None,) if arch.startswith("gemma4") else (None, 1, 3)):
                    try:
                        tiny_models.write_tiny_model(arch, out, seed=seed, qtype=QT[qtype], n_layers=n_layers)
                        digest = sha(out)
                    except Exception as e:  # noqa: BLE001 - a variant the writer cannot make
                        digest = f"ERR {type(e).__name__}: {str(e)[:60]}"
                    print(f"{arch} {qtype} seed{seed} nl{n_layers} {digest}")
    tiny_models.write_tiny_gemma4_vocab(vocab_gguf("gemma-4"), out)
    print(f"gemma4_vocab {sha(out)}")


if __name__ == "__main__":
    main()

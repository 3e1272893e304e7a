"""tallow: quantized GGUF inference, greedy-identical to llama.cpp."""

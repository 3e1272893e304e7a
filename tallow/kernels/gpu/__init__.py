"""GPU layers composed from the Triton kernels in kernels/triton (one op per file there)."""

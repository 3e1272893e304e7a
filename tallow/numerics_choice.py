"""Which arithmetic a model runs in (numerics_mode.py): llama.cpp's or the torch paths'.

TALLOW_NUMERICS=ggml or =default forces one for every model. Unset (or =auto), a model gets
llama.cpp's arithmetic wherever tallow computes it at full speed: on the CPU, with the C library
built for this CPU (kernels/cpu/ggml_dot.c's products, ggml_ops.c's elementwise ops, decode_layer.c's
step), a family whose decode step that C step computes in ggml's arithmetic (Family.ggml_step),
every matrix in a type the C kernel takes (Q4_0 aside: its prompts are slower there), the automatic linear mode. Elsewhere (the GPU, other
types and families, the fp32 reference) the torch paths. Chosen once per load, before the
weights are planned and loaded; imports torch only when a CPU file is judged.
"""

from __future__ import annotations

from gguf import GGMLQuantizationType as QT

from .numerics_mode import AUTO, DEFAULT, GGML, requested


def choose(header, device: str = "cpu", linear_mode: str | None = None) -> str:
    """The arithmetic for a model file (a GGUFFile or a scanned header) on `device`."""
    asked = requested()
    if asked != AUTO:
        return asked
    return DEFAULT if why_not_ggml(header, device, linear_mode) else GGML


def why_not_ggml(header, device: str = "cpu", linear_mode: str | None = None) -> str | None:
    """None where every part of this model's CPU forward pass has its ggml arithmetic in C (see the
    module doc), else what stands in the way: such a model would run some of it as torch
    emulations or over fp32 weights, many times slower."""
    from .families import FAMILIES
    from .families.tensors import TOKEN_EMBD, is_tied, model_roles

    arch = str(header.get("general.architecture") or "")
    if not str(device).startswith("cpu"):
        return "on the GPU"
    if linear_mode not in (None, "auto"):
        return f"the linear mode {linear_mode!r}"
    if arch not in FAMILIES or not FAMILIES[arch].ggml_step:
        return f"no C step in llama.cpp's arithmetic for {arch}"
    from .kernels.cpu import decode_layer, ggml_dot, ggml_ops  # (torch: the weights are about to load)

    if not (ggml_dot.wanted() and ggml_dot.usable() and ggml_ops.usable() and decode_layer.usable()):
        return "the C library is not built or not in use for this CPU"
    tied, roles = is_tied(header.tensors), model_roles(header.tensors)
    for t in header.tensors.values():
        if len(t.shape) < 2 or t.n_rows <= 1 or (roles.get(t.name) == TOKEN_EMBD and not tied):
            continue  # vectors; the embedding table, read a row at a time (exactly, any type)
        if len(t.shape) > 2:
            return "routed experts"
        if t.qtype not in ggml_dot.TYPES:
            return f"{t.qtype.name} weights ({t.name})"
        if t.qtype == QT.Q4_0:  # its prompt products in llama.cpp's order: 1.22-1.65x the torch paths' time (session 25)
            return f"Q4_0 weights ({t.name}: llama.cpp's numerics prefill them slower; TALLOW_NUMERICS=ggml asks for them)"
    return None


def describe(header, device: str = "cpu", linear_mode: str | None = None) -> str:
    """One line for `tallow inspect`: which arithmetic a load would choose, and why."""
    mode, why = choose(header, device, linear_mode), why_not_ggml(header, device, linear_mode)
    if mode == GGML:
        return "llama.cpp's (its CPU arithmetic bit for bit" + (")" if why is None else f"; TALLOW_NUMERICS=ggml, slow here: {why})")
    return "tallow's torch paths (" + ("TALLOW_NUMERICS=default)" if why is None else f"not llama.cpp's: {why})")

"""Attention kernels for bf16/fp16 on a CPU, put into the core's one slot for them.

torch's scaled-dot-product kernels are slow for low-precision inputs on a CPU: the math
kernel upcasts, and flash's low-precision backward costs several times its fp32 one. So,
for bf16/fp16 on a CPU, :func:`cpu_sdpa` computes whole short sequences (training,
evaluation, a prompt) unmasked as two matrix products in their own dtype, masked ones through
fp32 flash on upcast inputs, and one query (a decoding step) whichever way
:func:`one_query_in_fp32` measured faster here. Everything else goes to SDPA unchanged.
:func:`use_cpu_sdpa` / :func:`cpu_sdpa_in` put it into a model's attention modules.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..nn import LOW_PRECISION, MultiHeadAttention, causal_mask
from .dropout import cpu_dropout
from .probe import fastest, machine_key

# Longest whole sequence that low-precision attention on a CPU computes as two matrix products.
SHORT_CPU_SEQ = 128


@functools.cache
def one_query_in_fp32(dtype: torch.dtype) -> bool:
    """Whether one query in ``dtype`` (bf16 / fp16: a decoding step) attends faster on this
    CPU through fp32 flash on upcast inputs than through torch's kernel in its own dtype.

    Which one wins depends on the CPU's bf16 units, so it is measured once per machine
    (:func:`~attnlab.speed.probe.fastest`, cached; a few hundred microseconds).
    """
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 8, n, 64, generator=gen).to(dtype) for n in (1, 256, 256))

    def step(kind: str) -> None:
        with torch.inference_mode(), torch.autocast("cpu", enabled=False):
            for _ in range(8):
                if kind == "fp32":
                    F.scaled_dot_product_attention(q.float(), k.float(), v.float()).to(dtype)
                else:
                    F.scaled_dot_product_attention(q, k, v)

    key = machine_key("one-query attention", str(dtype))
    return fastest(step, key, ("own dtype", "fp32"), field="kernels",
                   what=f"one-query {dtype} attention") == "fp32"


def cpu_sdpa(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None = None,
             dropout_p: float = 0.0, is_causal: bool = False) -> Tensor:
    """``F.scaled_dot_product_attention`` with the faster kernels for bf16/fp16 on a CPU.

    Shape:
        q (B, H, T, Dh); k, v (B, H, S, Dh); attn_mask bool broadcastable to (B, H, T, S);
        output (B, H, T, Dh) in q's dtype.
    """
    t, s = q.size(-2), k.size(-2)
    if q.device.type == "cpu" and q.dtype in LOW_PRECISION and (
            t == s <= SHORT_CPU_SEQ or (t == 1 and one_query_in_fp32(q.dtype))):
        # a kernel the user chose (train.sdpa_backend: torch's sdpa_kernel) is kept
        own = torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.math_sdp_enabled()
        if attn_mask is None and own and t == s:
            return short_attention(q, k, v, dropout_p, is_causal)
        with torch.autocast("cpu", enabled=False):  # autocast would cast the inputs back
            out = F.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                                 attn_mask=attn_mask, dropout_p=dropout_p,
                                                 is_causal=is_causal)
        return out.to(q.dtype)  # (B, H, T, Dh)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p,
                                          is_causal=is_causal)


@functools.lru_cache(maxsize=16)
def _score_bias(t: int, dtype: torch.dtype, is_causal: bool) -> Tensor:
    """(T, T): 0, and -inf above the diagonal if causal (made outside inference mode: the
    cached tensor serves training too)."""
    with torch.inference_mode(False):
        return torch.zeros(t, t, dtype=dtype).masked_fill(~causal_mask(t) & is_causal, -math.inf)


def short_attention(q: Tensor, k: Tensor, v: Tensor, dropout_p: float = 0.0,
                    is_causal: bool = False) -> Tensor:
    """Unmasked attention of (B, H, T, Dh) inputs in their own dtype, as two batched matrix
    products (softmax in that dtype too)."""
    b, h, t, dh = q.shape
    q, k, v = (x.reshape(b * h, t, -1) for x in (q, k, v))
    scores = torch.baddbmm(_score_bias(t, q.dtype, is_causal), q, k.transpose(1, 2),
                           alpha=1 / math.sqrt(dh))  # (B*H, T, T)
    weights = torch.softmax(scores, dim=-1)  # (B*H, T, T)
    if dropout_p > 0:
        weights = cpu_dropout(weights, dropout_p)
    return (weights @ v).view(b, h, t, -1)  # (B, H, T, Dh)


def use_cpu_sdpa(model: nn.Module) -> nn.Module:
    """Put :func:`cpu_sdpa` into every attention module of ``model``, in place; returns it.
    Only bf16/fp16 on a CPU take another kernel; every other call is SDPA as before."""
    for module in model.modules():
        if isinstance(module, MultiHeadAttention):
            module.sdpa = cpu_sdpa
    return model


@contextmanager
def cpu_sdpa_in(model: nn.Module) -> Iterator[nn.Module]:
    """:func:`use_cpu_sdpa` for the duration; each module gets its kernel back after."""
    modules = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    before = [m.sdpa for m in modules]
    use_cpu_sdpa(model)
    try:
        yield model
    finally:
        for m, kernel in zip(modules, before):
            m.sdpa = kernel

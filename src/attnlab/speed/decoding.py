"""What makes decoding steps fast without changing their results (beyond float rounding).

A decoding step of a small model is bound by per-call overhead and by how the weights are
read, not by arithmetic. Each tool here is measured where it is chosen (benchmarks/README.md):

* :func:`inference_layout` / :func:`layout_pays`: column-major weights for the thin matrix
  products of decoding on a CPU, where a one-off probe measures that they pay.
* :func:`decoding_kernels`: the kernels the steps run in (oneDNN off on a CPU where that is
  measured faster).
* :func:`direct_attributes`: parameters and submodules found without ``nn.Module.__getattr__``.

:mod:`~attnlab.decoding.lm` and :mod:`~attnlab.decoding.translate` enter them around their
steps; ``attnlab sample`` applies the layout.
"""

from __future__ import annotations

import platform
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext

import torch
import torch.nn.functional as F
from torch import nn

from .probe import fastest, machine_key


def inference_layout(model: nn.Module) -> nn.Module:
    """Store the ``nn.Linear`` weights of ``model`` that have more outputs than inputs
    column-major, in place; returns ``model``.

    The values and shapes do not change (nor do the outputs, beyond float rounding): only the
    memory order does, so that ``F.linear``'s ``x @ W.T`` reads a contiguous (in, out) matrix.
    On CPU (MKL) that is the fast order for the thin matrix products of decoding when the
    output is the wide side: the 50257 x 384 output projection of a GPT-2-sized model runs 2x
    faster at batch 1, the q/k/v and first feed-forward projections ~1.4x; a square or
    narrowing product (the output projection, the feed-forward's (D, 4D) second matrix, a
    small vocabulary's head) is as fast or faster in the usual row-major order
    (see ``benchmarks/README.md``). Tied embeddings share the layout. Use it for inference;
    training works too, but nothing is gained there.
    """
    with torch.no_grad():
        for module in model.modules():
            if (isinstance(module, nn.Linear) and module.weight.stride(0) != 1
                    and module.out_features > module.in_features):
                module.weight.data = module.weight.data.t().contiguous().t()  # (out, in) view
    return model


def _matrix_products(model: nn.Module, rows: int):
    """What the probes below time, one pass over a decoding step's matrix products: the
    model's ``nn.Linear`` layers, a random input of ``rows`` token rows for each, and their
    shapes and dtypes (for the probe's key)."""
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    inputs = [torch.randn(rows, 1, m.in_features, dtype=m.weight.dtype) for m in linears]
    shapes = sorted((m.out_features, m.in_features, str(m.weight.dtype)) for m in linears)
    return linears, inputs, shapes


def layout_pays(model: nn.Module, rows: int = 1) -> bool:
    """Whether :func:`inference_layout` makes the matrix products of a decoding step of
    ``rows`` token rows faster on this machine (CPU): one pass over the model's linear layers
    is timed with the weights as :func:`inference_layout` leaves them and all row-major, once,
    and the answer cached (:func:`attnlab.probe.fastest`; the widening weights are copied for
    the probe). On an AMD EPYC the column-major layout won for a 4 x 192 char model at 1 row
    (163 vs 170 us a pass; 0.389 vs 0.406 ms a generated token) and lost at 8 rows (516 vs
    471 us; 0.934 vs 0.898 ms), and won at both for the 6 x 384 GPT-2 shape (V 50257)."""
    linears, inputs, shapes = _matrix_products(model, rows)
    if not linears or linears[0].weight.device.type != "cpu":
        return False
    with torch.no_grad():
        row = [m.weight.contiguous() for m in linears]
        col = [w.t().contiguous().t() if m.out_features > m.in_features else w
               for m, w in zip(linears, row)]

    def step(layout: str) -> None:
        with torch.inference_mode():
            for m, w, x in zip(linears, col if layout == "column-major" else row, inputs):
                F.linear(x, w, m.bias)

    key = machine_key("inference layout", rows, shapes)
    return fastest(step, key, ("row-major", "column-major"), field="layout",
                   what=f"inference layout ({rows} rows)") == "column-major"


class _OneDNNOff:
    """oneDNN off inside, the previous setting back after (cheap: entered once a step)."""

    def __enter__(self) -> None:
        self.was = torch.backends.mkldnn.enabled
        torch.backends.mkldnn.enabled = False

    def __exit__(self, *exc) -> None:
        torch.backends.mkldnn.enabled = self.was


def decoding_kernels(model: nn.Module, rows: int | None = None) -> type[AbstractContextManager]:
    """The context (a class: enter a new one per step) that decoding steps of ``model`` run
    in, for speed: the same results up to float rounding. ``rows``: the token rows of every
    step it serves (1: one token of one sequence), None for any.

    On a CPU it turns oneDNN off (torch runs its own kernels; the switch is process-wide, on
    again after each step):

    * fp32 parameters, x86 CPUs: always. oneDNN's exact GELU costs ~5 us a call whatever the
      size (768 values: 4.7 vs 1.1 us, AMD EPYC; 7.1 vs 2.0 us, an Intel Xeon), while the fp32
      matrix products (MKL), FBGEMM's fp16 / int8 ones and the attention kernel do not use
      oneDNN there (on ARM, torch's fp32 matrix products may: left alone).
    * bf16 / fp16 parameters, steps of one row, where that is measured faster on this machine
      (:func:`attnlab.probe.fastest`, once, cached): torch's own matrix-vector product of
      low-precision weights streamed them at 20-27 GB/s against oneDNN's 12-17 on an AMD EPYC
      (avx512_bf16, no AMX), but 6-7 against 6-9 on an Intel Xeon with AMX. Its products of
      several rows are far slower (8 rows: ~8x), so they keep oneDNN.

    Elsewhere (other devices, torch without oneDNN) nothing changes.
    """
    params = list(model.parameters())
    if not params or params[0].device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return nullcontext
    low = sorted({str(p.dtype) for p in params if p.dtype in (torch.float16, torch.bfloat16)})
    if not low:
        x86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")
        return _OneDNNOff if x86 else nullcontext
    if rows != 1:
        return nullcontext
    linears, inputs, _ = _matrix_products(model, 1)
    if not linears:
        return nullcontext

    def step(kernels: str) -> None:  # the matrix products of one token
        with torch.inference_mode(), (_OneDNNOff() if kernels == "native" else nullcontext()):
            for m, x in zip(linears, inputs):
                m(x)

    key = machine_key("decoding kernels, one row", low,  # the memory order counts here
                      sorted((m.out_features, m.in_features, str(m.weight.dtype),
                              m.weight.stride()) for m in linears))
    best = fastest(step, key, ("onednn", "native"), field="kernels",
                   what="decoding kernels (one row, low-precision weights)")
    return _OneDNNOff if best == "native" else nullcontext


@contextmanager
def direct_attributes(model: nn.Module) -> Iterator[None]:
    """Inside, Python finds every parameter and submodule of ``model``'s modules directly.

    A decoding step of a small model is bound by Python overhead, not arithmetic. nn.Module
    keeps parameters and submodules in dicts of its own, which ordinary attribute lookup
    misses, so each ``self.weight`` or ``self.norm1`` falls through to ``nn.Module.__getattr__``
    (a Python function, ~0.4 us a call): a token of the 4 x 192 char model made ~100 such
    lookups, ~15% of its time (AMD EPYC: 407 -> 343 us a token with this; benchmarks/
    README.md). For the duration, each entry is also put in its module's ``__dict__``, where
    lookup finds it first; the entries added are removed after (nested uses add nothing).

    Nothing changes but the speed: the entries are the same objects; assigning a parameter or
    submodule inside is seen (``nn.Module.__setattr__`` drops the entry); only setting one to
    None or deleting one inside is not, until the end. Buffers are not copied (assigning one
    does not drop an entry), nor names that the module's class also has (lookup finds the
    class's first, today, and must go on doing so).
    """
    added = []
    for module in model.modules():
        own, cls = module.__dict__, type(module)
        for name, value in (*module._parameters.items(), *module._modules.items()):
            if name not in own and not hasattr(cls, name):  # (a class attribute wins today)
                own[name] = value
                added.append((own, name))
    try:
        yield
    finally:
        for own, name in added:
            own.pop(name, None)


__all__ = ["decoding_kernels", "direct_attributes", "inference_layout", "layout_pays"]

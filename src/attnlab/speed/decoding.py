"""What makes decoding steps fast without changing their results (beyond float rounding).

A decoding step of a small model is bound by per-call overhead and by how the weights are
read, not by arithmetic, so each tool here targets one of those; which way is faster depends
on the machine, and is measured where it is chosen (:mod:`attnlab.speed.probe`). The decoding
loops enter :func:`decoding_kernels` and :func:`direct_attributes` around their steps;
``attnlab sample`` applies :func:`inference_layout` where :func:`layout_pays`.
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

    Values and shapes do not change, only the memory order: ``F.linear``'s ``x @ W.T`` then
    reads a contiguous (in, out) matrix, the fast order on CPUs (MKL) for the thin products
    of decoding when the output is the wide side (the vocabulary head, q/k/v, the first
    feed-forward matrix). Tied embeddings share the layout. Nothing is gained in training.
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
    ``rows`` token rows faster on this machine (CPU only).

    One pass over the model's linear layers is timed in both layouts (on copies: the model
    is untouched), once per machine, shapes and row count, and the answer cached; which wins
    depends on the CPU, the shapes and the rows.
    """
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
    in, for speed; the same results up to float rounding. ``rows``: the token rows of every
    step it serves (1: one token of one sequence), None for any.

    On a CPU it may turn oneDNN off (torch's own kernels; the switch is process-wide, back on
    after each step). Always for fp32 parameters on x86, where oneDNN's exact GELU costs a
    fixed overhead per call and the matrix products do not use it. For bf16 / fp16
    parameters only for one-row steps, and only where a probe measured torch's
    matrix-vector product faster on this machine (it depends on the CPU); products of
    several rows keep oneDNN. Elsewhere nothing changes.
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

    ``nn.Module`` keeps them in dicts of its own, so each ``self.weight`` falls through to
    ``nn.Module.__getattr__``, a Python call that a small model's decoding step makes about a
    hundred times. For the duration each entry is also put in its module's ``__dict__``,
    where lookup finds it first, and removed after (nested uses add nothing). The entries are
    the same objects; assigning a parameter or submodule inside is seen (``__setattr__``
    drops the entry). Buffers, and names the module's class also has, are not copied.
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

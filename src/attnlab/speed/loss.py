"""The output projection fused with its loss: the same loss and gradients as
:func:`attnlab.nn.projected_loss`, without the (N, V) logits ever made whole. Put into a
model's ``head_loss`` slot by :func:`use_fused_loss` (training does)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..nn import IGNORE_INDEX


def use_fused_loss(model: nn.Module) -> nn.Module:
    """``model`` with :func:`linear_cross_entropy` in its ``head_loss`` slot, where it has one
    (the encoder-decoder and the decoder-only language model)."""
    if hasattr(model, "head_loss"):
        model.head_loss = linear_cross_entropy
    return model


def linear_cross_entropy(h: Tensor, weight: Tensor, targets: Tensor, *,
                         label_smoothing: float = 0.0, reduction: str = "mean",
                         rows: int | None = None) -> Tensor:
    """The output projection and its loss in one: ``token_loss(h @ weight.T, targets, ...)``,
    its value and its gradients, without the (N, V) logits ever made whole.

    The logits of ``rows`` positions at a time are made, turned into their share of the
    loss and, when gradients are wanted, into the gradient of the loss by them (softmax
    minus the smoothed one-hot target) and on into the gradients of ``h`` and ``weight``.
    Unfused, a vocabulary of 8,000 costs a log-softmax, its backward and several passes over
    (N, V) tensors besides the three matrix products: fused, a ``multi30k_de_en`` training
    step on a 2-core CPU is 1.13x faster (docs/what-we-tried.md). The default block, at least
    1,024 rows and about 16M logits (64 MB), keeps the matrix products large: blocks that fit
    a cache (83 rows of GPT-2's 50,257) made the projection's products thin and its
    gradient's accumulation a pass over (V, D) per block, slower than unfused.
    Under autocast the matrix products run in its dtype, the softmax in float32.

    Args:
        h: hidden states. weight: the projection (``head.weight``, tied or not; no bias).
        targets: ids; ``IGNORE_INDEX`` rows do not count.
        label_smoothing: as ``F.cross_entropy``'s. reduction: ``"mean"`` or ``"sum"``.

    Shape:
        h (N, D); weight (V, D); targets (N,).
    """
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
    keep = targets != IGNORE_INDEX
    if not bool(keep.all()):
        h, targets = h[keep], targets[keep]
    kind = h.device.type
    dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else h.dtype
    rows = rows or max(1024, 2**24 // weight.size(0))
    total = _LinearCrossEntropy.apply(h, weight, targets, label_smoothing, dtype, rows,
                                      torch.is_grad_enabled())
    return total if reduction == "sum" else total / targets.numel()


class _LinearCrossEntropy(torch.autograd.Function):
    """:func:`linear_cross_entropy`'s sum: the gradients are made in the forward pass, a block
    of rows at a time, and only scaled in the backward."""

    @staticmethod
    def forward(ctx, h, weight, targets, smoothing, dtype, rows, grad_enabled):
        x, w = h.to(dtype), weight.to(dtype)  # (N, D), (V, D)
        v, acc = w.size(0), torch.promote_types(dtype, torch.float32)  # acc: sums, softmax
        want = [grad_enabled and need for need in ctx.needs_input_grad[:2]]  # (no_grad: none)
        gx = torch.empty_like(x) if want[0] else None
        gw = torch.zeros_like(w, dtype=acc) if want[1] else None
        total = torch.zeros((), dtype=acc, device=h.device)
        z = torch.empty((min(rows, x.size(0)), v), dtype=acc, device=h.device)  # one buffer
        with torch.autocast(h.device.type, enabled=False):
            for start in range(0, x.size(0), rows):
                xc, tc = x[start:start + rows], targets[start:start + rows, None]
                zc = z[:xc.size(0)]
                if dtype == acc:
                    torch.mm(xc, w.t(), out=zc)  # (c, V) logits
                else:
                    zc.copy_(xc @ w.t())
                # -log p = lse - z: (1 - eps) on the target, eps spread evenly over the V ids
                total -= (1 - smoothing) * zc.gather(1, tc).sum() + smoothing / v * zc.sum()
                top = zc.amax(1, keepdim=True)  # (c, 1)
                e = zc.sub_(top).exp_()  # exp(z - top), in place: no second (c, V) tensor
                s = e.sum(1, keepdim=True)  # (c, 1)
                total += (top + s.log()).sum()  # the log-sum-exp of each row
                if gx is None and gw is None:
                    continue
                g = e.mul_(1 / s)  # softmax
                if smoothing:
                    g.sub_(smoothing / v)  # - eps / V
                g.scatter_add_(1, tc, g.new_full(tc.shape, smoothing - 1))  # - (1 - eps) one-hot
                g = g.to(dtype)
                if gx is not None:
                    torch.mm(g, w, out=gx[start:start + rows])  # (c, D)
                if gw is not None and dtype == acc:
                    gw.addmm_(g.t(), xc)  # (V, D)
                elif gw is not None:
                    gw += g.t() @ xc  # (V, D), summed in float32 across the blocks
        ctx.save_for_backward(gx, gw)
        ctx.dtypes = h.dtype, weight.dtype
        return total

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        gx, gw = ctx.saved_tensors
        gx = None if gx is None else (gx * grad).to(ctx.dtypes[0])
        gw = None if gw is None else (gw * grad).to(ctx.dtypes[1])
        return gx, gw, None, None, None, None, None

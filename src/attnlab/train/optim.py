"""AdamW with decay / no-decay parameter groups, and the learning-rate schedules.

Weight decay applies to matrices only (as in GPT-2 / nanoGPT); fine-tuning may lower the rate
layer by layer (:func:`param_groups`). A schedule is a pure function of the step, so its whole
state is the step counter the trainer checkpoints.
"""

from __future__ import annotations

import math
import re

import torch
from torch import nn

from ..run_config import TrainConfig

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def layer_depth(name: str, n_layers: int) -> int:
    """Depth of parameter ``name`` for layer-wise decay: 0 for the embeddings (``emb.*``, and
    an encoder-decoder's ``src_emb.*`` / ``tgt_emb.*``), ``i + 1`` inside layer ``i`` of a
    stack (``...layers.i...``), ``n_layers + 1`` for the rest (final norm, pooler, head)."""
    if name.split(".", 1)[0] in ("emb", "src_emb", "tgt_emb"):
        return 0
    match = _LAYER.search(name)
    return int(match.group(1)) + 1 if match else n_layers + 1


def param_groups(model: nn.Module, weight_decay: float, layer_decay: float = 1.0) -> list[dict]:
    """AdamW groups: matrices (decayed) and the rest (not). Shared (tied) parameters are
    listed once, under their first name.

    Args:
        model: the model (its deepest stack, ``config.n_layers`` or an encoder-decoder's
            ``dec_layers``, sets the depth for ``layer_decay``).
        weight_decay: decay of the matrices.
        layer_decay: 1.0 = two groups; below 1, two groups per depth (:func:`layer_depth`),
            each with ``lr_scale = layer_decay ** (top - depth)``, which :func:`set_lr` applies.

    Returns:
        The groups, ready for ``torch.optim.AdamW`` (empty groups left out when decaying
        layer-wise).
    """
    if layer_decay == 1.0:
        decay, no_decay = [], []
        for p in model.parameters():  # deduplicated: a tied embedding / head appears once
            if p.requires_grad:
                (decay if p.dim() >= 2 else no_decay).append(p)
        return [{"params": decay, "weight_decay": weight_decay},
                {"params": no_decay, "weight_decay": 0.0}]
    top = max(model.config.n_layers, model.config.n_decoder_layers or 0) + 1
    groups: dict[tuple[int, bool], list[nn.Parameter]] = {}
    for name, p in model.named_parameters():  # deduplicated like parameters()
        if p.requires_grad:
            groups.setdefault((layer_depth(name, top - 1), p.dim() >= 2), []).append(p)
    return [{"params": params, "weight_decay": weight_decay if decayed else 0.0,
             "lr_scale": layer_decay ** (top - depth)}
            for (depth, decayed), params in sorted(groups.items())]


def build_optimizer(model: nn.Module, cfg: TrainConfig, device_type: str) -> torch.optim.AdamW:
    """AdamW over :func:`param_groups` with the fused kernel (CUDA and CPU: one kernel for all
    parameters, the fastest where there is one), falling back to the multi-tensor (foreach)
    kernel on devices without a fused one (MPS)."""
    impl = {"fused": True} if device_type in ("cuda", "cpu") else {"foreach": True}
    return torch.optim.AdamW(param_groups(model, cfg.weight_decay, cfg.layer_decay),
                             lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, **impl)


def cosine_lr(step: int, lr: float, min_lr: float, warmup: int, decay_steps: int) -> float:
    """Linear warmup to ``lr`` over ``warmup`` steps, then half a cosine down to ``min_lr`` at
    ``decay_steps``, constant after (nanoGPT's ``get_lr``). ``step`` counts from 0."""
    if step < warmup:
        return lr * (step + 1) / (warmup + 1)
    if step >= decay_steps:
        return min_lr
    ratio = (step - warmup) / max(1, decay_steps - warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)


def inverse_sqrt_lr(step: int, lr: float, warmup: int) -> float:
    """The paper's schedule (Vaswani et al. 2017, section 5.3, eq. 3): linear warmup, then
    decay with the inverse square root of the step, peaking at ``lr`` after ``warmup`` steps.

    The paper writes it as ``d_model^-0.5 * min(s^-0.5, s * warmup^-1.5)`` with s = step + 1;
    that is this function with ``lr = d_model^-0.5 * warmup^-0.5`` (see :func:`noam_peak`).
    """
    s = step + 1
    if warmup == 0:
        return lr / math.sqrt(s)
    return lr * min(s / warmup, math.sqrt(warmup / s))


def noam_peak(d_model: int, warmup: int, factor: float = 1.0) -> float:
    """Peak learning rate of the paper's schedule: ``factor * d_model^-0.5 * warmup^-0.5``."""
    return factor * d_model ** -0.5 * warmup ** -0.5


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate of optimizer step ``step`` (0-based) under ``cfg.schedule``."""
    if cfg.schedule == "cosine":
        return cosine_lr(step, cfg.lr, cfg.min_lr, cfg.warmup_steps,
                         cfg.decay_steps or cfg.max_steps)
    if cfg.schedule == "inverse_sqrt":
        return inverse_sqrt_lr(step, cfg.lr, cfg.warmup_steps)
    if step < cfg.warmup_steps:  # constant after a linear warmup
        return cfg.lr * (step + 1) / (cfg.warmup_steps + 1)
    return cfg.lr


def schedule_warnings(cfg: TrainConfig) -> list[str]:
    """What in ``cfg`` a user likely did not mean: a schedule cut short or never reaching its
    peak, a patience that cannot fire (allowed: short trial runs set max_steps alone)."""
    out = []
    if cfg.warmup_steps >= cfg.max_steps:
        out.append(f"train.warmup_steps={cfg.warmup_steps} >= max_steps={cfg.max_steps}: the "
                   f"learning rate never reaches lr={cfg.lr} (it ends at "
                   f"{lr_at(cfg.max_steps - 1, cfg):.3g})")
    if cfg.schedule == "cosine" and 0 < cfg.decay_steps <= cfg.warmup_steps:
        out.append(f"train.decay_steps={cfg.decay_steps} <= warmup_steps={cfg.warmup_steps}: "
                   "the cosine ends before the warmup does, so lr is never reached")
    if cfg.schedule == "cosine" and cfg.decay_steps > cfg.max_steps:
        out.append(f"train.decay_steps={cfg.decay_steps} > max_steps={cfg.max_steps}: the cosine "
                   f"ends at {lr_at(cfg.max_steps - 1, cfg):.3g}, not min_lr={cfg.min_lr} (set "
                   "decay_steps=0 to decay over max_steps)")
    every = cfg.eval_every or cfg.max_steps  # (and always at max_steps)
    evals = -(-cfg.max_steps // every)
    if cfg.patience and evals <= cfg.patience:
        out.append(f"train.patience={cfg.patience} cannot stop the run: it evaluates {evals} "
                   "time(s) (eval_every, max_steps)")
    return out


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Set every group's rate to ``lr`` times its ``lr_scale`` (1 when it has none)."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)

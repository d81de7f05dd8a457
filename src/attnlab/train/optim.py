"""AdamW (or Muon with AdamW) with decay / no-decay parameter groups, and the learning-rate
schedules.

Weight decay applies to matrices only (as in GPT-2 / nanoGPT); fine-tuning may lower the rate
layer by layer (:func:`param_groups`). A schedule is a pure function of the step, so its whole
state is the step counter the trainer checkpoints.
"""

from __future__ import annotations

import math
import re
from typing import Any

import torch
from torch import nn

from ..errors import ConfigError
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


def in_layer_matrix(name: str, p: nn.Parameter) -> bool:
    """Whether parameter ``name`` is a matrix inside a stack of layers (attention and
    feed-forward projections): what Muon optimises. Embeddings, output heads, poolers, norms
    and biases are not."""
    return p.dim() == 2 and _LAYER.search(name) is not None


def orthogonalize(g: torch.Tensor, steps: int = 5, eps: float = 1e-7,
                  dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The nearest semi-orthogonal matrix to ``g``, approximately: Muon's Newton-Schulz
    iteration (the quintic ``a x + b (x x^T) x + c (x x^T)^2 x`` with the reference's
    coefficients, which pushes every singular value into about [0.7, 1.2] in five steps),
    computed in ``dtype``. ``g`` may be a stack of matrices (``(..., rows, cols)``): each is
    orthogonalised on its own, in one batched product per term."""
    a, b, c = 3.4445, -4.7750, 2.0315
    x = g.to(dtype)
    # spectral norm <= Frobenius norm = 1: inside the iteration's range
    x = x / (torch.linalg.matrix_norm(x, keepdim=True) + eps)
    tall = x.size(-2) > x.size(-1)
    if tall:  # iterate on the wide side: x x^T is the smaller square
        x = x.mT
    for _ in range(steps):
        s = x @ x.mT
        x = a * x + (b * s + c * s @ s) @ x
    return (x.mT if tall else x).to(g.dtype)


class Muon(torch.optim.Optimizer):
    """Muon (Jordan et al. 2024) for matrices: SGD with Nesterov momentum whose update is
    made orthogonal (:func:`orthogonalize`), with decoupled weight decay. The step is scaled by
    ``0.2 * sqrt(max(rows, cols))``, the RMS of an AdamW step (Liu et al. 2025), so AdamW's
    learning rate and weight decay serve it too. The same update as ``torch.optim.Muon`` with
    ``adjust_lr_fn="match_rms_adamw"`` (tests/train/test_muon.py), which iterates in bf16 always;
    here ``ns_dtype`` chooses (the trainer: bf16 when it trains in bf16, else fp32, as a CPU
    without bf16 units runs bf16 products many times slower)."""

    def __init__(self, params, lr: float = 1e-3, weight_decay: float = 0.1,
                 momentum: float = 0.95, nesterov: bool = True, ns_steps: int = 5,
                 ns_dtype: torch.dtype = torch.float32) -> None:
        super().__init__(params, {"lr": lr, "weight_decay": weight_decay, "momentum": momentum,
                                  "nesterov": nesterov, "ns_steps": ns_steps})
        self.ns_dtype = ns_dtype
        for group in self.param_groups:
            for p in group["params"]:
                if p.dim() != 2:
                    raise ValueError(f"Muon optimises matrices; got a parameter of shape "
                                     f"{tuple(p.shape)} (a bug: give it to AdamW)")

    @torch.no_grad()
    def step(self) -> None:
        for group in self.param_groups:
            lr, mu = group["lr"], group["momentum"]
            by_shape: dict[torch.Size, list[torch.Tensor]] = {}
            for p in group["params"]:
                if p.grad is not None:
                    by_shape.setdefault(p.shape, []).append(p)
            for shape, params in by_shape.items():  # one batched iteration per shape
                grads = [p.grad for p in params]
                bufs = [self.state[p].setdefault("momentum_buffer", torch.zeros_like(p))
                        for p in params]
                torch._foreach_lerp_(bufs, grads, 1 - mu)
                updates = torch._foreach_lerp(grads, bufs, mu) if group["nesterov"] else bufs
                ortho = orthogonalize(torch.stack(updates), group["ns_steps"],
                                      dtype=self.ns_dtype)
                torch._foreach_mul_(params, 1 - lr * group["weight_decay"])
                torch._foreach_add_(params, ortho.unbind(0), alpha=-lr * 0.2 * max(shape) ** 0.5)


class MuonAdamW:
    """Muon for the matrices inside the layers (:func:`in_layer_matrix`), AdamW for the rest.

    :class:`Muon` replaces each matrix's update by its momentum made orthogonal; embeddings
    and heads stay with AdamW, as in Muon's reference and in modded-nanogpt. The two halves
    show one list of parameter groups, so the learning-rate schedule, the gradient scaler and
    checkpoints see one optimizer. Muon runs with its reference momentum (0.95, Nesterov) and
    its step scaled to an AdamW step's RMS, so one ``lr`` and ``weight_decay`` serve both.
    """

    def __init__(self, model: nn.Module, groups: list[dict], cfg: TrainConfig,
                 impl: dict[str, bool], ns_dtype: torch.dtype = torch.float32) -> None:
        muon_ids = {id(p) for name, p in model.named_parameters() if in_layer_matrix(name, p)}
        muon, adamw = [], []
        for group in groups:
            params = group["params"]
            for half, keep in ((muon, True), (adamw, False)):
                chosen = [p for p in params if (id(p) in muon_ids) is keep]
                if chosen:
                    half.append({**group, "params": chosen})
        if not muon:
            raise ConfigError("train.optimizer='muon' found no matrix inside the model's layers "
                              "to optimise; allowed: train.optimizer='adamw' for this model")
        self.muon = Muon(muon, lr=cfg.lr, weight_decay=cfg.weight_decay, ns_dtype=ns_dtype)
        self.adamw = torch.optim.AdamW(adamw, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
                                       eps=cfg.eps, **impl)

    @property
    def param_groups(self) -> list[dict]:
        """Both halves' groups (read afresh: loading a state dict replaces them)."""
        return self.muon.param_groups + self.adamw.param_groups

    def step(self) -> None:
        self.muon.step()
        self.adamw.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.muon.zero_grad(set_to_none)
        self.adamw.zero_grad(set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return {"muon": self.muon.state_dict(), "adamw": self.adamw.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.muon.load_state_dict(state["muon"])
        self.adamw.load_state_dict(state["adamw"])


def optimizer_kind(state: dict[str, Any]) -> str:
    """Which ``train.optimizer`` wrote optimizer state ``state`` (a checkpoint's)."""
    return "muon" if "muon" in state else "adamw"


def build_optimizer(model: nn.Module, cfg: TrainConfig, device_type: str,
                    precision: str = "fp32") -> torch.optim.AdamW | MuonAdamW:
    """``train.optimizer``: AdamW over :func:`param_groups`, or :class:`MuonAdamW` over the
    same groups (its Newton-Schulz iteration in bf16 when ``precision`` is bf16, else in
    fp32). AdamW uses the fused kernel (CUDA and CPU: one kernel for all parameters, the
    fastest where there is one), falling back to the multi-tensor (foreach) kernel on devices
    without a fused one (MPS)."""
    impl = {"fused": True} if device_type in ("cuda", "cpu") else {"foreach": True}
    groups = param_groups(model, cfg.weight_decay, cfg.layer_decay)
    if cfg.optimizer == "muon":
        return MuonAdamW(model, groups, cfg, impl, torch.bfloat16 if precision == "bf16"
                         else torch.float32)
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps,
                             **impl)


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

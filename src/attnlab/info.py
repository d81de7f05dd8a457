"""What a model costs: parameters by component (:func:`count_parameters`), FLOPs per token,
memory at a batch and length.

Estimates from the published formulas (:func:`estimate`), so that ``attnlab info`` says
before a run whether it fits in memory and what a step costs.
"""

from __future__ import annotations

import math
import os
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .config import ModelConfig
from .errors import ConfigError

if TYPE_CHECKING:
    import torch
    from torch import nn

# a model family in messages: "holds {FAMILY_WORDS[family]} model"
FAMILY_WORDS = {"decoder": "a decoder-only", "encoder": "an encoder-only",
                "encoder_decoder": "an encoder-decoder"}


def count_parameters(model: nn.Module, by_component: bool = False) -> int | dict[str, int]:
    """Total parameters (shared ones once), or a dict by component: "embeddings", each layer's
    "<stack>.<i>.attention" / ".cross_attention" / ".ffn", "norms" and "head"."""
    if not by_component:
        return sum(p.numel() for p in model.parameters())
    out: dict[str, int] = defaultdict(int)
    for name, p in model.named_parameters():  # shared (tied) parameters are listed once
        parts = name.split(".")
        if any("norm" in part for part in parts[:-1]):
            comp = "norms"
        elif "layers" in parts:
            i = parts.index("layers")
            stack, idx, sub = parts[i - 1], parts[i + 1], parts[i + 2]
            sub = {"self_attn": "attention", "cross_attn": "cross_attention"}.get(sub, sub)
            comp = f"{stack}.{idx}.{sub}"
        elif parts[0].endswith("emb") or parts[0] == "embed":
            comp = "embeddings"
        else:
            comp = "head"
        out[comp] += p.numel()
    last = [k for k in ("norms", "head") if k in out]  # printed after the blocks
    return {k: out[k] for k in [*(k for k in out if k not in last), *last]}


def min_parameters(cfg: ModelConfig) -> int:
    """The parameters of ``cfg``'s embedding, attention and feed-forward matrices (and an
    untied output projection), from the config alone: Python integers, no weight made. The
    biases, norms and a classifier's head are left out, so it is at most the count of the
    built model (:func:`count_parameters`), and within a few percent of it at real sizes."""
    d, inner = cfg.d_model, cfg.n_heads * cfg.head_dim
    attention = 4 * d * inner  # q, k, v, out
    ffn = {"swiglu": 3, "none": 0}.get(cfg.ffn, 2) * d * cfg.d_ff
    positions = cfg.max_len * d if cfg.pos == "learned" else 0
    total = cfg.vocab_size * d + positions + cfg.n_layers * (attention + ffn)
    if cfg.family == "encoder_decoder":  # the decoder's stack: self- and cross-attention
        tgt = cfg.tgt_vocab_size * d
        total += positions + (0 if cfg.share_embeddings else tgt)
        total += cfg.n_decoder_layers * (2 * attention + ffn)
        return total + (0 if cfg.tie_embeddings else tgt)
    return total + (cfg.vocab_size * d if cfg.family == "decoder" and not cfg.tie_embeddings
                    else 0)


def memory_of(device: torch.device) -> int | None:
    """The bytes of memory of ``device``: a GPU's own, or the machine's physical memory for
    the CPU; None where it is not known."""
    if device.type == "cuda":
        import torch

        return torch.cuda.get_device_properties(device).total_memory
    return host_memory() if device.type == "cpu" else None


def host_memory() -> int | None:
    """The bytes of physical memory of this machine; None where it is not known."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # (no sysconf on Windows)
        return None


def check_fits(cfg: ModelConfig, device: torch.device, shards: int = 1) -> None:
    """Refuse (:class:`~attnlab.errors.ConfigError`) a model whose training state cannot fit
    in ``device``'s memory, before a weight is made: at least 8 bytes a parameter (fp32
    weights and their gradients; the optimizer adds more) of :func:`min_parameters`, divided
    over ``shards`` processes under FSDP."""
    have = memory_of(device)
    params = min_parameters(cfg)
    need = 8 * params / shards
    if have is None or need <= have:
        return
    sizes = ", ".join(f"model.{k}={getattr(cfg, k):,}" for k in (
        "vocab_size", "d_model", "d_ff", "n_layers", "n_decoder_layers") if getattr(cfg, k))
    raise ConfigError(
        f"the model is too large to train here: {sizes} make "
        f"at least {params:,} parameters, whose weights and gradients alone take "
        f"{human_bytes(need)}{' per process' if shards > 1 else ''}, more than the "
        f"{human_bytes(have)} of {'this GPU' if device.type == 'cuda' else 'memory here'}; "
        "allowed: smaller sizes (`attnlab info CONFIG` counts a config's parameters and memory)")


def check_held(key: str, count: int, each: int, holds: str) -> None:
    """Refuse (:class:`~attnlab.errors.ConfigError`) ``key=count`` where ``count`` things of
    ``each`` bytes, held at once, exceed the machine's memory: ``holds`` says what holds them
    ("a step holds that many micro-batches"), the sizes follow."""
    have = host_memory()
    if have is not None and count * each > have:
        raise ConfigError(
            f"{key}={count:,} is not allowed: {holds} ({human_bytes(each)} each) at once, "
            f"{human_bytes(count * each)}, more than the {human_bytes(have)} of memory here; "
            f"allowed: at most {max(1, have // max(each, 1)):,}")


def check_micro_batches(grad_accum: int, batch_bytes: int) -> None:
    """Refuse ``train.grad_accum`` micro-batches of ``batch_bytes`` each that cannot be held
    at once in the machine's memory (a training step draws them all before its first
    forward)."""
    check_held("train.grad_accum", grad_accum, batch_bytes,
               "a step holds that many micro-batches")


@dataclass(frozen=True)
class Costs:
    params: int
    flops_per_token_forward: float
    flops_per_token_train: float
    train_memory_bytes: float
    inference_memory_bytes: float
    kv_cache_bytes: float


def _layer_flops(cfg: ModelConfig, ctx: int, cross_ctx: int | None = None) -> float:
    inner = cfg.n_heads * cfg.head_dim
    ffn_mats = {"swiglu": 3, "none": 0}.get(cfg.ffn, 2)
    flops = 2 * 4 * cfg.d_model * inner + 2 * 2 * ctx * inner + 2 * ffn_mats * cfg.d_model * \
        cfg.d_ff
    if cross_ctx is not None:  # cross-attention: q and out projections per target token,
        # k/v of the memory counted with the source tokens (estimate); scores over the source
        flops += 2 * 2 * cfg.d_model * inner + 2 * 2 * cross_ctx * inner
    return flops


def estimate(cfg: ModelConfig, params: int, batch: int, length: int,
             bytes_per_value: int = 4) -> Costs:
    """Costs of one model at batch ``batch`` and sequence length ``length`` (source and target
    lengths equal for the encoder-decoder).

    Args:
        bytes_per_value: of activations and inference weights: 4 fp32, 2 bf16/fp16.

    Returns:
        :class:`Costs`. FLOPs count a multiply-add as 2. Per token and layer (Kaplan et al.
        2020, table 1): projections ``2 * 4 * D * H*Dh``, attention scores and weighted sum
        ``2 * 2 * ctx * H*Dh``, feed-forward ``2 * 2 * D * d_ff`` (``2 * 3`` for SwiGLU), and
        the output head ``2 * D * V`` (a masked LM's at its masked tokens only, a
        classifier's once per sequence). Training is forward + backward, three times the
        forward FLOPs. Training memory follows Korthikanti et al. 2022: activations of
        ``B*T*D*34 + 5*B*H*T^2`` bytes per layer in 16-bit (doubled for fp32), plus 16 bytes
        per parameter for fp32 weights, gradients and AdamW's two moments; inference needs
        the weights and, for a model that decodes, the KV cache.
    """
    inner = cfg.n_heads * cfg.head_dim
    if cfg.family == "decoder":
        fwd = cfg.n_layers * _layer_flops(cfg, length) + 2 * cfg.d_model * cfg.vocab_size
        layers = cfg.n_layers
    elif cfg.family == "encoder":
        # a classifier's head runs once per sequence; a masked LM's at its masked tokens only
        # (BERT's share, tasks.classification.MASK_RATE)
        head = 2 * cfg.d_model * (cfg.vocab_size * 0.15 if cfg.head == "mlm"
                                  else cfg.n_classes / length)
        fwd = cfg.n_layers * _layer_flops(cfg, length) + head
        layers = cfg.n_layers
    else:  # per target token, with one source token per target token
        enc = cfg.n_layers * _layer_flops(cfg, length)
        # every decoder layer projects the memory to its own cross-attention keys and values
        dec = cfg.n_decoder_layers * (_layer_flops(cfg, length, cross_ctx=length)
                                + 2 * 2 * cfg.d_model * inner)
        fwd = enc + dec + 2 * cfg.d_model * cfg.tgt_vocab_size
        layers = cfg.n_layers + cfg.n_decoder_layers
    act_scale = bytes_per_value / 2
    activations = layers * (batch * length * cfg.d_model * 34
                            + 5 * batch * cfg.n_heads * length**2) * act_scale
    # keys and values of every decoder layer; an encoder-decoder's cache also holds each decoder
    # layer's cross-attention keys and values of the memory (source length = length here)
    kv_tensors = {"decoder": 2 * cfg.n_layers, "encoder": 0,
                  "encoder_decoder": 4 * (cfg.n_decoder_layers or 0)}[cfg.family]
    kv = kv_tensors * batch * length * inner * bytes_per_value
    return Costs(
        params=params,
        flops_per_token_forward=fwd,
        flops_per_token_train=3 * fwd,
        train_memory_bytes=16 * params + activations,
        inference_memory_bytes=params * bytes_per_value + kv,
        kv_cache_bytes=kv,
    )


@dataclass(frozen=True)
class DeviceMemory:
    """Bytes of the training state that one process holds (activations left out)."""

    parameters: float
    gradients: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.parameters + self.gradients + self.optimizer


def device_memory(params: int, world_size: int) -> dict[str, DeviceMemory]:
    """What each of ``world_size`` processes holds of a model of ``params`` parameters, under
    DDP and under FSDP: fp32 weights (4 bytes a parameter, also under autocast), fp32
    gradients (4) and AdamW's two fp32 moments (8). With ``P = params`` and ``K =
    world_size``:

    - DDP, every process a whole copy: weights ``4P``, gradients ``8P`` (the gradients and
      the all-reduce buckets DDP copies them into), optimizer ``8P``: ``20P`` whatever ``K``.
    - FSDP, every process a ``1/K`` shard of each: weights ``4P/K``, gradients ``4P/K``,
      optimizer ``8P/K``: ``16P/K``, up to each parameter's padding to ``K`` rows; besides, a
      layer's whole weights and gradients for the moment it computes.
    """
    k = world_size
    return {"ddp": DeviceMemory(4 * params, 8 * params, 8 * params),
            "fsdp": DeviceMemory(4 * params / k, 4 * params / k, 8 * params / k)}


def human(n: float, unit: str = "") -> str:
    for suffix in ("", "K", "M", "G", "T", "P"):
        if abs(n) < 1000:
            return f"{n:.3g}{suffix}{unit}"
        n /= 1000
    return f"{n:.3g}E{unit}"


def human_bytes(n: float) -> str:
    for suffix in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024:
            return f"{n:.3g} {suffix}"
        n /= 1024
    return f"{n:.3g} PiB"


# bytes of a value in each training precision (autocast: fp32 weights, 16-bit activations)
PRECISION_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


def report(cfg: ModelConfig, by_component: dict[str, int], batch: int, length: int,
           precision: str = "fp32", world_size: int = 1) -> str:
    """A plain-text table of parameters by component and the cost estimates; ``precision``
    (fp32, bf16, fp16: a run's) sizes the activations and the inference weights;
    ``world_size`` > 1 adds what each of as many processes holds under DDP and FSDP
    (:func:`device_memory`), and the activations of its share of the batch."""
    if precision not in PRECISION_BYTES:
        raise ValueError(f"precision={precision!r} is not allowed: one of "
                         f"{', '.join(PRECISION_BYTES)}")
    total = sum(by_component.values())
    lines = [f"model: {cfg.family}, {total:,} parameters, d_model={cfg.d_model}, "
             f"heads={cfg.n_heads}, layers={cfg.n_layers}"
             + (f"+{cfg.n_decoder_layers}" if cfg.family == "encoder_decoder" else "")
             + f", norm={cfg.norm}, pos={cfg.pos}, ffn={cfg.ffn}", "",
             f"{'component':<32}{'parameters':>14}{'share':>9}"]
    for name, n in by_component.items():
        lines.append(f"{name:<32}{n:>14,}{n / total:>9.1%}")
    lines.append(f"{'total':<32}{total:>14,}")
    c = estimate(cfg, total, batch, length, PRECISION_BYTES[precision])
    # an encoder reads its input in one pass: no cache of keys and values
    cache = "" if cfg.family == "encoder" else " + KV cache"
    trained = "fp32 + AdamW" if precision == "fp32" else \
        f"{precision} autocast, fp32 weights + AdamW"
    rows = [("FLOPs per token, inference (forward)", human(c.flops_per_token_forward)),
            ("FLOPs per token, training (fwd+bwd)", human(c.flops_per_token_train)),
            (f"memory, training ({trained})", human_bytes(c.train_memory_bytes)),
            (f"memory, inference ({precision}{cache})", human_bytes(c.inference_memory_bytes))]
    width = max(len(label) for label, _ in rows) + 2
    lines += ["", f"at batch {batch}, length {length}:",
              *(f"  {label + ':':<{width}}{value}" for label, value in rows)]
    if world_size > 1:
        lines += ["", *_device_lines(cfg, total, batch, length, precision, world_size)]
    return "\n".join(lines)


def _device_lines(cfg: ModelConfig, params: int, batch: int, length: int, precision: str,
                  world_size: int) -> list[str]:
    """The table of :func:`device_memory` for ``report``."""
    rows = math.ceil(batch / world_size)  # (rank 0's share: the most rows)
    activations = estimate(cfg, params, rows, length, PRECISION_BYTES[precision])
    activations_bytes = activations.train_memory_bytes - 16 * params
    head = ["parameters", "gradients", "optimizer", "total"]
    lines = [f"per process, {world_size} processes (fp32 weights, gradients, AdamW):",
             f"  {'':<6}" + "".join(f"{h:>12}" for h in head)]
    for name, m in device_memory(params, world_size).items():
        values = (m.parameters, m.gradients, m.optimizer, m.total)
        lines.append(f"  {name.upper():<6}" + "".join(f"{human_bytes(v):>12}" for v in values))
    lines.append(f"  plus activations of {rows} row{'s' * (rows > 1)} of the batch: "
                 f"{human_bytes(activations_bytes)}")
    return lines

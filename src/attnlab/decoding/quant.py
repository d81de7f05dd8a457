"""Reduced-precision inference: fewer weight bytes per generated token.

At batch 1 a decoding step reads every weight once for two FLOPs each, so on a CPU memory
bandwidth sets its speed, and halving or quartering the bytes per weight raises that limit.
:func:`to_inference_dtype` converts a trained model for decoding only; nothing here changes
training.
"""

from __future__ import annotations

import functools
import warnings
from typing import Literal

import torch
from torch import Tensor, nn

from ..errors import ConfigError

InferenceDtype = Literal["fp32", "bf16", "fp16", "int8"]
INFERENCE_DTYPES: tuple[str, ...] = ("fp32", "bf16", "fp16", "int8")


class PackedLinear(nn.Module):
    """An ``nn.Linear`` whose weight is packed for one of FBGEMM's CPU kernels (fp16 or int8
    weights, fp32 in and out). Same call signature as ``nn.Linear``; inference only.

    Args:
        linear: the layer to convert (its weight is read, not kept).
        kind: ``"fp16"`` or ``"int8"``.

    Shape:
        x: (..., in_features) fp32; output (..., out_features) fp32.
    """

    def __init__(self, linear: nn.Linear, kind: Literal["fp16", "int8"]):
        super().__init__()
        self.in_features, self.out_features, self.kind = (linear.in_features,
                                                          linear.out_features, kind)
        w = linear.weight.detach().float().contiguous()  # (out, in)
        b = None if linear.bias is None else linear.bias.detach().float()
        if kind == "fp16":
            self._packed = torch.ops.quantized.linear_prepack_fp16(w, b)
        else:
            # Symmetric per-row scales: an output row's largest weight maps to +-127.
            scale = (w.abs().amax(dim=1) / 127).clamp_min(1e-12).double()  # (out,)
            zero = torch.zeros(w.size(0), dtype=torch.long)
            with warnings.catch_warnings():
                # PyTorch marks its quantized tensor types deprecated; the pinned version has
                # them, and they exist here only for the moment of packing.
                warnings.simplefilter("ignore", UserWarning)
                q = torch.quantize_per_channel(w, scale, zero, 0, torch.qint8)
            self._packed = torch.ops.quantized.linear_prepack(q, b)

    def forward(self, x: Tensor) -> Tensor:
        if self.kind == "fp16":
            return torch.ops.quantized.linear_dynamic_fp16(x, self._packed)
        return torch.ops.quantized.linear_dynamic(x, self._packed, reduce_range())

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, {self.kind}"


@functools.cache
def reduce_range() -> bool:
    """Whether int8 activations keep to 7 bits: on CPUs without AVX-512 VNNI, FBGEMM's int8
    kernels (AVX2's ``vpmaddubsw``) add pairs of products in 16 bits, which saturate with
    full 8-bit activations (on an AVX2-only AMD EPYC, a tiny model's beam search then agreed
    with fp32 on 38 of 58 tokens); with VNNI the sums are 32-bit and the full range is used."""
    vnni = getattr(torch.cpu, "_is_vnni_supported", None)
    return not (vnni is not None and vnni())


def check_inference_dtype(dtype: str, device: torch.device | str, flag: str = "dtype") -> None:
    """Raise :class:`~attnlab.errors.ConfigError` (naming ``flag``, the value and what is
    allowed) unless ``dtype`` can run on ``device``."""
    if dtype not in INFERENCE_DTYPES:
        raise ConfigError(f"{flag} {dtype!r} is not allowed; allowed: "
                          f"{', '.join(INFERENCE_DTYPES)}")
    kind = torch.device(device).type
    if dtype == "int8" and kind != "cpu":
        raise ConfigError(f"{flag} 'int8' runs on the CPU only (FBGEMM kernels), not on {kind}; "
                          "allowed there: fp32, bf16, fp16")
    if dtype in ("fp16", "int8") and kind == "cpu":
        if "fbgemm" not in torch.backends.quantized.supported_engines:
            raise ConfigError(f"{flag} {dtype!r} on CPU needs PyTorch's FBGEMM kernels (x86 with "
                              "AVX2), which this build lacks; allowed here: fp32, bf16")


def to_inference_dtype(model: nn.Module, dtype: InferenceDtype) -> nn.Module:
    """Convert ``model`` in place for decoding in ``dtype``; returns it.

    * ``"fp32"``: nothing changes.
    * ``"bf16"``: every parameter cast to bfloat16 (activations and the KV cache follow). On a
      CPU the decoding loops take the kernels found faster for it on the machine
      (:func:`~attnlab.speed.decoding_kernels`, :func:`~attnlab.speed.cpu_sdpa_in`).
    * ``"fp16"``: on a CPU, every ``nn.Linear`` weight stored in float16 and multiplied by
      FBGEMM's fp16-weight kernel (fp32 activations and accumulation), which streams the
      weights at memory speed; norms, embeddings and the KV cache stay fp32. On a GPU, every
      parameter cast to float16.
    * ``"int8"`` (CPU only): every ``nn.Linear`` weight quantized to int8, one scale per output
      row (symmetric, ``max|w| / 127``). Each call also rounds its input, with one scale for
      all its rows and positions (FBGEMM's dynamic quantized linear), so a batched row, or a
      prompt run with and without the KV cache, may give other tokens than alone (the other
      dtypes give the same).

    Args:
        model: a model in eval mode, on its final device.
        dtype: ``"fp32"``, ``"bf16"``, ``"fp16"`` or ``"int8"``.

    Returns:
        The same model. fp16 / int8 on CPU replace each ``nn.Linear`` with a
        :class:`PackedLinear` (inference only; not saved back into a run dir), except an
        encoder-decoder's cross-attention q/k/v matrix, which stays fp32 (its rows are applied
        separately). A tied embedding keeps its fp32 table for the lookups: only the head's
        copy is converted.
    """
    device = next(model.parameters()).device
    check_inference_dtype(dtype, device)
    done = sorted({str(p.dtype) for p in model.parameters() if p.dtype != torch.float32})
    if any(isinstance(m, PackedLinear) for m in model.modules()):
        done.append("packed fp16 / int8 linear layers")
    if done:
        raise ValueError(f"the model is converted already ({', '.join(done)}): convert an "
                         "fp32 model, once")
    if dtype == "fp32":
        return model
    if dtype == "bf16" or device.type != "cpu":
        return model.to(torch.bfloat16 if dtype == "bf16" else torch.float16)
    # A cross-attention applies the rows of its stacked q/k/v matrix separately (queries to the
    # decoder, keys and values to the memory): it keeps that matrix in fp32.
    sliced = {id(m.cross_attn.qkv_proj) for m in model.modules()
              if getattr(m, "cross_attn", None) is not None}
    with torch.no_grad():
        for parent in list(model.modules()):
            for name, child in list(parent.named_children()):
                if type(child) is nn.Linear and id(child) not in sliced:
                    setattr(parent, name, PackedLinear(child, dtype))
    return model


__all__ = ["INFERENCE_DTYPES", "InferenceDtype", "PackedLinear", "check_inference_dtype",
           "to_inference_dtype"]

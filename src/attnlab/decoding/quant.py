"""Reduced-precision inference: fewer weight bytes per generated token.

At batch 1 a decoding step reads every weight once and does two FLOPs per weight, so on a
CPU its speed is set by memory bandwidth (see ``benchmarks/sample_speed.py``, which reports
tokens/s against that roofline). Halving or quartering the bytes per weight raises the
limit; whether a given mode actually gets there depends on the kernel behind it.

``to_inference_dtype(model, dtype)`` converts a trained model, in place, for decoding only:

* ``"fp32"``: nothing changes.
* ``"bf16"``: every parameter cast to bfloat16 (activations and the KV cache follow). The
  natural choice on a GPU or a CPU with AMX. On a CPU, one-row decoding steps take the
  matrix-vector product and attention kernels measured faster on the machine (oneDNN's or
  torch's own; :func:`attnlab.decoding.decoding_kernels`,
  :func:`attnlab.probe.one_query_in_fp32`): on an AMD EPYC without AMX that made
  batch-1 decoding 1.6x faster than oneDNN's path (``benchmarks/README.md``).
* ``"fp16"``: on CPU, the weights of every ``nn.Linear`` stored in float16 and multiplied by
  FBGEMM's fp16-weight kernel (``torch.ops.quantized.linear_dynamic_fp16``: fp32
  activations, fp32 accumulation), which streams fp16 weights at memory speed; norms,
  embeddings and the KV cache stay fp32. On a GPU: every parameter cast to float16.
* ``"int8"`` (CPU only): the weights of every ``nn.Linear`` quantized to int8, one scale
  per output row (symmetric, ``max|w| / 127``); each call quantizes its input to uint8 with
  one scale and zero point per call and multiplies in int32 (FBGEMM's dynamic quantized
  linear, ``torch.ops.quantized.linear_dynamic``), so the activations are rounded too, by a
  scale that depends on every row and position of the call: batched rows, or a prompt run
  with and without the KV cache, may then give other tokens than alone (fp32/bf16/fp16 give
  the same).

An encoder-decoder's cross-attention keeps its q/k/v matrix in fp32 under fp16 / int8 (its
rows are applied separately). The converted linears are inference-only (no autograd) and
cannot be saved back into a run dir; a tied embedding keeps its fp32 table for the lookups,
so only the head's copy is converted. Nothing here changes training.
"""

from __future__ import annotations

import warnings
from typing import Literal

import torch
from torch import Tensor, nn

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
        # reduce_range=False: the full uint8 range for the activations (FBGEMM on CPUs with
        # VNNI does not need the 7-bit range that guards older CPUs against overflow).
        return torch.ops.quantized.linear_dynamic(x, self._packed, False)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, {self.kind}"


def check_inference_dtype(dtype: str, device: torch.device | str, flag: str = "dtype") -> None:
    """Raise ``ValueError`` (naming ``flag``, the value and what is allowed) unless ``dtype``
    can run on ``device``."""
    if dtype not in INFERENCE_DTYPES:
        raise ValueError(f"{flag} {dtype!r} is not allowed; allowed: "
                         f"{', '.join(INFERENCE_DTYPES)}")
    kind = torch.device(device).type
    if dtype == "int8" and kind != "cpu":
        raise ValueError(f"{flag} 'int8' runs on the CPU only (FBGEMM kernels), not on {kind}; "
                         "allowed there: fp32, bf16, fp16")
    if dtype in ("fp16", "int8") and kind == "cpu":
        if "fbgemm" not in torch.backends.quantized.supported_engines:
            raise ValueError(f"{flag} {dtype!r} on CPU needs PyTorch's FBGEMM kernels (x86 with "
                             "AVX2), which this build lacks; allowed here: fp32, bf16")


def to_inference_dtype(model: nn.Module, dtype: InferenceDtype) -> nn.Module:
    """Convert ``model`` in place for decoding in ``dtype``; returns it (see the module
    docstring for what each dtype does).

    Args:
        model: a model in eval mode, on its final device.
        dtype: ``"fp32"``, ``"bf16"``, ``"fp16"`` or ``"int8"``.

    Returns:
        The same model. fp16 / int8 on CPU replace each ``nn.Linear`` with a
        :class:`PackedLinear`; bf16 (and fp16 on a GPU) cast the parameters.
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

"""Export an attnlab model to ONNX (``torch.onnx.export``, the ``torch.export`` path).

Needs ``onnx`` and ``onnxscript`` (and ``onnxruntime`` to verify); all are imported lazily.
Every dimension of every input is exported as dynamic (batch and sequence lengths), up to
the constraints the model itself has (e.g. ``T <= max_len`` for learned positions).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor, nn


class _FirstOutput(nn.Module):
    """Calls ``model(*args, **dict(zip(kw_names, rest)))`` and keeps the first output (the
    logits of ``(logits, loss)``), so ONNX gets plain tensor inputs and one tensor output."""

    def __init__(self, model: nn.Module, n_args: int, kw_names: Sequence[str]):
        super().__init__()
        self.model, self.n_args, self.kw_names = model, n_args, tuple(kw_names)

    def forward(self, *tensors: Tensor) -> Tensor:
        args, rest = tensors[: self.n_args], tensors[self.n_args:]
        out = self.model(*args, **dict(zip(self.kw_names, rest)))
        return out[0] if isinstance(out, tuple) else out


def export_onnx(model: nn.Module, path: str | os.PathLike, example: Tensor | tuple[Tensor, ...],
                *, kwargs: dict[str, Tensor] | None = None,
                input_names: Sequence[str] | None = None, output_name: str = "logits",
                verify: bool = False, atol: float = 1e-4) -> Path:
    """Write ``model`` (in eval mode) as an ONNX graph to ``path`` and return the path.

    Args:
        model: e.g. a :class:`~attnlab.models.DecoderLM`; its first output is exported.
        example: positional example inputs, e.g. ``ids`` (B, T) for a DecoderLM.
        kwargs: keyword tensor inputs, e.g. ``{"mask": valid}``; they follow the positional
            ones in the ONNX graph.
        input_names: ONNX input names; default ``input0, ...`` then the keyword names.
        verify: run the file with ``onnxruntime`` on the example and compare (``atol``).

    Raises:
        ImportError: onnx / onnxscript (or onnxruntime with ``verify``) is not installed.
        RuntimeError: with ``verify``, the ONNX output differs from PyTorch's.
    """
    try:
        import onnx  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError as e:
        raise ImportError("ONNX export needs: pip install onnx onnxscript onnxruntime") from e
    args = (example,) if isinstance(example, Tensor) else tuple(example)
    kwargs = kwargs or {}
    tensors = args + tuple(kwargs.values())
    names = list(input_names) if input_names is not None else (
        [f"input{i}" for i in range(len(args))] + list(kwargs))
    wrapper = _FirstOutput(model, len(args), list(kwargs))
    auto = torch.export.Dim.AUTO
    dynamic = (tuple({d: auto for d in range(t.dim())} for t in tensors),)  # (*tensors,)
    path = Path(path)
    was_training = model.training
    wrapper.eval()  # and so the model, its child (torch warns about a training-mode wrapper)
    try:
        torch.onnx.export(wrapper, tensors, str(path), dynamo=True, input_names=names,
                          output_names=[output_name], dynamic_shapes=dynamic, verbose=False)
        if verify:
            _verify(path, wrapper, tensors, names, atol)
    finally:
        model.train(was_training)
    return path


def _verify(path: Path, wrapper: nn.Module, tensors: tuple[Tensor, ...], names: list[str],
            atol: float) -> None:
    try:
        import onnxruntime
    except ImportError as e:
        raise ImportError("verify=True needs: pip install onnxruntime") from e
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run(None, {n: t.cpu().numpy() for n, t in zip(names, tensors)})[0]
    with torch.no_grad():
        want = wrapper(*tensors).float().cpu()
    diff = (torch.from_numpy(got).float() - want).abs().max().item()
    if not diff <= atol:
        raise RuntimeError(f"ONNX output differs from PyTorch by {diff:.3g} > atol={atol}")

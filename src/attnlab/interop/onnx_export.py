"""Export an attnlab model to ONNX (``torch.onnx.export``, the ``torch.export`` path).

Inputs and outputs are named as Hugging Face's and Optimum's exports name them
(``input_ids``, ``attention_mask``, ``decoder_input_ids`` -> ``logits``; dynamic axes
:data:`AXES`), so that code written for those runs the file as it is. Every input dimension
is dynamic, up to the model's own limits (``T <= max_len`` for learned positions). Needs
``onnx`` and ``onnxscript`` (``onnxruntime`` to verify), imported where they are used.
:func:`export_onnx_run` writes a run dir's model (``attnlab export --to onnx``).
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from torch import Tensor, nn

from ..errors import MissingDependencyError, UsageError
from ..files import write_files_atomic

# the names of each input's dynamic axes (as Optimum's ONNX exports name them); an input named
# otherwise gets axes that torch.export names itself
AXES: dict[str, tuple[str, ...]] = {
    "input_ids": ("batch", "sequence"),
    "attention_mask": ("batch", "sequence"),
    "decoder_input_ids": ("batch", "decoder_sequence"),
}


def example_inputs(model: nn.Module, batch: int = 2, length: int = 8, *,
                   generator: torch.Generator | None = None,
                   ) -> tuple[tuple[Tensor, ...], dict[str, Tensor], list[str]]:
    """Example inputs of an attnlab model for :func:`export_onnx`, by family.

    Args:
        model: a DecoderLM, EncoderClassifier or Transformer (reads ``model.config``).
        batch: the example's batch size B.
        length: the example's length T, cut to ``max_len``.
        generator: for the random token ids.

    Returns:
        ``(positional, keyword, input_names)``: ``(ids,), {}, ["input_ids"]`` for a decoder;
        ``(ids,), {"mask": mask}, ["input_ids", "attention_mask"]`` for an encoder (the last
        row half padding); ``(src, tgt), {"src_mask": mask}, ["input_ids",
        "decoder_input_ids", "attention_mask"]`` for an encoder-decoder (the last source row
        half padding, its ids ``pad_id`` there).
    """
    cfg = getattr(model, "config", None)
    if getattr(cfg, "family", None) not in ("decoder", "encoder", "encoder_decoder"):
        raise TypeError(f"example_inputs takes an attnlab model (DecoderLM, EncoderClassifier, "
                        f"Transformer), got {type(model).__name__}")
    for name, value in (("batch", batch), ("length", length)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} is not allowed: a positive integer")
    n = min(length, cfg.max_len)
    low = 1 if cfg.vocab_size > 1 else 0  # keep clear of pad_id 0: no padding by accident
    ids = torch.randint(low, cfg.vocab_size, (batch, n), generator=generator)  # (B, T)
    if cfg.family == "decoder":
        return (ids,), {}, ["input_ids"]
    mask = torch.ones(batch, n, dtype=torch.bool)  # (B, S), True at real tokens
    mask[-1, max(1, n // 2):] = False
    if cfg.family == "encoder":
        return (ids,), {"mask": mask}, ["input_ids", "attention_mask"]
    if cfg.pad_id is not None:  # the padding the mask says, in the ids too
        ids[~mask] = cfg.pad_id
    tgt = torch.randint(low, cfg.tgt_vocab_size, (batch, n), generator=generator)  # (B, T)
    return (ids, tgt), {"src_mask": mask}, ["input_ids", "decoder_input_ids", "attention_mask"]


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
                axes: Mapping[str, Sequence[str]] | None = None, verify: bool = False,
                atol: float = 1e-4) -> Path:
    """Write ``model`` (in eval mode) as an ONNX graph to ``path`` and return the path.

    Args:
        model: e.g. a :class:`~attnlab.models.DecoderLM`; its first output is exported.
        example: positional example inputs, e.g. ``ids`` (B, T) for a DecoderLM.
        kwargs: keyword tensor inputs, e.g. ``{"mask": valid}``; they follow the positional
            ones in the ONNX graph.
        input_names: ONNX input names; default ``input0, ...`` then the keyword names.
        axes: the names of the dynamic axes of each input, by input name (default
            :data:`AXES`); an axis named here can take any size up to the model's ``max_len``
            (and one name is one size: ``input_ids`` and ``attention_mask`` share theirs).
            Every axis of another input is dynamic too, named by ``torch.export``.
        verify: run the file with ``onnxruntime`` on the example and compare (``atol``).

    Raises:
        ImportError: onnx / onnxscript (or onnxruntime with ``verify``) is not installed.
        RuntimeError: with ``verify``, the ONNX output differs from PyTorch's.
    """
    try:
        import onnx  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError as e:
        raise MissingDependencyError("ONNX export needs: pip install onnx onnxscript "
                                     "onnxruntime") from e
    args = (example,) if isinstance(example, Tensor) else tuple(example)
    kwargs = kwargs or {}
    tensors = args + tuple(kwargs.values())
    if not all(isinstance(t, Tensor) for t in tensors):
        raise TypeError("the example inputs must be torch tensors, got "
                        f"{', '.join(type(t).__name__ for t in tensors)}")
    names = list(input_names) if input_names is not None else (
        [f"input{i}" for i in range(len(args))] + list(kwargs))
    if len(names) != len(tensors):
        raise ValueError(f"{len(names)} input_names for {len(tensors)} inputs: one name each")
    wrapper = _FirstOutput(model, len(args), list(kwargs))
    dynamic = (tuple(_dims(names, tensors, AXES if axes is None else axes,
                           getattr(getattr(model, "config", None), "max_len", None))),)
    path = Path(path)
    was_training = model.training
    wrapper.eval()  # and so the model, its child (torch warns about a training-mode wrapper)
    try:
        try:  # once eagerly: a bad example fails with its own message, not inside the export
            with torch.no_grad():
                wrapper(*tensors)
        except (TypeError, ValueError, RuntimeError, IndexError) as e:
            raise ValueError(f"the model does not run on the example inputs: {e}") from None
        # one self-contained file, unless the weights pass protobuf's 2 GB limit: then they go
        # to FILE.onnx.data beside it (keep the two together)
        size = sum(p.numel() * p.element_size() for p in model.parameters())
        with warnings.catch_warnings():  # an axis name two inputs share: as meant
            warnings.filterwarnings("ignore", message=r".*The axis name: .* will not be used")
            torch.onnx.export(wrapper, tensors, str(path), dynamo=True, input_names=names,
                              output_names=[output_name], dynamic_shapes=dynamic,
                              verbose=False, external_data=size >= 2**31 - 2**27)
        if verify:
            _verify(path, wrapper, tensors, names, atol)
    finally:
        model.train(was_training)
    return path


def export_onnx_run(run_dir: str | os.PathLike, out: str | os.PathLike,
                    which: str = "best") -> Path:
    """Write the model of a run dir as one ONNX file ``out`` (dynamic batch and lengths),
    verified with onnxruntime, and return its path. Written in a temporary folder beside
    ``out`` and renamed into place (weights over 2 GB in ``OUT.onnx.data`` first, the graph
    last), so a failed export leaves nothing behind.

    Args:
        run_dir: a run dir (trained or imported).
        out: the new file, ``NAME.onnx`` (must not exist).
        which: the checkpoint, ``best`` (default) or ``last``.

    Raises:
        UsageError: ``out`` is not a ``.onnx`` name, or exists.
    """
    from ..runs import load_run

    out = Path(out)
    if out.suffix != ".onnx":
        raise UsageError(f"--out {out} must be a FILE.onnx for --to onnx")
    if out.exists():
        raise UsageError(f"--out {out} already exists; choose a new file")
    model = load_run(run_dir, which).model.float()
    example, kwargs, names = example_inputs(model, generator=torch.Generator().manual_seed(0))
    quiet = logging.getLogger("torch.onnx")  # "torchvision is not installed" x4: not ours
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():  # torch's own deprecation notices, not the user's
            warnings.simplefilter("ignore", FutureWarning)
            write_files_atomic(out, lambda path: export_onnx(
                model, path, example, kwargs=kwargs, input_names=names, verify=True))
    finally:
        quiet.setLevel(level)
    return out


def _dims(names: Sequence[str], tensors: Sequence[Tensor], axes: Mapping[str, Sequence[str]],
          max_len: int | None) -> list[dict[int, object]]:
    """``torch.export``'s dynamic shape of each input: a named ``Dim`` (one object per name, so
    inputs that share an axis name share its size) where ``axes`` names the axis, else
    ``Dim.AUTO``. Named sequence axes are bounded by ``max_len`` (the positions the model has)."""
    named: dict[str, object] = {}
    shapes = []
    for name, t in zip(names, tensors):
        given = list(axes.get(name, ()))
        shape: dict[int, object] = {}
        for d in range(t.dim()):
            axis = given[d] if d < len(given) else None
            if axis is None:
                shape[d] = torch.export.Dim.AUTO
                continue
            if axis not in named:
                bound = {} if axis == "batch" or not max_len else {"max": max_len}
                named[axis] = torch.export.Dim(axis, **bound)
            shape[d] = named[axis]
        shapes.append(shape)
    return shapes


def _verify(path: Path, wrapper: nn.Module, tensors: tuple[Tensor, ...], names: list[str],
            atol: float) -> None:
    try:
        import onnxruntime
    except ImportError as e:
        raise MissingDependencyError("verify=True needs: pip install onnxruntime") from e
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run(None, {n: t.cpu().numpy() for n, t in zip(names, tensors)})[0]
    with torch.no_grad():
        want = wrapper(*tensors).float().cpu()
    diff = (torch.from_numpy(got).float() - want).abs().max().item()
    if not diff <= atol:
        raise RuntimeError(f"ONNX output differs from PyTorch by {diff:.3g} > atol={atol}")

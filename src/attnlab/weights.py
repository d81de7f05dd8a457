"""Model weights as safetensors files: saved atomically (tied weights once, no wrapper
prefixes), loaded with an error that names the tensors that do not fit. Loading never
unpickles; :class:`~attnlab.runs.RunDir` decides where the files go.

A model sharded over processes (``train.parallel = "fsdp"``) is saved as shards instead, each
process its own, with its optimizer's moments: a ``torch.distributed.checkpoint`` folder
(:func:`save_sharded`), which any number of processes, one without a process group included,
loads (:func:`load_sharded`). Its tensors load without unpickling, and its index of the
shards (a pickle, torch's format) is read by an unpickler that builds the index's own classes
and nothing else (:class:`IndexUnpickler`).
"""

from __future__ import annotations

import contextlib
import errno
import pickle
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .errors import RunError
from .files import atomic_write, fsync_file, set_umask_mode


def unwrap(model: nn.Module) -> nn.Module:
    """The model inside a ``torch.compile`` and a ``DistributedDataParallel`` wrapper, whose
    parameter names carry no ``_orig_mod.`` / ``module.`` prefix."""
    model = getattr(model, "_orig_mod", model)  # torch.compile wrapper
    return getattr(model, "module", model)  # DistributedDataParallel wrapper


def write_tensors(path: str | Path, save: Callable[[str], None], what: str) -> None:
    """``save(path)`` (a safetensors writer), flushed to the disk and with a plain file's mode.

    Raises:
        OSError: the writer failed (a full disk); the message names ``what``.
    """
    from safetensors import SafetensorError

    try:
        save(str(path))
    except SafetensorError as e:
        raise OSError(errno.EIO, f"cannot write {what} ({e})", str(path)) from None
    fsync_file(path)
    set_umask_mode(path)


def save_weights(model: nn.Module, path: Path) -> None:
    """Model weights as safetensors, written atomically: tied weights stored once (under the
    name ``safetensors.torch.load_model`` keeps), no wrapper prefixes, and no metadata, so
    the same weights give the same bytes (safetensors' own ``save_model`` lists the tied names
    it leaves out in a hash map, whose order changes from process to process)."""
    from safetensors.torch import _remove_duplicate_names, save_file

    state = unwrap(model).state_dict()
    for names in _remove_duplicate_names(state).values():
        for name in names:
            del state[name]
    state = {name: tensor.contiguous() for name, tensor in state.items()}
    atomic_write(Path(path), lambda tmp: write_tensors(tmp, lambda p: save_file(state, p),
                                                       "the weights"))


def load_weights(model: nn.Module, path: Path) -> None:
    """Load safetensors weights into ``model``.

    Raises:
        RunError: no such file, not a safetensors file, tensors that do not fit the model
            (named), or NaN / inf values.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_model

    path = Path(path)
    if not path.is_file():
        raise RunError(f"no checkpoint at {path}")
    try:
        missing, unexpected = load_model(unwrap(model), path, strict=False)
    except (SafetensorError, OSError) as e:
        raise RunError(f"checkpoint {path} is not a readable safetensors file: {e}") from e
    except RuntimeError as e:  # shape mismatch
        first = str(e).strip().splitlines()[-1].strip()
        raise RunError(
            f"checkpoint {path} does not fit this model (was it trained with a different "
            f"config?): {first}"
        ) from e
    if missing or unexpected:
        raise RunError(
            f"checkpoint {path} does not fit this model (different config?): "
            f"missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]}"
        )
    check_finite(model, path)


def check_finite(model: nn.Module, path: Path) -> None:
    """Refuse weights just loaded from ``path`` that hold NaN or inf (a diverged run's)."""
    for name, tensor in unwrap(model).state_dict().items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise RunError(f"checkpoint {path} is damaged: tensor {name!r} holds NaN or inf "
                           "values; use another checkpoint (best/ or last/) or train again")


class IndexUnpickler(pickle.Unpickler):
    """Reads a ``torch.distributed.checkpoint`` index (``.metadata``, which torch pickles)
    but refuses every class and function outside it: the index's own dataclasses, torch's
    sizes, dtypes and layouts, and paths. A pickle that would run anything else fails."""

    ALLOWED = {("torch", "Size"), ("torch.serialization", "_get_layout"),
               ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
               ("pathlib", "PosixPath"), ("pathlib", "WindowsPath"), ("pathlib", "Path")}

    def find_class(self, module: str, name: str) -> Any:
        if not ((module, name) in self.ALLOWED
                or module == "torch.distributed.checkpoint.metadata"
                or module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
            raise pickle.UnpicklingError(f"{module}.{name} is no part of a checkpoint's index")
        return super().find_class(module, name)


@contextlib.contextmanager
def _alone() -> Iterator[None]:
    """Quiet about one process without a process group: a sharded checkpoint's reader often
    is one (``attnlab eval``), and torch warns at every save and load."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _index_reader(folder: Path) -> Any:
    """torch's reader of a checkpoint folder, whose index is read by :class:`IndexUnpickler`."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class Reader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            with open(self._get_metadata_path(kwargs.get("rank")), "rb") as f:
                metadata = IndexUnpickler(f).load()
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return Reader(folder)


def save_sharded(folder: Path, model: nn.Module,
                 optimizer: torch.optim.Optimizer | None = None) -> list[dict] | None:
    """Write ``model``'s weights (and ``optimizer``'s per-parameter state) into ``folder`` as
    a ``torch.distributed.checkpoint``: every process of the group calls it and writes its
    own shards; it returns on each once all are written. Tensors are named as in the
    unwrapped model (``model.NAME``, ``optimizer.NAME.exp_avg``). Returns the optimizer's
    param groups (parameters by name, no tensors), for the training state's JSON."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    tensors: dict[str, Any] = {"model": get_model_state_dict(model)}
    groups = None
    if optimizer is not None:
        state = get_optimizer_state_dict(model, optimizer)
        tensors["optimizer"], groups = state["state"], state["param_groups"]
    with _alone():
        dcp.save(tensors, checkpoint_id=folder, no_dist=not torch.distributed.is_initialized())
    return groups


def load_sharded(folder: Path, model: nn.Module, optimizer: torch.optim.Optimizer | None = None,
                 groups: list[dict] | None = None) -> None:
    """Load a :func:`save_sharded` folder into ``model`` (and ``optimizer``, with the param
    ``groups`` it returned), sharded or whole, under any number of processes: each reads the
    parts of the shards it holds.

    Raises:
        RunError: tensors that do not fit the model (different config), an unreadable
            folder, or NaN / inf values.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    tensors: dict[str, Any] = {"model": get_model_state_dict(model)}
    if optimizer is not None:
        tensors["optimizer"] = get_optimizer_state_dict(model, optimizer)["state"]
    try:
        with _alone():
            dcp.load(tensors, storage_reader=_index_reader(folder),
                     no_dist=not torch.distributed.is_initialized())
    except (dcp.api.CheckpointException, OSError, RuntimeError, ValueError,
            pickle.UnpicklingError) as e:
        lines = [ln.strip() for ln in str(e).splitlines() if "Error" in ln or "key" in ln]
        raise RunError(f"checkpoint {folder} does not fit this model (was it trained with a "
                       f"different config?): {(lines or [str(e)])[-1][:300]}") from None
    set_model_state_dict(model, tensors["model"])
    if optimizer is not None:
        set_optimizer_state_dict(model, optimizer,
                                 {"state": tensors["optimizer"], "param_groups": groups})
    check_finite(model, folder)


def average_weights(model: nn.Module, paths: list[Path]) -> None:
    """Load into ``model`` the mean of the weights in ``paths`` (checkpoint averaging, as
    fairseq's ``average_checkpoints.py``).

    Each floating-point tensor is summed in float64 and divided once, then cast back, so N
    identical files give exactly that file's weights; integer tensors must agree.

    Raises:
        RunError: no paths, a file that does not fit ``model``, or integer tensors that differ.
    """
    if not paths:
        raise RunError("no checkpoints to average")
    total: dict[str, torch.Tensor] = {}
    for path in paths:
        load_weights(model, path)
        for name, tensor in unwrap(model).state_dict().items():
            if name not in total:
                total[name] = tensor.double() if tensor.is_floating_point() else tensor.clone()
            elif tensor.is_floating_point():
                total[name] += tensor.double()
            elif not torch.equal(total[name], tensor):
                raise RunError(f"cannot average {path}: its integer tensor {name!r} differs "
                               "from the other checkpoints'")
    with torch.no_grad():
        for name, tensor in unwrap(model).state_dict().items():
            if tensor.is_floating_point():
                tensor.copy_(total[name] / len(paths))


"""Training checkpoints without pickle: safetensors for tensors, JSON for everything else.

A checkpoint folder (``last/`` or ``best/``) holds::

    model.safetensors    the weights (from the unwrapped model: no ``_orig_mod.``/``module.``)
    state.safetensors    every tensor of the training state: optimizer moments and steps,
                         torch / CUDA RNG states, the batch generator's state, numpy's RNG key
    state.json           the rest: step, optimizer param groups, schedule, python's RNG, data
                         position, best metric... with ``{"__tensor__": key}`` where a tensor was
    manifest.json        written last (see :func:`attnlab.runs.write_dir_atomic`)

:func:`flatten` / :func:`unflatten` move tensors out of a nested state (dicts, lists, tuples,
numpy arrays) and back, so optimizer and RNG states round-trip exactly.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..runs import (
    MODEL_FILE,
    RunError,
    atomic_write_json,
    load_weights,
    save_weights,
    write_dir_atomic,
)

STATE_TENSORS = "state.safetensors"
STATE_JSON = "state.json"


def flatten(obj: Any, tensors: dict[str, torch.Tensor], key: str = "s") -> Any:
    """A JSON-able copy of ``obj``; tensors (and numpy arrays) go into ``tensors``."""
    if isinstance(obj, torch.Tensor):
        tensors[key] = obj.detach().cpu().contiguous().clone()
        return {"__tensor__": key}
    if isinstance(obj, np.ndarray):
        tensors[key] = torch.from_numpy(obj.astype(np.int64) if obj.dtype == np.uint32 else obj)
        return {"__ndarray__": key, "dtype": str(obj.dtype)}
    if isinstance(obj, dict):
        if not all(isinstance(k, (str, int)) for k in obj):
            raise TypeError(f"cannot checkpoint a dict with keys {list(obj)[:3]}")
        return {"__dict__": [[k, flatten(v, tensors, f"{key}.{k}")] for k, v in obj.items()]}
    if isinstance(obj, tuple):
        return {"__tuple__": [flatten(v, tensors, f"{key}.{i}") for i, v in enumerate(obj)]}
    if isinstance(obj, list):
        return [flatten(v, tensors, f"{key}.{i}") for i, v in enumerate(obj)]
    if isinstance(obj, (np.integer, np.floating)):
        return obj.item()
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"cannot checkpoint a value of type {type(obj).__name__}")


def unflatten(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """Inverse of :func:`flatten` (dict keys keep their int/str type)."""
    if isinstance(obj, list):
        return [unflatten(v, tensors) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if "__tensor__" in obj:
        return tensors[obj["__tensor__"]]
    if "__ndarray__" in obj:
        return tensors[obj["__ndarray__"]].numpy().astype(obj["dtype"])
    if "__tuple__" in obj:
        return tuple(unflatten(v, tensors) for v in obj["__tuple__"])
    if "__dict__" in obj:
        return {k: unflatten(v, tensors) for k, v in obj["__dict__"]}
    raise ValueError(f"malformed checkpoint state entry {str(obj)[:80]}")


def rng_state() -> dict[str, Any]:
    """The global RNG states: python, numpy, torch CPU and every CUDA device."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(),
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(dest: Path, model: nn.Module, state: dict[str, Any] | None = None,
                    meta: dict[str, Any] | None = None) -> None:
    """Write the folder ``dest`` atomically: weights, and the training ``state`` if given."""
    from safetensors.torch import save_file

    def write(tmp: Path) -> None:
        save_weights(model, tmp / MODEL_FILE)
        if state is not None:
            tensors: dict[str, torch.Tensor] = {}
            doc = flatten(state, tensors)
            save_file(tensors, str(tmp / STATE_TENSORS))
            atomic_write_json(tmp / STATE_JSON, doc)

    write_dir_atomic(Path(dest), write, meta)


def load_state(folder: Path) -> dict[str, Any]:
    """The training state saved by :func:`save_checkpoint` (never unpickles)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    folder = Path(folder)
    doc_path, tensor_path = folder / STATE_JSON, folder / STATE_TENSORS
    if not doc_path.is_file() or not tensor_path.is_file():
        raise RunError(f"checkpoint {folder} has no training state ({STATE_JSON} and "
                       f"{STATE_TENSORS}); it holds weights only and cannot be resumed")
    try:
        tensors = load_file(str(tensor_path))
        return unflatten(json.loads(doc_path.read_text()), tensors)
    except (SafetensorError, OSError, ValueError, KeyError) as e:
        raise RunError(f"checkpoint {folder} has an unreadable training state: {e}") from e


def load_checkpoint(folder: Path, model: nn.Module) -> dict[str, Any]:
    """Load weights into ``model`` and return the training state of ``folder``."""
    state = load_state(folder)
    load_weights(getattr(model, "module", model), Path(folder) / MODEL_FILE)
    return state

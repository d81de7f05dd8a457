"""A nested training state (dicts, lists, tuples, tensors, numpy arrays, numbers, strings) as a
JSON document plus a flat dict of tensors, and back, so that optimizer and RNG states
round-trip exactly without pickle (:class:`attnlab.runs.RunDir` stores the two parts)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


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

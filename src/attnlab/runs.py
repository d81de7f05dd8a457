"""Run directories: what training writes and what sample / translate / eval / viz read.

:class:`RunDir` is the one owner of a run dir; no other module spells the name of a file in
it. Layout::

    config.json          the resolved run config: {"model": {...}, "data": {...}, "train": {...}}
    tokenizer.json       the tokenizer (attnlab.tokenizers), when the run has one (translation
                         runs share one joint vocabulary between source and target)
    metrics.csv          one row per logged or evaluated step (written by train/monitor.py)
    tb/, loss.png        TensorBoard logs and the plotted training curves
    results.json         the final metrics of a finished training
    best/, last/         checkpoint folders:
        model.safetensors    the weights (of the unwrapped model: no ``_orig_mod.``/``module.``)
        state.safetensors    last/ only: every tensor of the training state (optimizer moments,
                             RNG states, the batch generator's state, numpy's RNG key)
        state.json           last/ only: the rest of it, ``{"__tensor__": key}`` where a tensor was
        manifest.json        written last: file sizes, plus the checkpoint's meta (step, best)

Weights are safetensors and the state is JSON + safetensors (loading never unpickles); the
model is rebuilt from the config. Every write is atomic: a temporary file in the same folder,
then ``os.replace``. Checkpoint folders are written whole into ``.NAME.tmp/`` (manifest last),
then swapped in with two renames (``NAME`` -> ``.NAME.old``, ``.NAME.tmp`` -> ``NAME``); a kill
at any moment leaves a complete copy that :meth:`RunDir.checkpoint_dir` finds.
"""

from __future__ import annotations

import csv
import errno
import io
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .config import ModelConfig
from .data.synthetic import SYNTHETIC_NAMES
from .devices import resolve_device
from .errors import RunError
from .files import atomic_write_json, fsync_dir, fsync_file, set_umask_mode
from .models import build_model
from .state_tree import flatten, unflatten
from .tokenizers import Tokenizer, load_tokenizer

MODEL_FILE = "model.safetensors"
STATE_TENSORS = "state.safetensors"
STATE_JSON = "state.json"
MANIFEST = "manifest.json"
CHECKPOINTS = ("best", "last")
# checkpoint meta "head" of an imported encoder whose classification head was never trained
UNTRAINED_HEAD = "untrained"


# ---- atomic files and folders -----------------------------------------------------------------
def _is_complete(folder: Path) -> bool:
    """True if ``folder`` holds a manifest whose files all exist with the recorded sizes."""
    try:
        files = json.loads((folder / MANIFEST).read_text())["files"]
        return all((folder / n).is_file() and (folder / n).stat().st_size == size
                   for n, size in files.items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def _siblings(dest: Path) -> tuple[Path, Path]:
    return dest.parent / f".{dest.name}.tmp", dest.parent / f".{dest.name}.old"


def _usable_copy(dest: Path) -> Path | None:
    """``dest`` itself, or after a kill between the two renames of :func:`write_dir_atomic`,
    its complete temporary or previous copy."""
    if (dest / MODEL_FILE).is_file():
        return dest
    for candidate in _siblings(dest):
        if _is_complete(candidate):
            return candidate
    return None


def write_dir_atomic(dest: Path, write: Callable[[Path], None], meta: dict | None = None) -> None:
    """Create folder ``dest`` so that readers see the old folder or the new one, never a mix.

    ``write(tmp)`` fills a temporary sibling folder; then the manifest (file sizes and
    ``meta``) is written last and the folder is swapped in with two renames.
    """
    dest = Path(dest)
    tmp, old = _siblings(dest)
    found = _usable_copy(dest)
    if found is not None and found != dest:  # a kill between the renames: put it back first
        os.replace(found, dest)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        write(tmp)
    except BaseException:  # (a full disk: give its space back; the old folder stays)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    files = {p.name: p.stat().st_size for p in sorted(tmp.iterdir()) if p.is_file()}
    atomic_write_json(tmp / MANIFEST, {"files": files, **(meta or {})})
    fsync_dir(tmp)
    if dest.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(dest, old)
    os.replace(tmp, dest)
    fsync_dir(dest.parent)
    shutil.rmtree(old, ignore_errors=True)


# ---- weights -------------------------------------------------------------------------------------
def _unwrap(model: nn.Module) -> nn.Module:
    model = getattr(model, "_orig_mod", model)  # torch.compile wrapper
    return getattr(model, "module", model)  # DistributedDataParallel wrapper


def _write_tensors(path: str | Path, save: Callable[[str], None], what: str) -> None:
    """``save(path)`` (a safetensors writer), flushed to the disk and with a plain file's mode;
    a failure (a full disk) as an OSError naming ``what``, one line in the CLI."""
    from safetensors import SafetensorError

    try:
        save(str(path))
    except SafetensorError as e:
        raise OSError(errno.EIO, f"cannot write {what} ({e})", str(path)) from None
    fsync_file(path)
    set_umask_mode(path)


def save_weights(model: nn.Module, path: Path) -> None:
    """Model weights as safetensors (tied weights stored once; no wrapper prefixes)."""
    from safetensors.torch import save_model

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        _write_tensors(tmp, lambda p: save_model(_unwrap(model), p), "the weights")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_weights(model: nn.Module, path: Path) -> None:
    """Load safetensors weights into ``model``; a mismatch names the differing tensors."""
    from safetensors import SafetensorError
    from safetensors.torch import load_model

    path = Path(path)
    if not path.is_file():
        raise RunError(f"no checkpoint at {path}")
    try:
        missing, unexpected = load_model(_unwrap(model), path, strict=False)
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
    for name, tensor in _unwrap(model).state_dict().items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise RunError(f"checkpoint {path} is damaged: tensor {name!r} holds NaN or inf "
                           "values; use another checkpoint (best/ or last/) or train again")


# ---- metrics.csv ---------------------------------------------------------------------------------
def read_metrics(path: str | Path, complete: bool = False) -> list[dict[str, int | float | None]]:
    """The rows of a metrics log: one dict per row in header order, ``step`` as int, other
    cells as floats, empty cells as None. A header without ``step``, an empty step cell or a
    cell that is not a number raises ``ValueError`` naming the line and column. ``complete``:
    leave out a last line without its newline (a row cut by a kill or a full disk)."""
    path = Path(path)
    with path.open(newline="", encoding="utf-8-sig") as f:  # (a BOM, as Excel saves it)
        text = f.read()
        if complete and not text.endswith("\n"):
            text = text[:text.rfind("\n") + 1]
        reader = csv.reader(io.StringIO(text))
        header = [h.strip() for h in next(reader, [])]
        if "step" not in header:
            raise ValueError(f"{path} must have a header with 'step'; got header {header}")
        rows = []
        for line_no, cells in enumerate(reader, start=2):
            if not any(c.strip() for c in cells):
                continue  # a blank line
            row: dict[str, int | float | None] = {}
            for col, cell in zip(header, [*cells, *[""] * (len(header) - len(cells))]):
                cell = cell.strip()
                if not cell and col == "step":
                    raise ValueError(f"{path} line {line_no}: the step cell is empty")
                try:
                    value = float(cell) if cell else None
                except ValueError as e:
                    raise ValueError(f"{path} line {line_no}, column {col!r}: {cell!r} is not a "
                                     "number (cells must be numbers or empty)") from e
                if col == "step" and not (value.is_integer() and value >= 0):  # (inf, nan too)
                    raise ValueError(f"{path} line {line_no}: step {cell!r} is not a whole "
                                     "number >= 0")
                row[col] = int(value) if col == "step" else value
            rows.append(row)
    return rows


# ---- the run dir ---------------------------------------------------------------------------------
class RunDir:
    """One run dir: the path of every file in it, and their reading and writing."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.config_file = self.path / "config.json"
        self.tokenizer_file = self.path / "tokenizer.json"
        self.metrics_file = self.path / "metrics.csv"
        self.results_file = self.path / "results.json"
        self.tb_dir = self.path / "tb"
        self.loss_plot = self.path / "loss.png"

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    # ---- config and tokenizer --------------------------------------------------------------------
    def read_config(self) -> dict[str, Any]:
        """The run config as a dict; clear errors for a missing folder or a broken file."""
        if not self.path.is_dir():
            what = "is a file, not a run dir" if self.path.exists() else "does not exist"
            raise RunError(f"run dir {self.path} {what} (give the --out folder of a training)")
        if not self.config_file.is_file():
            raise RunError(f"{self.path} is not an attnlab run dir: it has no "
                           f"{self.config_file.name}")
        try:
            cfg = json.loads(self.config_file.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise RunError(f"{self.config_file} is not valid JSON: {e}") from None
        if not isinstance(cfg, dict) or not isinstance(cfg.get("model"), dict):
            raise RunError(f"{self.config_file} has no 'model' section")
        bad = [k for k in ("data", "train") if not isinstance(cfg.get(k, {}), dict)]
        if bad:
            raise RunError(f"{self.config_file}: its {bad[0]!r} section is "
                           f"{cfg[bad[0]]!r}, not a table of settings")
        return cfg

    def write_config(self, config: dict[str, Any]) -> None:
        atomic_write_json(self.config_file, config)

    def has_tokenizer(self) -> bool:
        return self.tokenizer_file.is_file()

    def load_tokenizer(self) -> Tokenizer | None:
        """The run's tokenizer, or None when its task has none (the synthetic tasks: ids in,
        ids out); a text task's run without one is incomplete (an error that says so)."""
        if self.has_tokenizer():
            return load_tokenizer(self.tokenizer_file)
        name = self.read_config().get("data", {}).get("name")
        if name is not None and name not in SYNTHETIC_NAMES:
            raise RunError(f"{self.path} has no {self.tokenizer_file.name}, which a run of "
                           f"data.name={name!r} needs (only the synthetic tasks "
                           f"{', '.join(SYNTHETIC_NAMES)} have none): the run dir is "
                           "incomplete; copy the file from where the run was trained")
        return None

    def save_tokenizer(self, tokenizer: Tokenizer) -> None:
        tokenizer.save(self.tokenizer_file)

    # ---- checkpoints -----------------------------------------------------------------------------
    def checkpoint_dir(self, which: str) -> Path | None:
        """The usable copy of checkpoint folder ``which`` (best / last), or None."""
        return _usable_copy(self.path / _checked(which))

    def has_checkpoint(self, which: str | None = None) -> bool:
        """Whether checkpoint ``which`` (default: either) exists."""
        return any(self.checkpoint_dir(w) is not None for w in ([which] if which else CHECKPOINTS))

    def find_checkpoint(self, which: str = "best") -> Path:
        """The weights file of ``which``: ``best`` falls back to ``last`` and the other way
        round; an explicit path to a .safetensors file is taken as is."""
        order = {"best": ["best", "last"], "last": ["last", "best"]}.get(which)
        if order is None:
            path = Path(which)
            if path.name == STATE_TENSORS:
                raise RunError(f"checkpoint {which} is a training-state file (optimizer moments, "
                               f"not weights): give the {MODEL_FILE} beside it")
            if path.is_file():
                return path
            if path.suffix == ".safetensors":
                raise RunError(f"checkpoint file {which} does not exist")
            raise RunError(f"checkpoint {which!r} is not 'best', 'last' or a .safetensors file")
        for name in order:
            folder = self.checkpoint_dir(name)
            if folder is not None:
                return folder / MODEL_FILE
        raise RunError(f"run dir {self.path} has no checkpoint yet (no best/ or "
                       f"last/{MODEL_FILE}): train first, or wait for the first checkpoint")

    def checkpoint_meta(self, which: str) -> dict[str, Any]:
        """What training recorded with the checkpoint that :meth:`find_checkpoint` gives for
        ``which`` (step, best metric, precision; for a .safetensors path, the manifest beside
        it), so metadata and weights come from the same folder; empty when there is none."""
        try:
            meta = json.loads((self.find_checkpoint(which).parent / MANIFEST).read_text())
        except (RunError, OSError, ValueError):
            return {}
        return {k: v for k, v in meta.items() if k != "files"} if isinstance(meta, dict) else {}

    def untrained_head(self, which: str = "best") -> str | None:
        """One line saying why checkpoint ``which`` cannot classify yet (an imported encoder
        whose classification head was never trained: its meta says so), or None."""
        if self.checkpoint_meta(which).get("head") != UNTRAINED_HEAD:
            return None
        return (f"{self.path} is an imported encoder without a trained classification head "
                "(its head is freshly initialised, so its answers would be random); fine-tune "
                f"it first: attnlab train RECIPE --init-from {self.path}")

    def save_checkpoint(self, which: str, model: nn.Module, state: dict[str, Any] | None = None,
                        meta: dict[str, Any] | None = None) -> None:
        """Write checkpoint folder ``which`` atomically: the weights, the training ``state``
        if given (tensors to safetensors, the rest to JSON), and ``meta`` in the manifest."""
        from safetensors.torch import save_file

        def write(tmp: Path) -> None:
            save_weights(model, tmp / MODEL_FILE)
            if state is not None:
                tensors: dict[str, torch.Tensor] = {}
                doc = flatten(state, tensors)
                _write_tensors(tmp / STATE_TENSORS, lambda p: save_file(tensors, p),
                               "the training state")
                atomic_write_json(tmp / STATE_JSON, doc)

        write_dir_atomic(self.path / _checked(which), write, meta)

    def load_weights(self, model: nn.Module, which: str = "best") -> Path:
        """Load the weights of :meth:`find_checkpoint` ``(which)`` into ``model``; returns
        the file read."""
        path = self.find_checkpoint(which)
        load_weights(model, path)
        return path

    def load_state(self, which: str = "last") -> dict[str, Any]:
        """The training state saved with checkpoint ``which`` (never unpickles)."""
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        folder = self.checkpoint_dir(which)
        if folder is None:
            raise RunError(f"cannot resume: {self.path} has no {which}/ checkpoint")
        doc_path, tensor_path = folder / STATE_JSON, folder / STATE_TENSORS
        if not doc_path.is_file() or not tensor_path.is_file():
            raise RunError(f"checkpoint {folder} has no training state ({STATE_JSON} and "
                           f"{STATE_TENSORS}); it holds weights only and cannot be resumed")
        try:
            doc = json.loads(doc_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise RunError(f"{doc_path} is not valid JSON ({e}); the checkpoint is damaged "
                           "and cannot be resumed") from None
        try:
            state = unflatten(doc, load_file(str(tensor_path)))
        except (SafetensorError, OSError, ValueError, KeyError, TypeError) as e:
            raise RunError(f"checkpoint {folder} has an unreadable training state "
                           f"({STATE_JSON}, {STATE_TENSORS}): {e}") from None
        if not isinstance(state, dict):
            raise RunError(f"{doc_path} does not hold a training state; the checkpoint is "
                           "damaged and cannot be resumed")
        return state

    # ---- logs and results ------------------------------------------------------------------------
    def read_metrics(self) -> list[dict[str, int | float | None]]:
        return read_metrics(self.metrics_file)

    def write_results(self, results: dict[str, Any]) -> None:
        atomic_write_json(self.results_file, results)


def _checked(which: str) -> str:
    if which not in CHECKPOINTS:
        raise RunError(f"checkpoint {which!r} is not allowed here; allowed: best, last")
    return which


# ---- loading a trained model ----------------------------------------------------------------
@dataclass
class Run:
    """A trained model loaded from a run dir, ready for inference (eval mode)."""

    model: nn.Module
    config: dict[str, Any]
    tokenizer: Any
    run_dir: Path
    checkpoint: Path

    @property
    def data(self) -> dict[str, Any]:
        """The config's data section."""
        return self.config.get("data") or {}

    @property
    def label_names(self) -> list[str]:
        """Class names: the data section's ``label_names`` (or ``labels``), one per class of
        the model's ``n_classes``; "0", "1", ... when it has none."""
        n = self.model.config.n_classes
        names = self.data.get("label_names") or self.data.get("labels")
        if names is None:
            return [str(i) for i in range(n)]
        if not isinstance(names, (list, tuple)) or len(names) != n:
            raise RunError(f"{RunDir(self.run_dir).config_file}: data.label_names is {names!r}, "
                           f"but the model has {n} classes: give one name per class")
        return [str(x) for x in names]


def load_run(run_dir: str | Path, which: str = "best", device: str = "cpu") -> Run:
    """Rebuild the model of a run from its config and load its weights, in eval mode.

    Speed layouts for decoding (:func:`attnlab.decoding.inference_layout`) are the caller's
    choice; the model comes back as training saved it.
    """
    device = resolve_device(str(device), flag="device")  # (torch's assertions otherwise)
    rd = RunDir(run_dir)
    cfg = rd.read_config()
    model = build_model(ModelConfig.from_dict(cfg["model"]))
    ckpt = rd.load_weights(model, which)
    tokenizer = rd.load_tokenizer()
    if tokenizer is not None and tokenizer.vocab_size > model.config.vocab_size:
        # (fewer tokens than embeddings is fine: a vocabulary padded to a multiple of 64)
        raise RunError(f"{rd.path}: its tokenizer has {tokenizer.vocab_size} tokens but the "
                       f"model only {model.config.vocab_size} embeddings: the run is damaged")
    return Run(model.to(device).eval(), cfg, tokenizer, rd.path, ckpt)

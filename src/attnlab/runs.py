"""Run directories: what training writes and what sample / translate / eval / viz read.

:class:`RunDir` is the one owner of a run dir: no other module spells the name of a file in
it (the layout is listed beside the names below). Weights are safetensors
(:mod:`attnlab.weights`), the training state JSON + safetensors (:mod:`attnlab.state_tree`),
so loading never unpickles; the model is rebuilt from the config. Every file and checkpoint
folder is written atomically (:mod:`attnlab.files`): a kill at any moment leaves a complete
copy that :meth:`RunDir.checkpoint_dir` finds. A loaded :class:`Run` turns a text into its
model's inputs as training read them (:meth:`Run.inputs`), for every family.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .config import ModelConfig
from .data.synthetic import SYNTHETIC_NAMES
from .devices import resolve_device
from .errors import ConfigError, RunError, UsageError
from .files import atomic_write_json, interrupted_copy, missing_files, write_dir_atomic
from .metrics_log import Row, read_metrics
from .models import build_model
from .state_tree import flatten, unflatten
from .tokenizers import Tokenizer, load_tokenizer
from .weights import load_sharded, load_weights, save_sharded, save_weights, write_tensors

log = logging.getLogger(__name__)

# The layout of a run dir:
#   config.json        the resolved run config: {"model": {...}, "data": {...}, "train": {...}}
#   tokenizer.json     the tokenizer, when the run has one (translation runs share one joint
#                      vocabulary between source and target)
#   metrics.csv        one row per logged or evaluated step (attnlab.metrics_log)
#   tb/, loss.png      TensorBoard logs and the plotted training curves
#   results.json       the final metrics of a finished training
#   best/, last/       checkpoint folders, each swapped in whole (attnlab.files.write_dir_atomic):
#     model.safetensors    the weights (of the unwrapped model: no _orig_mod. / module.)
#     state.safetensors    last/ only: every tensor of the training state (optimizer moments,
#                          RNG states, the batch generator's state, numpy's RNG key)
#     state.json           last/ only: the rest of it, {"__tensor__": key} where a tensor was
#     manifest.json        written last: file sizes, plus the checkpoint's meta (step, best)
#   ... or, trained with train.parallel = "fsdp", sharded (its manifest's "shards": K):
#     .metadata            torch.distributed.checkpoint's index of the shards
#     __R_0.distcp         process R's shards of the weights and optimizer moments
#     state.safetensors, state.json, manifest.json   as above (the optimizer: its groups only)
MODEL_FILE = "model.safetensors"
SHARDS_INDEX = ".metadata"
STATE_TENSORS = "state.safetensors"
STATE_JSON = "state.json"
MANIFEST = "manifest.json"
CHECKPOINTS = ("best", "last")
STEPS_DIR = "steps"  # steps/NNNNNNNN/: weights of recent evaluations (train.keep_checkpoints)
# checkpoint meta "head" of an imported encoder whose classification head was never trained
UNTRAINED_HEAD = "untrained"


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

    def model_config(self, config: dict[str, Any] | None = None) -> ModelConfig:
        """The model config of the run (of ``config``, its :meth:`read_config` when given);
        a value it should not hold is one line naming the file and the key as the whole
        config names it (``runs/lm/config.json: model.d_model=...``, as
        :meth:`attnlab.run_config.RunConfig.of_run` says it)."""
        section = (self.read_config() if config is None else config)["model"]
        try:
            return ModelConfig.from_dict(section)
        except ConfigError as e:
            key = "model." if re.match(r"\w+=", str(e)) else ""  # (unknown keys come whole)
            raise ConfigError(f"{self.config_file}: {key}{e}") from None

    def write_config(self, config: dict[str, Any]) -> None:
        """Write the resolved run config (``RunConfig.to_dict()``)."""
        atomic_write_json(self.config_file, config)

    def has_tokenizer(self) -> bool:
        """Whether the run dir holds a tokenizer file."""
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
        """Write the run's tokenizer."""
        tokenizer.save(self.tokenizer_file)

    # ---- checkpoints -----------------------------------------------------------------------------
    def checkpoint_dir(self, which: str) -> Path | None:
        """The usable copy of checkpoint folder ``which`` (best / last), or None: the folder, or
        the complete copy a kill while it was being replaced left beside it."""
        folder = self.path / _checked(which)
        if (folder / MODEL_FILE).is_file() or _shards(folder):
            return folder
        return interrupted_copy(folder, MANIFEST)

    def sharded(self, which: str) -> bool:
        """Whether checkpoint ``which`` (best / last, as :meth:`find_checkpoint` picks it) is
        sharded: written by the processes of a ``train.parallel = "fsdp"`` run."""
        return self.find_checkpoint(which).name == SHARDS_INDEX

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
                return folder / (SHARDS_INDEX if _shards(folder) else MODEL_FILE)
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
                        meta: dict[str, Any] | None = None, *, shards: int = 0,
                        optimizer: torch.optim.Optimizer | None = None, main: bool = True,
                        sync: Callable[[], None] | None = None) -> None:
        """Write checkpoint folder ``which`` atomically: the weights, the training ``state``
        if given (tensors to safetensors, the rest to JSON), and ``meta`` in the manifest.

        ``shards``: K > 0 for a model sharded over K processes, which all call this (``main``
        the first, ``sync`` a barrier of them): the weights and ``optimizer``'s moments go to
        each process's shards (:func:`~attnlab.weights.save_sharded`), the optimizer's param
        groups into ``state``'s ``"optimizer"``, which rank 0 writes."""
        from safetensors.torch import save_file

        def write(tmp: Path) -> None:
            doc = dict(state or {})
            if shards:
                groups = save_sharded(tmp, model, optimizer)
                doc["optimizer"] = {"param_groups": groups}
            else:
                save_weights(model, tmp / MODEL_FILE)
            if state is not None and main:
                tensors: dict[str, torch.Tensor] = {}
                doc = flatten(doc, tensors)
                write_tensors(tmp / STATE_TENSORS, lambda p: save_file(tensors, p),
                              "the training state")
                atomic_write_json(tmp / STATE_JSON, doc)

        write_dir_atomic(self.path / _checked(which), write, manifest=MANIFEST,
                         meta={**(meta or {}), **({"shards": shards} if shards else {})},
                         main=main, sync=sync)

    def save_step_weights(self, step: int, model: nn.Module, meta: dict[str, Any],
                          keep: int) -> None:
        """Keep the weights of step ``step`` in ``steps/`` beside the ``keep - 1`` latest
        earlier ones (for :func:`attnlab.train.average_run`); later steps, left by a run
        resumed from an earlier checkpoint, go."""
        write_dir_atomic(self.path / STEPS_DIR / f"{step:08d}",
                         lambda tmp: save_weights(model, tmp / MODEL_FILE),
                         manifest=MANIFEST, meta=meta)
        kept = [s for s, _ in self.step_checkpoints() if s <= step][-keep:]
        for s, weights in self.step_checkpoints():
            if s not in kept:
                shutil.rmtree(weights.parent, ignore_errors=True)

    def step_checkpoints(self) -> list[tuple[int, Path]]:
        """(step, weights file) of every complete folder in ``steps/``, oldest first."""
        root = self.path / STEPS_DIR
        found = [(int(d.name), d / MODEL_FILE) for d in root.glob("[0-9]" * 8)
                 if (d / MODEL_FILE).is_file() and (d / MANIFEST).is_file()] \
            if root.is_dir() else []
        return sorted(found)

    def load_weights(self, model: nn.Module, which: str = "best",
                     optimizer: torch.optim.Optimizer | None = None,
                     optimizer_state: dict[str, Any] | None = None) -> Path:
        """Load the weights of :meth:`find_checkpoint` ``(which)`` into ``model``, whole or
        sharded (a sharded checkpoint: under any number of processes, also into ``optimizer``
        with the ``optimizer_state`` of :meth:`load_state`); returns the file read.

        Raises:
            RunError: a sharded checkpoint that lacks a file its manifest lists (one line
                naming the run dir and the files), or any error of the weights' loaders.
        """
        path = self.find_checkpoint(which)
        if path.name != SHARDS_INDEX:
            load_weights(model, path)
            return path
        missing = missing_files(path.parent, MANIFEST)
        if missing:
            shards = self.checkpoint_meta(which).get("shards", "several")
            raise RunError(f"run dir {self.path}: the sharded checkpoint {path.parent.name}/ "
                           f"(written by {shards} processes) is incomplete: "
                           f"{', '.join(missing)} missing; copy the whole folder from where "
                           "the run was trained")
        groups = (optimizer_state or {}).get("param_groups")
        load_sharded(path.parent, model, optimizer, groups)
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
            meta = self.checkpoint_meta(which)
            averaged = meta.get("averaged_steps")
            held = (f"the moving average of the weights of {meta.get('averaged_from', 'a run')}"
                    if "ema_decay" in meta else
                    f"the average of {len(averaged)} checkpoints (steps "
                    f"{', '.join(map(str, averaged))})" if averaged else None)
            if held:
                raise RunError(f"{self.path} holds {held}, not a training state: it cannot be "
                               f"resumed; train from it with --init-from {self.path}, or resume "
                               "the run it came from")
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
    def read_metrics(self) -> list[Row]:
        """The rows of the metrics log (:func:`attnlab.metrics_log.read_metrics`)."""
        return read_metrics(self.metrics_file)

    def write_results(self, results: dict[str, Any]) -> None:
        """Write the final metrics of a finished training."""
        atomic_write_json(self.results_file, results)


def _shards(folder: Path) -> bool:
    """Whether checkpoint ``folder`` is sharded: its manifest says how many processes wrote
    it (the files it lists are checked when it is read)."""
    try:
        return "shards" in json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError, TypeError):
        return False


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

    @property
    def predicts_classes(self) -> bool:
        """Whether the model's output is a class (an encoder classifier), not a token."""
        cfg = self.model.config
        return cfg.family == "encoder" and cfg.head != "mlm"

    def class_id(self, text: str, name: str = "class") -> int:
        """The class ``text`` names: one of :attr:`label_names`, or its number; ``name`` is
        what the error calls it."""
        names = self.label_names
        if text in names:
            return names.index(text)
        if text.strip().isdigit() and int(text) < len(names):
            return int(text)
        raise UsageError(f"{name} {text!r} is not a class of {self.run_dir}: allowed "
                         f"{', '.join(names)} (or 0..{len(names) - 1})")

    # ---- a text as the model read its inputs in training ---------------------------------------
    def encode(self, text: str, name: str = "text") -> list[int]:
        """``text`` as the model read its inputs in training: an encoder's text as the
        classifier reads it (``[CLS]`` first for ``cls`` pooling), a translation source with
        the run's ``data.src_add_special``, a decoder's text bare. ``name`` is what errors
        call it (an empty text; one longer than the model's ``max_len``)."""
        from .decoding.classify import encoder_input

        cfg, tok = self.model.config, self._text_tokenizer()
        if not text or (cfg.family != "decoder" and not text.strip()):
            raise UsageError(f"{name} is empty: give the text whose attention to show")
        if cfg.family == "encoder":
            ids = encoder_input(tok, cfg, text)
        elif cfg.family == "encoder_decoder":
            ids = tok.encode(text.strip(), add_special=bool(self.data.get("src_add_special",
                                                                          False)))
        else:
            ids = tok.encode(text)
        return self._fits(ids, len(ids), name)

    def encode_target(self, text: str, name: str = "target") -> list[int]:
        """A translation target as the decoder reads it in training: ``<bos> ... <eos>``."""
        if not text or not text.strip():
            raise UsageError(f"{name} is empty: give the text whose attention to show")
        ids = self._text_tokenizer().encode(text.strip(), add_special=True)
        return self._fits(ids, len(ids) - 1, name)  # the decoder reads <bos> ... (not <eos>)

    def target_ids(self, src: list[int], target: str | None = None,
                   name: str = "target") -> list[int]:
        """An encoder-decoder's target ids for source ids ``src``, as ``<bos> ... <eos>``:
        ``target`` encoded, else the model's greedy translation (what ``attnlab translate``
        gives: greedy, its length limit)."""
        if target is not None:
            return self.encode_target(target, name)
        from .decoding import translate
        from .decoding.translate import decode_limit

        tok = self._text_tokenizer()
        # the decoder reads <bos> + the output: at most max_len positions
        limit = min(decode_limit(self.model, len(src)), max(1, self.model.config.max_len - 1))
        out = translate(self.model, [src], beam=1, max_len=limit, bos_id=tok.bos_id,
                        eos_id=tok.eos_id, pad_id=tok.pad_id)[0]
        return [tok.bos_id, *out, tok.eos_id]

    def inputs(self, text: str, target: str | None = None,
               names: tuple[str, str] = ("text", "target")) -> tuple[torch.Tensor,
                                                                    torch.Tensor | None]:
        """The model's input for ``text``: ``(ids (1, T), None)``; an encoder-decoder's is
        ``(target ids (1, T), source ids (1, S))``, the target ``<bos> ... <eos>`` of
        :meth:`target_ids` (``target``, default the greedy translation of ``text``).
        ``names``: what errors call the text and the target."""
        ids = self.encode(text, names[0])
        if self.model.config.family != "encoder_decoder":
            return torch.tensor([ids]), None
        return torch.tensor([self.target_ids(ids, target, names[1])]), torch.tensor([ids])

    def _text_tokenizer(self) -> Tokenizer:
        if self.tokenizer is None:
            raise RunError(f"{self.run_dir} has no {RunDir(self.run_dir).tokenizer_file.name}: "
                           "cannot turn a text into tokens")
        return self.tokenizer

    def _fits(self, ids: list[int], read: int, name: str) -> list[int]:
        """``ids``, once the ``read`` positions the model reads fit in its ``max_len``."""
        limit = self.model.config.max_len
        if read > limit:
            raise UsageError(f"{name} is {read} tokens long as the model reads it, but it "
                             f"attends to at most {limit} (max_len); shorten it")
        return ids


def load_run(run_dir: str | Path, which: str = "best", device: str = "cpu") -> Run:
    """Rebuild the model of a run from its config and load its weights, in eval mode.

    Speed layouts for decoding (:func:`attnlab.decoding.inference_layout`) are the caller's
    choice; the model comes back as training saved it.

    Examples:
        >>> import tempfile
        >>> from attnlab import ModelConfig, build_model, load_run
        >>> from attnlab.runs import RunDir
        >>> from attnlab.tokenizers import CharTokenizer
        >>> tok = CharTokenizer.from_text("to be or not to be")
        >>> cfg = ModelConfig(family="decoder", vocab_size=tok.vocab_size, d_model=32, n_heads=2,
        ...                   n_layers=1, max_len=16)
        >>> rd = RunDir(tempfile.mkdtemp())  # by hand, what `attnlab train --out DIR` writes
        >>> rd.write_config({"model": cfg.to_dict(), "data": {}, "train": {}})
        >>> rd.save_tokenizer(tok)
        >>> rd.save_checkpoint("best", build_model(cfg))
        >>> run = load_run(rd.path)  # the best checkpoint
        >>> type(run.model).__name__, run.model.training, run.tokenizer.decode(run.encode("to be"))
        ('DecoderLM', False, 'to be')
    """
    device = resolve_device(str(device), flag="device")  # (torch's assertions otherwise)
    rd = RunDir(run_dir)
    cfg = rd.read_config()
    model = build_model(rd.model_config(cfg))
    ckpt = rd.load_weights(model, which)
    if which in CHECKPOINTS and ckpt.parent.name != which:  # (a run stopped before it wrote one)
        log.info("%s has no %s/ checkpoint: using its %s/", rd.path, which, ckpt.parent.name)
    tokenizer = rd.load_tokenizer()
    if tokenizer is not None and tokenizer.vocab_size > model.config.vocab_size:
        # (fewer tokens than embeddings is fine: a vocabulary padded to a multiple of 64)
        raise RunError(f"{rd.path}: its tokenizer has {tokenizer.vocab_size} tokens but the "
                       f"model only {model.config.vocab_size} embeddings: the run is damaged")
    return Run(model.to(device).eval(), cfg, tokenizer, rd.path, ckpt)

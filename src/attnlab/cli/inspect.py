"""``attnlab info`` and ``attnlab viz``: what a model costs and what it attends to."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from ..config import ModelConfig
from ..errors import ConfigError, UsageError
from .common import TEXT_FLAGS, check_layers_heads, check_out_path, check_target, load_text_run

log = logging.getLogger("attnlab")

# `viz positions`: the largest sinusoidal table drawn (max_len x d_model values). A heatmap has
# fewer pixels than that, so a larger table shows nothing more, and takes gigabytes to draw.
MAX_TABLE_VALUES = 2048 * 2048


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``info`` and ``viz attention | positions`` to the ``attnlab`` parser."""
    p = sub.add_parser("info", help="parameters by component, FLOPs per token, memory",
                       description="Parameters by component, FLOPs per token for training and "
                                   "inference, and memory at a batch size and length.")
    p.add_argument("target", help="a run dir, a recipe (a .toml file or a name such as sst2, as "
                   "`attnlab train` takes) or a model config .toml/.json")
    p.add_argument("--batch", type=int, default=1, help="batch size for the memory estimate")
    p.add_argument("--length", type=int, default=None,
                   help="sequence length (default: the model's max_len)")
    p.add_argument("--world-size", type=int, default=1, metavar="K",
                   help="also the memory each of K processes holds under DDP and FSDP")
    p.set_defaults(func=cmd_info)

    v = sub.add_parser("viz", help="attention heatmaps, HTML explorer, positional encodings",
                       description="Draw what a model attends to (viz attention) or its "
                       "positional encodings (viz positions).")
    vs = v.add_subparsers(dest="what", metavar="WHAT", required=True)
    a = vs.add_parser("attention", help="attention of a trained model on a text",
                      description="The attention weights of a trained run on one text, as a "
                      "grid of heatmaps (--out, one image per attention kind) and/or a "
                      "self-contained HTML page to explore them (--html): a decoder's "
                      "self-attention, an encoder's, or an encoder-decoder's encoder, decoder "
                      "and cross-attention (on --target, default its own greedy translation).")
    a.add_argument("run_dir", help="a run dir (trained, or made by `attnlab import`)")
    a.add_argument("--text", required=True, help="the input (the source, for translation)")
    a.add_argument("--target", default=None,
                   help="encoder-decoder: the target text (default: the model's greedy output)")
    a.add_argument("--layer", type=int, action="append", default=None,
                   help="layer index (repeatable; default all)")
    a.add_argument("--head", type=int, action="append", default=None,
                   help="head index (repeatable; default all)")
    a.add_argument("--out", default=None, help="PNG (or .svg/.pdf) grid of heatmaps")
    a.add_argument("--html", default=None, help="self-contained HTML explorer")
    a.add_argument("--checkpoint", default="best", help="best, last or a .safetensors path")
    a.set_defaults(func=cmd_viz_attention)
    pos = vs.add_parser("positions", help="sinusoidal table, or a run's learned positions",
                        description="Plot the sinusoidal position table (--d-model, --max-len) "
                                    "or, given a run dir, the run's learned position embeddings.")
    pos.add_argument("run_dir", nargs="?", default=None,
                     help="a run with learned positions (then no --d-model/--max-len)")
    size = f"max_len x d_model at most {MAX_TABLE_VALUES:,}"
    pos.add_argument("--d-model", type=int, default=None,
                     help=f"sinusoidal table: dimensions, even, >= 2 (default 128; {size})")
    pos.add_argument("--max-len", type=int, default=None,
                     help=f"sinusoidal table: positions, >= 1 (default 100; {size})")
    pos.add_argument("--out", required=True, help="PNG (or .svg/.pdf) to write")
    pos.set_defaults(func=cmd_viz_positions)


# ---- info -----------------------------------------------------------------------------------
def _precision(*names: object) -> str:
    """The first of ``names`` that is a precision a run holds its values in (fp32, bf16,
    fp16), else fp32 (``auto`` is measured when training starts)."""
    from ..info import PRECISION_BYTES

    return next((n for n in names if n in PRECISION_BYTES), "fp32")


def _config_from(target: Path) -> tuple[ModelConfig, str | None, str]:
    """The model config of a run dir, a recipe (path or name, as ``attnlab train`` takes) or a
    bare model config; for a config, a line on where its vocabulary size comes from; and the
    precision it trains in (a run's: what its checkpoint recorded)."""
    if target.is_dir():
        from ..runs import RunDir

        run = RunDir(target)
        config = run.read_config()
        precision = _precision(run.checkpoint_meta("best").get("precision"),
                               (config.get("train") or {}).get("precision"))
        return run.model_config(config), None, precision
    if not target.is_file():
        from .train import find_recipe

        try:
            target = find_recipe(str(target))
        except FileNotFoundError as e:
            raise UsageError(f"{target} is neither a run dir, a config file nor a recipe name "
                             f"({str(e).split('(', 1)[-1].rstrip(')')})") from None
    if target.suffix not in (".json", ".toml"):
        raise UsageError(f"{target}: expected a run dir, a .toml or a .json config")
    if target.suffix == ".toml":
        from ..run_config import read_toml

        data = read_toml(target)
    else:
        try:
            data = json.loads(target.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ConfigError(f"{target} is not valid JSON: {e}") from None
    if isinstance(data, dict) and ("data" in data or "train" in data):  # a training recipe:
        return _recipe_model(data)  # resolved as training does
    model = data.get("model", data) if isinstance(data, dict) else data
    if not isinstance(model, dict):
        raise ConfigError(f"{target}: expected a table of model settings ([model] or its keys), "
                          f"got {type(model).__name__}")
    cfg = ModelConfig.from_dict(model)
    why = "model.vocab_size of the config" if "vocab_size" in model else (
        "model.vocab_size's default; set it in the config for the real count")
    return cfg, f"vocabulary: {cfg.vocab_size} ({why})", "fp32"


def _recipe_model(data: dict) -> tuple[ModelConfig, str, str]:
    """A recipe's model as training builds it, without reading data: as its task derives it
    from the config (the family, the vocabulary size training would give it, or the assumed
    one, and why)."""
    from ..tasks import task_class
    from ..train import load_config

    rc = load_config(None, [], base=data)
    if rc.train.init_from:  # a fine-tuning recipe trains the source's model
        from ..train.finetune import init_config, load_source

        src = load_source(rc.train.init_from)
        rc = init_config(rc, src.config, rc.train.init_from)
        cfg, why = rc.model, f"the model of train.init_from={rc.train.init_from}"
        if rc.data.label_names and "model.n_classes" not in rc.explicit:
            cfg = cfg.replace(n_classes=len(rc.data.label_names))
    else:
        cfg, why = task_class(rc).model_from_config(rc)
    return cfg, f"vocabulary: {cfg.vocab_size} ({why})", _precision(rc.train.precision)


def cmd_info(args: argparse.Namespace) -> int:
    """Print parameters by component, FLOPs per token and memory for a run dir, recipe or
    model config."""
    cfg, vocabulary, precision = _config_from(Path(args.target))
    length = cfg.max_len if args.length is None else args.length
    for flag, value in (("--batch", args.batch), ("--length", length),
                        ("--world-size", args.world_size)):
        if value < 1:
            raise UsageError(f"{flag} {value} must be positive (an integer >= 1)")
    if length > cfg.max_len:  # the model refuses longer inputs: no figures for them
        raise UsageError(f"--length {length} is more than the model's max_len={cfg.max_len}: "
                         "give at most that (or a config with a larger model.max_len)")
    import torch

    from ..info import count_parameters, report
    from ..models import build_model

    with torch.device("meta"):  # count parameters without allocating them
        model = build_model(cfg)
    if vocabulary:
        print(vocabulary)
    print(report(cfg, count_parameters(model, by_component=True), args.batch, length, precision,
                 args.world_size))
    return 0


# ---- viz ------------------------------------------------------------------------------------
# More heatmaps than this in one grid take seconds to draw; the command says so first.
BIG_GRID = 24


def cmd_viz_attention(args: argparse.Namespace) -> int:
    """Draw a run's attention on ``--text``: heatmaps (``--out``) and/or the HTML explorer
    (``--html``); every output path is checked before anything is computed."""
    if not args.out and not args.html:
        raise UsageError("give --out FILE.png for heatmaps and/or --html FILE.html for the "
                         "explorer")
    from .. import viz
    from ..viz._common import check_image_path

    if args.out:
        check_out_path(args.out, "--out", "attention.png")
        check_image_path(args.out, "--out")
    if args.html:
        check_out_path(args.html, "--html", "attention.html")
        if args.out and Path(args.out).resolve() == Path(args.html).resolve():
            raise UsageError(f"--out and --html are both {args.out}: give two files (the "
                             "heatmaps would overwrite the page)")
    run = load_text_run(args.run_dir, args.checkpoint)
    check_target(run, args)
    check_layers_heads(run.model.config, args.layer, args.head)
    views = viz.attention_views(run, args.text, args.target, layers=args.layer,
                                heads=args.head, names=TEXT_FLAGS)
    if args.html:  # first: a page over the size limit fails before any file is written
        print(viz.write_attention_html(args.html, views, title=f"attnlab: {args.run_dir}"))
    if args.out:
        out = Path(args.out)
        for v in views:
            path = out if len(views) == 1 else out.with_name(
                f"{out.stem}_{v.name.split()[0].split('-')[0]}{out.suffix}")
            n_layers, n_heads = v.weights.shape[:2]
            if n_layers * n_heads > BIG_GRID:  # seconds of drawing: say what is going on
                print(f"drawing {v.name}: {n_layers} layers x {n_heads} heads = "
                      f"{n_layers * n_heads} heatmaps (--layer N / --head N draw fewer)",
                      file=sys.stderr, flush=True)
            viz.plot_attention(v.weights, v.query_tokens, v.key_tokens, path,
                               layer_labels=v.layer_ids, head_labels=v.head_ids, title=v.name)
            print(path)
    return 0


def cmd_viz_positions(args: argparse.Namespace) -> int:
    """Plot the sinusoidal position table (``--d-model``, ``--max-len``) or a run's learned
    position embeddings."""
    from .. import viz
    from ..viz._common import check_image_path

    check_out_path(args.out, "--out", "positions.png")
    check_image_path(args.out, "--out")
    if args.run_dir:
        from ..runs import load_run

        if args.d_model is not None or args.max_len is not None:
            raise UsageError(f"--d-model and --max-len size the sinusoidal table; the learned "
                             f"positions of {args.run_dir} have the run's size: give either a "
                             "run dir or --d-model/--max-len, not both")
        run = load_run(args.run_dir, "best")  # (no tokenizer needed: there is no text)
        pos = getattr(run.model, "emb", None) or getattr(run.model, "tgt_emb", None)
        table = getattr(getattr(pos, "pos", None), "weight", None)
        if table is None:
            kind = run.model.config.pos
            raise UsageError(f"{args.run_dir} uses {kind!r} positions, not learned ones; "
                             f"plot the sinusoidal table with --d-model/--max-len instead")
        title = f"learned position embeddings of {args.run_dir}"
    else:
        d_model = 128 if args.d_model is None else args.d_model
        max_len = 100 if args.max_len is None else args.max_len
        if d_model < 2 or d_model % 2:
            raise UsageError(f"--d-model {d_model} is not allowed: give an even number >= 2")
        if max_len < 1:
            raise UsageError(f"--max-len {max_len} is not allowed: give a number >= 1")
        if max_len * d_model > MAX_TABLE_VALUES:
            raise UsageError(f"--max-len {max_len} x --d-model {d_model} = "
                             f"{max_len * d_model:,} values is too many to plot: allowed "
                             f"max_len x d_model up to {MAX_TABLE_VALUES:,} (e.g. 2048 x 2048)")
        from ..nn import sinusoidal_table

        table = sinusoidal_table(max_len, d_model)
        title = f"sinusoidal positional encoding (d_model={d_model})"
    print(viz.plot_positions(table.detach(), args.out, title=title))
    return 0

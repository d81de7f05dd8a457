"""``attnlab info`` and ``attnlab viz``: what a model costs and what it attends to."""

from __future__ import annotations

import argparse
import json
import logging
import tomllib
from pathlib import Path

import torch

from ..config import ModelConfig
from ..info import report
from ..models import build_model
from .common import UserError

log = logging.getLogger("attnlab")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("info", help="parameters by component, FLOPs per token, memory",
                       description="Parameters by component, FLOPs per token for training and "
                                   "inference, and memory at a batch size and length.")
    p.add_argument("target", help="a run dir or a config .toml/.json")
    p.add_argument("--batch", type=int, default=1, help="batch size for the memory estimate")
    p.add_argument("--length", type=int, default=None,
                   help="sequence length (default: the model's max_len)")
    p.set_defaults(func=cmd_info)

    v = sub.add_parser("viz", help="attention heatmaps, HTML explorer, positional encodings")
    vs = v.add_subparsers(dest="what", metavar="WHAT", required=True)
    a = vs.add_parser("attention", help="attention of a trained model on a text")
    a.add_argument("run_dir")
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
    pos = vs.add_parser("positions", help="sinusoidal table, or a run's learned positions")
    pos.add_argument("run_dir", nargs="?", default=None)
    pos.add_argument("--d-model", type=int, default=128)
    pos.add_argument("--max-len", type=int, default=100)
    pos.add_argument("--out", required=True)
    pos.set_defaults(func=cmd_viz_positions)


# ---- info -----------------------------------------------------------------------------------
def _config_from(target: Path) -> tuple[ModelConfig, Path | None]:
    if target.is_dir():
        from ..runs import RunDir

        return ModelConfig.from_dict(RunDir(target).read_config()["model"]), target
    if not target.is_file():
        raise UserError(f"{target} is neither a run dir nor a config file")
    if target.suffix == ".json":
        data = json.loads(target.read_text())
    elif target.suffix == ".toml":
        try:
            data = tomllib.loads(target.read_text())
        except tomllib.TOMLDecodeError as e:
            raise UserError(f"{target} is not valid TOML: {e}") from e
    else:
        raise UserError(f"{target}: expected a run dir, a .toml or a .json config")
    return ModelConfig.from_dict(data.get("model", data)), None


def cmd_info(args: argparse.Namespace) -> int:
    cfg, _ = _config_from(Path(args.target))
    length = args.length or cfg.max_len
    if args.batch < 1 or length < 1:
        raise UserError(f"--batch {args.batch} and --length {length} must be positive integers")
    with torch.device("meta"):  # count parameters without allocating them
        model = build_model(cfg)
    print(report(cfg, model.num_parameters(by_component=True), args.batch, length))
    return 0


# ---- viz ------------------------------------------------------------------------------------
def _load(run_dir: str, checkpoint: str):
    from ..runs import RunDir, load_run

    run = load_run(run_dir, checkpoint)
    if run.tokenizer is None:
        raise UserError(f"{run_dir} has no {RunDir(run_dir).tokenizer_file.name}: cannot turn "
                        "--text into tokens")
    return run


def _encode(run, text: str, add_special: bool) -> list[int]:
    if not text:
        raise UserError("--text is empty: give the text whose attention to show")
    ids = run.tokenizer.encode(text, add_special=add_special)
    limit = run.model.config.max_len
    if len(ids) > limit:
        raise UserError(f"--text is {len(ids)} tokens long but the model attends to at most "
                        f"{limit} (max_len); shorten it")
    return ids


def _check_index(values: list[int] | None, n: int, what: str) -> list[int] | None:
    for v in values or []:
        if not 0 <= v < n:
            raise UserError(f"--{what} {v} is out of range: the model has {n} {what}s "
                            f"(0..{n - 1})")
    return values


def _collect_views(run, args) -> list[tuple[str, list[str], list[str], torch.Tensor, list[int]]]:
    """(name, query tokens, key tokens, weights (L, H, T, S), layer ids) per attention kind."""
    model, cfg, tok = run.model, run.model.config, run.tokenizer
    n_layers = cfg.n_layers if cfg.family != "encoder_decoder" else min(cfg.n_layers,
                                                                          cfg.dec_layers)
    layers = _check_index(args.layer, n_layers, "layer")
    heads = _check_index(args.head, cfg.n_heads, "head")
    layers = True if layers is None else layers
    with torch.no_grad():
        if cfg.family == "decoder":
            ids = _encode(run, args.text, False)
            maps = model.attention_maps(torch.tensor([ids]), layers=layers, heads=heads)
            toks = tok.token_strings(ids)
            kinds = [("decoder self-attention", "decoder", toks, toks)]
        elif cfg.family == "encoder":
            ids = _encode(run, args.text, True)
            maps = model.attention_maps(torch.tensor([ids]), layers=layers, heads=heads)
            toks = tok.token_strings(ids)
            kinds = [("encoder self-attention", "encoder", toks, toks)]
        else:
            src = _encode(run, args.text, True)
            tgt = _target_ids(run, src, args.target)
            maps = model.attention_maps(torch.tensor([src]), torch.tensor([tgt[:-1]]),
                                        layers=layers, heads=heads)
            s, t = tok.token_strings(src), tok.token_strings(tgt[:-1])
            kinds = [("encoder self-attention", "encoder", s, s),
                     ("decoder self-attention", "decoder", t, t),
                     ("cross-attention (target x source)", "cross", t, s)]
    views = []
    for name, stack, q, k in kinds:
        layer_ids = sorted(maps[stack])
        views.append((name, q, k, maps.stacked(stack)[:, 0], layer_ids))  # (L, H, T, S)
    return views


def _target_ids(run, src: list[int], target: str | None) -> list[int]:
    tok = run.tokenizer
    if target is not None:
        return _encode(run, target, True)
    from ..decoding import translate

    out = translate(run.model, [src], beam=1, bos_id=tok.bos_id, eos_id=tok.eos_id,
                    pad_id=tok.pad_id)[0]
    return [tok.bos_id, *out, tok.eos_id]


def cmd_viz_attention(args: argparse.Namespace) -> int:
    if not args.out and not args.html:
        raise UserError("give --out FILE.png for heatmaps and/or --html FILE.html for the "
                        "explorer")
    run = _load(args.run_dir, args.checkpoint)
    views = _collect_views(run, args)
    from .. import viz

    if args.out:
        out = Path(args.out)
        for name, q, k, w, layer_ids in views:
            path = out if len(views) == 1 else out.with_name(
                f"{out.stem}_{name.split()[0].split('-')[0]}{out.suffix}")
            heads = args.head or list(range(w.shape[1]))
            viz.plot_attention(w, q, k, path, layer_labels=layer_ids, head_labels=heads,
                               title=name)
            print(path)
    if args.html:
        page = [viz.AttentionView(name, q, k, w, layer_ids) for name, q, k, w, layer_ids in views]
        print(viz.write_attention_html(args.html, page, title=f"attnlab: {args.run_dir}"))
    return 0


def cmd_viz_positions(args: argparse.Namespace) -> int:
    from .. import viz

    if args.run_dir:
        run = _load(args.run_dir, "best")
        pos = getattr(run.model, "emb", None) or getattr(run.model, "tgt_emb", None)
        table = getattr(getattr(pos, "pos", None), "weight", None)
        if table is None:
            kind = run.model.config.pos
            raise UserError(f"{args.run_dir} uses {kind!r} positions, not learned ones; "
                            f"plot the sinusoidal table with --d-model/--max-len instead")
        title = f"learned position embeddings of {args.run_dir}"
    else:
        if args.d_model < 2 or args.d_model % 2 or args.max_len < 1:
            raise UserError(f"--d-model {args.d_model} must be even and >= 2, --max-len "
                            f"{args.max_len} positive")
        from ..nn.positional import sinusoidal_table

        table = sinusoidal_table(args.max_len, args.d_model)
        title = f"sinusoidal positional encoding (d_model={args.d_model})"
    print(viz.plot_positions(table.detach(), args.out, title=title))
    return 0

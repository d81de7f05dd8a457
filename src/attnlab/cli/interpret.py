"""``attnlab interpret``: why a run predicts what it does (logit lens, direct logit
attribution, ablation, activation patching, attention rollout, head scores).

Each sub-command prints a table, or with ``--json`` the numbers as JSON (stdout only); with
``--html FILE`` it also writes the explorer page with the analysis beside the attention views.
Bad input is one line and exit code 2, before anything is written.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from typing import Any

from ..errors import UsageError
from .common import TEXT_FLAGS, check_layers_heads, check_out_path, check_target, load_text_run

LM_HEAD = {"decoder", "encoder_decoder"}  # families whose model predicts tokens (+ masked LM)
FORMAT = "{:>8.4f}"


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``interpret lens | attribute | ablate | patch | rollout | heads``."""
    p = sub.add_parser("interpret", help="why a run predicts what it does: logit lens, "
                       "attribution, ablation, patching, rollout, head scores",
                       description="Look inside a trained run: each analysis prints a table "
                       "(--json: the numbers), --html writes the explorer page with it.")
    ps = p.add_subparsers(dest="action", metavar="ANALYSIS", required=True)
    a = _sub(ps, "lens", "what each layer predicts at each position (logit lens)")
    a.add_argument("--text", required=True, help="the input (the source, for translation)")
    a.add_argument("--k", type=int, default=5, help="top tokens kept per cell (default 5)")
    a = _sub(ps, "attribute", "each head's and feed-forward block's direct push towards a token")
    a.add_argument("--text", required=True, help="the input (the source, for translation)")
    a.add_argument("--token", required=True, help="the token whose logit is explained (one "
                   "token)")
    a.add_argument("--other", default=None, help="explain token minus this token's logit")
    a.add_argument("--position", type=int, default=-1, help="the position read (default -1)")
    a = _sub(ps, "ablate", "the loss change when each head or feed-forward block is removed")
    a.add_argument("--text", default=None, help="the text whose loss is measured")
    a.add_argument("--file", default=None, help="a UTF-8 text file whose loss is measured")
    a.add_argument("--split", default=None, choices=("val",), help="the run's own val "
                   "split as its evaluation reads it: a language model's sampled windows, a "
                   "classifier's first sentences and their labels, a masked LM's masked "
                   "sentences")
    a.add_argument("--batches", type=int, default=None, help="--split: batches (default 1)")
    a.add_argument("--kind", default="zero", choices=("zero", "mean"),
                   help="replace the output by 0 (zero) or its mean over the batch (mean)")
    a = _sub(ps, "patch", "activation patching: which layer/position and head carries the "
                          "answer from --clean into --corrupted")
    a.add_argument("--clean", required=True, help="the text the model gets right")
    a.add_argument("--corrupted", required=True, help="the same length, changed")
    a.add_argument("--answer", required=True, help="the right next token (one token); a "
                   "classifier's: the right class (its name or number)")
    a.add_argument("--wrong", required=True, help="the wrong next token (one token); a "
                   "classifier's: the wrong class")
    a.add_argument("--position", type=int, default=None, help="the position whose logits "
                   "are read (default -1, the last; of the translation so far, for a "
                   "translation run)")
    a = _sub(ps, "rollout", "attention rollout: attention through all layers, residuals "
                            "included")
    a.add_argument("--text", required=True, help="the input (the source, for translation)")
    a = _sub(ps, "heads", "head scores: previous-token, induction, duplicate-token, "
                          "first-token")
    a.add_argument("--text", default=None, help="--html: the text whose attention the page "
                   "shows beside the scores")


def _sub(ps: argparse._SubParsersAction, name: str, text: str) -> argparse.ArgumentParser:
    """One analysis sub-command with the options all of them take."""
    a = ps.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")
    a.add_argument("run_dir", help="a run dir (trained, or made by `attnlab import`)")
    a.add_argument("--target", default=None,
                   help="encoder-decoder: the target text (default: the model's greedy output)")
    a.add_argument("--json", action="store_true", help="print the numbers as JSON (stdout)")
    a.add_argument("--html", default=None, help="also write the explorer page here")
    a.add_argument("--layer", type=int, action="append", default=None,
                   help="only this layer (repeatable; default all)")
    a.add_argument("--head", type=int, action="append", default=None,
                   help="only this head (repeatable; default all)")
    a.add_argument("--checkpoint", default="best", help="best, last or a .safetensors path")
    a.set_defaults(func=cmd_interpret, text=None)
    return a


# ---- inputs ---------------------------------------------------------------------------------
def refuse_ignored(args: argparse.Namespace) -> None:
    """One line for an option that this analysis would ignore."""
    what = f"interpret {args.action}"
    if args.action == "rollout" and (args.layer is not None or args.head is not None):
        raise UsageError(f"{what} has no layer or head axis (it multiplies every layer's "
                         "attention, averaged over the heads): drop --layer and --head")
    if args.action == "lens" and args.head is not None:
        raise UsageError(f"{what} has no head axis (each row is a layer's residual stream): "
                         "drop --head")
    if args.action == "ablate" and args.batches is not None and args.split is None:
        raise UsageError(f"{what} --batches is for --split val (how many batches of the val "
                         "split); --text and --file are one text: drop --batches")
    if args.action == "heads":
        for flag, value in (("--text", args.text), ("--target", args.target)):
            if value is not None and not args.html:
                raise UsageError(f"{what} {flag} is for --html (the page shows the attention "
                                 "on it beside the scores, which are measured on repeated "
                                 f"random tokens): add --html FILE or drop {flag}")
        if args.html and args.text is None:
            raise UsageError(f"{what} --html needs --text: the text whose attention the page "
                             "shows beside the head scores")


def _load(args: argparse.Namespace):
    """The run, once the output path and the family checks pass."""
    if args.html:
        check_out_path(args.html, "--html", f"{args.action}.html")
    run = load_text_run(args.run_dir, args.checkpoint)
    cfg = run.model.config
    check_target(run, args)
    lm = cfg.family in LM_HEAD or cfg.head == "mlm"
    if args.action in ("lens", "attribute") and not lm:
        raise UsageError(f"interpret {args.action} needs an LM head (a model that predicts "
                         f"tokens); {args.run_dir} is an encoder classifier")
    check_layers_heads(cfg, args.layer, args.head)
    return run


def _two_outputs(a: int, b: int | None, first: str, second: str, shown: str | None = None,
                 ) -> None:
    """Refuse a logit difference of an output with itself (always 0): a token (by its id), or
    a class ``shown`` by its name."""
    if a == b:
        what, two = ("token", "tokens") if shown is None else ("class", "classes")
        raise UsageError(f"{first} and {second} are the same {what} ({shown or f'id {a}'}): the "
                         f"difference of their logits is always 0; give two different {two}")


def one_token(run, text: str, flag: str) -> int:
    """The id of ``text``, which must be exactly one token of the run's vocabulary."""
    tok = run.tokenizer
    if not text:
        raise UsageError(f"{flag} is empty: give one token")
    ids = tok.encode(text)
    if len(ids) != 1:
        raise UsageError(f"{flag} {text!r} is not one token: it encodes to {len(ids)} tokens "
                         f"{tok.token_strings(ids)}; give a single token")
    return ids[0]


def _inputs(run, args: argparse.Namespace, text: str, flag: str,
            use: str) -> tuple[Any, Any]:
    """(ids (1, T), src (1, S) or None) for ``text``, the option ``flag``: an
    encoder-decoder reads it as the source and ``--target`` (default its greedy output) as the
    ids. ``use``: what the analysis does with it, for the error of an empty ``flag``."""
    if not text:
        raise UsageError(f"{flag} is empty: give {use}")
    if args.target is not None and not args.target.strip():
        raise UsageError("--target is empty: give the translation the decoder reads, or drop "
                         "--target for the model's own")
    return run.inputs(text, args.target, names=(flag, "--target"))


def _strings(run, ids) -> list[str]:
    """The token strings of a (1, T) or (T,) id tensor."""
    return run.tokenizer.token_strings([int(i) for i in ids.flatten().tolist()])


# ---- the analyses ---------------------------------------------------------------------------
def cmd_interpret(args: argparse.Namespace) -> int:
    """Run one analysis, print it (a table, or ``--json``) and write ``--html`` (the page is
    made before anything is printed or written: bad input leaves nothing)."""
    refuse_ignored(args)
    run = _load(args)
    import torch

    with torch.no_grad():
        result, text_table, analyses, text = ANALYSIS[args.action](run, args)
    page = None
    if args.html:
        from ..viz import attention_views, write_attention_html

        views = attention_views(run, text, args.target, layers=args.layer, heads=args.head,
                                names=TEXT_FLAGS)
        page = write_attention_html(args.html, views, title=f"attnlab: {args.run_dir}",
                                    analyses=analyses)
    print(json.dumps(plain(result), allow_nan=False) if args.json else text_table)
    if page is not None and not args.json:
        print(page)
    return 0


def plain(value: Any) -> Any:
    """A result as JSON values: dataclasses and dicts as objects, tensors and arrays as
    (nested) lists, NaN as null."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if hasattr(value, "tolist"):  # a tensor or an array (or one of their numbers)
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _label(site: str) -> str:
    """A lens row's short name: ``embed`` for the first block's input, else the block."""
    if site.endswith("blocks.0.resid_pre"):
        return "embed"
    return "layer " + site.split("blocks.")[-1].split(".")[0]


def _short(token: str, width: int = 8) -> str:
    """A token for a table cell: repr'd (spaces and newlines show), at most ``width``."""
    shown = repr(token)[1:-1]
    return shown if len(shown) <= width else shown[:width - 1] + "~"


def lens(run, args: argparse.Namespace) -> tuple[Any, str, list, str]:
    """``interpret lens``: every layer's top next token at every position."""
    from ..interpret.lens import logit_lens
    from ..viz.explorer import LensView

    ids, src = _inputs(run, args, args.text, "--text", "the text whose next tokens each "
                       "layer predicts")
    if args.k < 1 or args.k > run.model.config.vocab_size:
        raise UsageError(f"--k {args.k} is out of range: 1..{run.model.config.vocab_size} "
                         "(the vocabulary size)")
    result = logit_lens(run.model, ids, k=args.k, src=src, layers=args.layer)
    tokens, rows = _strings(run, ids), [_label(n) for n in result.layers]
    top = [[_strings(run, result.top_ids[r, 0, t]) for t in range(len(tokens))]
           for r in range(len(rows))]
    targets = None if result.targets is None else [
        None if i < 0 else run.tokenizer.token_strings([i])[0]
        for i in result.targets[0].tolist()]
    view = LensView("logit lens", tokens, rows, top, result.top_probs[:, 0], targets,
                    _or_none(result.target_prob), _or_none(result.target_rank))
    width = 7 + 9 * len(tokens)
    lines = [f"logit lens of {args.run_dir}: the top next token of each layer (rows) at each "
             "position (columns); loss: of the real next tokens", "-" * width,
             f"{'':8}{'loss':>7} " + " ".join(f"{_short(t):>8}" for t in tokens)]
    for r, name in enumerate(rows):
        loss = "" if result.loss is None else f"{float(result.loss[r]):7.3f}"
        lines.append(f"{name:8}{loss:>7} " + " ".join(f"{_short(c[0]):>8}" for c in top[r]))
    if targets is not None:
        lines.append(f"{'real':8}{'':7} " + " ".join(
            f"{_short(t) if t is not None else '':>8}" for t in targets))
    return _without(result, "logits"), "\n".join(lines), [view], args.text


def _or_none(x):
    """A (R, B, T) tensor's first row of the batch, or None."""
    return None if x is None else x[:, 0]


def _without(result: Any, *names: str) -> dict[str, Any]:
    """A result dataclass as a dict of its fields, leaving out ``names`` (too big to print)."""
    return {f.name: getattr(result, f.name) for f in dataclasses.fields(result)
            if f.name not in names}


def attribute(run, args: argparse.Namespace) -> tuple[Any, str, list, str]:
    """``interpret attribute``: each component's direct share of ``--token``'s logit."""
    from ..interpret.hooks import check_index
    from ..interpret.lens import direct_logit_attribution
    from ..viz.explorer import HeadGrid

    token = one_token(run, args.token, "--token")
    other = None if args.other is None else one_token(run, args.other, "--other")
    _two_outputs(token, other, "--token", "--other")
    ids, src = _inputs(run, args, args.text, "--text", "the text whose logit at "
                       "--position is explained")
    n = ids.size(1)
    if not -n <= args.position < n:
        raise UsageError(f"--position {args.position} is out of range: the input is {n} "
                         f"tokens ({-n}..{n - 1})")
    result = direct_logit_attribution(run.model, ids, token=token, other=other,
                                      position=args.position, src=src)
    check_index(args.layer or (), result.ffn.size(0), "layer", "the stack the head reads")
    picked = args.layer is not None or args.head is not None
    if picked:  # NaN (null) outside --layer / --head, as interpret ablate leaves them
        result = dataclasses.replace(
            result, heads=chosen(result.heads, args.layer, args.head),
            ffn=chosen(result.ffn, args.layer, args.head, per_head=False),
            cross_heads=None if result.cross_heads is None else chosen(
                result.cross_heads, args.layer, args.head))
    what = f"logit({args.token!r})" + ("" if other is None else f" - logit({args.other!r})")
    grids = [HeadGrid(f"direct attribution: {what}", result.heads[..., 0],
                      note="each head's direct share of the logit (difference)")]
    if result.cross_heads is not None:
        grids.append(HeadGrid(f"direct attribution (cross-attention): {what}",
                              result.cross_heads[..., 0], view=_views(run).get("cross")))
    lines = [f"direct logit attribution of {what} at position {args.position}: "
             f"{float(result.logit[0]):.4f}" + ("; below, the shares of the chosen "
                                                 "--layer / --head" if picked else
                                                 " = the shares below"),
             f"embeddings {float(result.embed[0]):.4f}, biases {float(result.bias[0]):.4f}",
             grid_table("heads", result.heads[..., 0]),
             grid_table("feed-forward", result.ffn[:, 0][:, None], cols=["ffn"])]
    if result.cross_heads is not None:
        lines.insert(3, grid_table("cross-attention heads", result.cross_heads[..., 0]))
    return result, "\n".join(lines), grids, args.text


def _views(run) -> dict[str, str]:
    """Each attention stack -> the name of its view on the page (as ``viz attention``)."""
    from ..viz import view_names

    return view_names(run.model)


def grid_table(title: str, grid: Any, cols: list[str] | None = None) -> str:
    """A (L, C) grid as text: a title line, then one row per layer; the rows and columns with
    no number (NaN: outside --layer / --head) are left out, other NaN cells are blank."""
    rows = grid.tolist()
    cols = cols or [f"head {h}" for h in range(len(rows[0]) if rows else 0)]
    shown = [c for c in range(len(cols)) if any(not math.isnan(r[c]) for r in rows)]
    if not shown:
        return f"{title}: nothing in the chosen --layer / --head"
    lines = [title, f"{'':8}" + "".join(f"{cols[c]:>9}" for c in shown)]
    for layer, row in enumerate(rows):
        if any(not math.isnan(row[c]) for c in shown):
            lines.append(f"layer {layer:<2}" + "".join(
                f"{'':>9}" if math.isnan(row[c]) else f"{row[c]:9.4f}" for c in shown))
    return "\n".join(lines)


def chosen(grid: Any, layers: list[int] | None, heads: list[int] | None,
           per_head: bool = True) -> Any:
    """A copy of ``grid`` (L, H, ...), or (L, ...) with ``per_head`` False, with NaN outside
    ``--layer`` and ``--head``, as ``interpret ablate`` leaves what it skips (a grid with no
    head axis, such as the feed-forward blocks', is all NaN once ``--head`` is given)."""
    out = grid.clone()
    if layers is not None:
        out[[i for i in range(out.size(0)) if i not in layers]] = math.nan
    if heads is not None and not per_head:
        out[:] = math.nan
    elif heads is not None:
        out[:, [h for h in range(out.size(1)) if h not in heads]] = math.nan
    return out


# what interpret ablate does with --text and --file (for their errors)
TEXT_USE = "the text whose loss each ablation changes"
FILE_USE = "a UTF-8 text file whose loss each ablation changes"


def ablate_batch(run, args: argparse.Namespace) -> tuple[Any, str]:
    """The batch ``interpret ablate`` measures: ``--text``, ``--file`` or ``--split val``
    (as the run's evaluation reads it), and the text the page shows."""

    from ..interpret.ablation import text_batch

    given = [f for f in ("text", "file", "split") if getattr(args, f) is not None]
    if len(given) != 1:
        raise UsageError("give one of --text TEXT, --file FILE or --split val (the text "
                         "whose loss each ablation changes)")
    cfg = run.model.config
    if args.split:
        batch = split_batch(run, args.run_dir, 1 if args.batches is None else args.batches)
        return batch, run.tokenizer.decode(batch.inputs[0][0].tolist())  # the page's text
    flag = "--text" if args.text is not None else "--file"
    if cfg.family == "encoder" and cfg.head == "mlm":
        raise UsageError(f"interpret ablate {flag} of a masked LM: its loss needs masked "
                         "positions; use --split val (masked as its evaluation masks them) or "
                         "attnlab.interpret.ablate from Python")
    text = args.text if args.text is not None else _read(args.file)
    ids, src = _inputs(run, args, text, flag, FILE_USE if args.file else TEXT_USE)
    return text_batch(run.model, ids, src, name=flag), text


def _read(path: str) -> str:
    """A UTF-8 text file (``--file``, an input), which must hold text."""
    from pathlib import Path

    file = Path(path)
    if not file.exists():
        raise UsageError(f"--file {path} does not exist: give {FILE_USE}")
    if file.is_dir():
        raise UsageError(f"--file {path} is a folder: give {FILE_USE}")
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"--file {path} is not UTF-8 text: give {FILE_USE}") from None
    except OSError as e:
        raise UsageError(f"--file {path} cannot be read ({e.strerror}): give {FILE_USE}, "
                         "one this user can read") from None
    if not text.strip():
        raise UsageError(f"--file {path} is empty: give {FILE_USE}")
    return text


def split_batch(run, run_dir: str, batches: int):
    """``batches`` batches of the run's val split as its task evaluates them (a language
    model's sampled windows, a classifier's labelled sentences, a masked LM's masks), as one
    batch."""
    from ..run_config import RunConfig
    from ..runs import RunDir
    from ..tasks import build_task
    from ..train.evaluate import missing_split

    if batches < 1:
        raise UsageError(f"--batches {batches} must be >= 1")
    rd = RunDir(run_dir)
    rc = RunConfig.of_run(rd)
    why = missing_split(rd, rc, "val")
    if why:
        raise UsageError(f"--split val: {why}; give --text or --file")
    return build_task(rc, run.tokenizer).ablation_batch("val", batches)


def ablate(run, args: argparse.Namespace) -> tuple[Any, str, list, str]:
    """``interpret ablate``: the loss change when each head or feed-forward block goes."""
    from ..interpret.ablation import ablate as run_ablate
    from ..viz.explorer import HeadGrid

    batch, text = ablate_batch(run, args)
    result = run_ablate(run.model, batch, kind=args.kind, layers=args.layer, heads=args.head)
    views = _views(run)
    grids, lines = [], [f"{args.kind} ablation of {args.run_dir}: loss "
                        f"{result.base_loss:.4f}; each number is the loss with that part "
                        "ablated minus it (> 0: it mattered)"]
    for stack, grid in result.grids.items():
        grids.append(HeadGrid(f"{args.kind} ablation: {stack} heads", grid,
                              view=views[stack],
                              note="loss change when the head is ablated (> 0: it helped)"))
        lines.append(grid_table(f"{stack} heads", grid))
        ffn = result.ffns.get(stack)
        if ffn is not None and ffn.numel():
            lines.append(grid_table(f"{stack} feed-forward", ffn[:, None], cols=["ffn"]))
    return result, "\n".join(lines), grids, text


def patch(run, args: argparse.Namespace) -> tuple[Any, str, list, str]:
    """``interpret patch``: which layer/position and which head carries the answer."""
    from ..interpret.patching import patch as run_patch
    from ..viz.explorer import HeadGrid, PositionGrid

    classes = run.predicts_classes  # (then the answer is a class)
    if classes and args.position is not None:
        raise UsageError("a classifier's logits are the whole text's, at no position: drop "
                         "--position")
    answer, wrong = (run.class_id(text, flag) if classes else one_token(run, text, flag)
                     for text, flag in ((args.answer, "--answer"), (args.wrong, "--wrong")))
    _two_outputs(answer, wrong, "--answer", "--wrong",
                 run.label_names[answer] if classes else None)
    clean, corrupted, shared = patch_inputs(run, args)
    position = -1 if args.position is None else args.position
    n = shared["tgt"].size(1) if shared else clean.size(1)
    if not -n <= position < n:
        read = "decoder input (<bos> and --target)" if shared else "--clean text"
        raise UsageError(f"--position {position} is out of range: the {read} is {n} tokens "
                         f"({-n}..{n - 1})")
    result = run_patch(run.model, clean, corrupted, answer=answer, wrong=wrong,
                       position=position, layers=args.layer, heads=args.head, **shared)
    tokens = _strings(run, clean)
    metric = f"logit({args.answer!r}) - logit({args.wrong!r})"
    where = "of the classifier" if classes else \
        "at the last position" if position == -1 else f"at position {position}"
    note = f"{metric} of the corrupted run with this activation from the clean run " \
           f"(clean {result.clean:.3f}, corrupted {result.corrupted:.3f})"
    grids = [] if args.head is not None else [  # (no head axis: not patched with --head)
        PositionGrid("patching: residual stream (layer x position)", result.resid, tokens,
                     note=note)]
    grids += [HeadGrid(f"patching: {stack} heads", grid, note=note)
              for stack, grid in result.grids.items()]
    lines = [f"activation patching of {args.run_dir}: {metric} {where} is "
             f"{result.clean:.4f} clean, {result.corrupted:.4f} corrupted; each number: the "
             "corrupted run with one activation from the clean run",
             grid_table(("encoder " if shared else "") + "residual stream (blocks.{l}.resid_pre)"
                        " by position", result.resid, cols=[_short(t) for t in tokens])]
    lines += [grid_table(f"{stack} heads (attn.z, every position)", grid)
              for stack, grid in result.grids.items()]
    return result, "\n".join(lines), grids, args.clean


def patch_inputs(run, args: argparse.Namespace) -> tuple[Any, Any, dict[str, Any]]:
    """(clean, corrupted, the shared input) of ``interpret patch``: two texts of one token
    length; an encoder-decoder's are sources, and ``--target`` (the translation so far, whose
    next token is the answer) is the decoder input both runs share."""
    if args.target is None and run.model.config.family == "encoder_decoder":
        raise UsageError("interpret patch of a translation run needs --target: the "
                         "translation so far, whose next token is --answer or --wrong")
    (clean, src), (corrupted, src_corrupted) = (
        _inputs(run, args, args.clean, "--clean", "the text the model gets right (its next "
                "token --answer)"),
        _inputs(run, args, args.corrupted, "--corrupted", "the --clean text changed, of as "
                "many tokens"))
    shared = {}
    if src is not None:  # the sources differ; the target so far (no <eos>) is shared
        clean, corrupted, shared = src, src_corrupted, {"tgt": clean[:, :-1]}
    if clean.shape != corrupted.shape:
        raise UsageError(f"--clean is {clean.size(1)} tokens and --corrupted is "
                         f"{corrupted.size(1)}: give two texts of the same token length")
    return clean, corrupted, shared


def rollout(run, args: argparse.Namespace) -> tuple[Any, str, list, str]:
    """``interpret rollout``: attention through all layers, per stack, as a T x S table."""
    from ..interpret.rollout import attention_rollout
    from ..viz.explorer import PositionGrid

    ids, src = _inputs(run, args, args.text, "--text", "the text whose attention is "
                       "rolled out")
    inputs = (ids,) if src is None else (src, ids[:, :-1])
    result = attention_rollout(run.model, *inputs)
    source = _strings(run, ids if src is None else src)
    target = _strings(run, ids if src is None else ids[:, :-1])
    grids, lines = [], [f"attention rollout of {args.run_dir}: how much each query (row) "
                        "draws on each token (column) through every layer"]
    for stack, table in result.items():
        table = table[0] if table.dim() == 3 else table  # (T, S)
        keys = target if stack == "decoder" else source
        queries = source if stack == "encoder" else target
        grids.append(PositionGrid(f"rollout: {stack} (rows: queries)", table, keys,
                                  layer_ids=[_short(q) for q in queries],
                                  note="rows: the query tokens; columns: the tokens drawn on"))
        lines.append(grid_table(stack, table, cols=[_short(k) for k in keys]).replace(
            "layer ", "query "))
    return result, "\n".join(lines), grids, args.text


def heads(run, args: argparse.Namespace) -> tuple[Any, str, list, str | None]:
    """``interpret heads``: each head's previous-token, induction, duplicate-token and
    first-token scores."""
    from ..interpret.heads import head_scores
    from ..viz.explorer import HeadGrid

    result = head_scores(run.model)
    result.scores = {stack: {name: chosen(v, args.layer, args.head) for name, v in by.items()}
                     for stack, by in result.scores.items()}
    grids, lines = [], [f"head scores of {args.run_dir} on repeated random tokens (0..1: the "
                        "mean attention on the position the job looks at)"]
    for stack, scores in result.scores.items():
        for name, value in scores.items():
            grids.append(HeadGrid(f"head scores: {stack} {name}", value, limit=1.0,
                                  note=f"{name.replace('_', '-')} score of each {stack} head"))
            lines.append(grid_table(f"{stack} {name.replace('_', '-')}", value))
    return result, "\n".join(lines), grids, args.text


ANALYSIS = {"lens": lens, "attribute": attribute, "ablate": ablate, "patch": patch,
            "rollout": rollout, "heads": heads}

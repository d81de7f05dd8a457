"""``attnlab train | eval | recipes | data``: train a recipe, evaluate a run dir, list the
recipes, fetch or prepare a data set.

Results go to stdout; bad input (config, data, run dir, checkpoint) is one line on stderr with
exit code 2 (see :mod:`attnlab.cli.common`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import shlex
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import RunError, UsageError
from ..recipes import find_recipe

if TYPE_CHECKING:
    from ..run_config import RunConfig
    from ..runs import RunDir

log = logging.getLogger(__name__)
RECIPES_WIDTH = 100  # `attnlab recipes` wraps its lines at this many characters


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``train``, ``eval``, ``average``, ``recipes`` and ``data`` to the ``attnlab`` parser."""
    _register_train(subparsers)
    _register_eval(subparsers)
    _register_average(subparsers)
    _register_recipes(subparsers)
    _register_data(subparsers)
    _register_launch(subparsers)


def _register_train(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "train", help="train a model from a TOML recipe (no recipe: the demo)",
        description="Train from a TOML recipe (a .toml file, or a recipe name such as "
        "shakespeare_char: ./configs/NAME.toml if there is one, else the shipped recipe; "
        "`attnlab recipes` lists them). Without one, trains a small character-level LM on "
        "Python's own documentation for a few minutes and prints samples. Under `torchrun "
        "--nproc_per_node=K` the same command trains with DDP. Ctrl-C stops it; the message "
        "says which step the last checkpoint holds and how to resume.")
    p.add_argument("config", nargs="?", default=None,
                   help="a .toml recipe file or a recipe name (see `attnlab recipes`)")
    p.add_argument("--set", dest="overrides", action="append", default=[],
                   metavar="KEY=VALUE", help="override a config value, e.g. train.lr=3e-4 "
                   "(repeatable; sections: model, data, train)")
    p.add_argument("--seed", type=int, default=None,
                   help="the run's seed (sets train.seed; wins over --set train.seed)")
    p.add_argument("--print-config", action="store_true",
                   help="print the config the run would start from (the recipe with --set, "
                   "--seed and --init-from applied; the keys of its model family and task, "
                   "with the recipe's comments; sizes taken from the data are filled in "
                   "by training) as TOML, and exit without training or writing anything")
    p.add_argument("--json", action="store_true", help="with --print-config: print JSON")
    p.add_argument("--out", default=None, help="run dir (default: runs/<recipe name>)")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in --out from its last checkpoint")
    p.add_argument("--init-from", default=None, metavar="RUN_DIR",
                   help="fine-tune: start from the weights and tokenizer of this run dir, a "
                   "Hugging Face model dir, or all-MiniLM-L6-v2 (sets train.init_from)")
    p.set_defaults(func=cmd_train)


def _register_eval(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "eval", help="evaluate a trained run dir",
        description="Loss and the task metric of a run: perplexity (LM, every window of the "
        "split), BLEU with greedy decoding or beam search (translation), exact-match accuracy "
        "likewise (copy, reverse, sort), accuracy and F1 (classification), computed as "
        "training's evaluation computes them.")
    p.add_argument("run_dir", help="a training run dir (the --out of `attnlab train`)")
    p.add_argument("--split", default="val", choices=("val", "test"),
                   help="the validation split (default), or the test split: the files of "
                   "data.test_path (data.test_src_path and data.test_tgt_path), or a synthetic "
                   "task's own test examples")
    p.add_argument("--data", nargs="+", default=None, metavar="PATH",
                   help="evaluate on these files instead: a text file (LM), a TSV "
                   "(classification), or SRC TGT (translation)")
    p.add_argument("--checkpoint", default="best",
                   help="'best' (default; falls back to 'last'), 'last', or a .safetensors file")
    p.add_argument("--device", default="auto", help="auto (default), cpu, cuda, ...")
    p.add_argument("--beam", type=int, default=1,
                   help="decode with beam search of this width (encoder-decoder runs: "
                   "translation's BLEU, the synthetic tasks' accuracy; default 1 = greedy)")
    p.add_argument("--length-penalty", type=float, default=None, metavar="A",
                   help="GNMT length-penalty alpha for --beam > 1 (default 0.6)")
    p.add_argument("--stride", type=int, default=None, metavar="N",
                   help="language models: score the split in windows of the block that start N "
                   "tokens apart, each target once, so that each has at least block - N tokens "
                   "before it (sliding-window perplexity; default: the block, non-overlapping "
                   "windows, as training evaluates)")
    p.add_argument("--json", action="store_true", help="print the metrics as one JSON object")
    p.add_argument("--progress", action="store_true",
                   help="show a progress bar of the batches evaluated on stderr (default: "
                   "when stderr is a terminal)")
    p.set_defaults(func=cmd_eval)


def _register_average(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "average", help="average a run's weights (its last N checkpoints, or its moving "
        "average) into a new run dir",
        description="Checkpoint averaging (fairseq's average_checkpoints.py): the mean of the "
        "weights of RUN's last N evaluations, which a run keeps when trained with --set "
        "train.keep_checkpoints=N; or, with --ema, the exponential moving average of its "
        "weights over every step, which a run keeps when trained with --set "
        "train.ema_decay=D. The result is a run dir like any other (evaluate, sample, "
        "translate or fine-tune it); it has no optimizer state, so it is not resumed.")
    p.add_argument("run_dir", help="a training run dir trained with train.keep_checkpoints "
                   "or train.ema_decay")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--last", type=int, metavar="N",
                       help="how many of the latest kept checkpoints to average")
    which.add_argument("--ema", action="store_true",
                       help="the moving average of the weights as of the last checkpoint")
    p.add_argument("--out", required=True, help="the new run dir (must not exist or be empty)")
    p.set_defaults(func=cmd_average)


def _register_recipes(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "recipes", help="list the training recipes, or print one",
        description="The recipes `attnlab train NAME` takes: the name and what it trains (the "
        "first sentence of its comments, wrapped). Shipped with attnlab; a ./configs/NAME.toml "
        "of the working directory comes first and is marked so. `attnlab recipes NAME` prints "
        "that recipe as it is, comments and all; `attnlab train NAME --print-config` the "
        "config a run of it would start from.")
    p.add_argument("name", nargs="?", default=None,
                   help="a recipe name (or .toml file) to print as it is")
    p.set_defaults(func=cmd_recipes)


def _register_data(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("data", help="fetch a public data set, or prepare a corpus",
                              description="attnlab data fetch NAME (attnlab data list: the "
                              "names); attnlab data prepare SRC... --out DIR")
    sub = p.add_subparsers(dest="action", metavar="ACTION")
    f = sub.add_parser("fetch", help="download (or copy with --from) and verify a data set",
                       description="Download a public data set into the data cache (or copy "
                       "it from a local folder with --from) and check its files.")
    f.add_argument("name", help="a data set that `attnlab data list` names")
    f.add_argument("--from", dest="source_dir", default=None, metavar="DIR",
                   help="copy from this local folder instead of downloading")
    f.add_argument("--cache", dest="cache_dir", default=None, metavar="DIR",
                   help="cache folder (default $ATTNLAB_DATA or ~/.cache/attnlab/data)")
    f.set_defaults(func=cmd_data_fetch)
    ls = sub.add_parser("list", help="the data sets that `fetch` knows",
                        description="The data sets that `attnlab data fetch` knows: name, "
                        "files, what they hold.")
    ls.set_defaults(func=cmd_data_list)
    _register_prepare(sub)
    p.set_defaults(func=lambda args: _usage(p))


def _register_prepare(sub: argparse._SubParsersAction) -> None:
    pr = sub.add_parser(
        "prepare", help="tokenize a corpus once into token shards that training reads",
        description="Tokenize files (UTF-8 text of any name, .jsonl, .json, .parquet, .csv, "
        ".tsv; .gz/.zst too), folders (every text file below them, binary and hidden ones "
        "skipped) or quoted glob patterns on every core into a prepared DIR of uint16/uint32 "
        "token shards; train on it with `attnlab train RECIPE --set data.path=DIR`. "
        "Interrupted, the same command continues where it stopped.")
    pr.add_argument("sources", nargs="+", metavar="SRC",
                    help="files, folders or glob patterns (quoted: 'mytext/**/*.py')")
    pr.add_argument("--include", action="append", default=[], metavar="GLOB",
                    help="of the files of folders and patterns, read only those whose name or "
                    "path below the folder matches (repeatable; e.g. '*.py')")
    pr.add_argument("--exclude", action="append", default=[], metavar="GLOB",
                    help="of the files of folders and patterns, leave out those whose name or "
                    "path, or a folder's above them, matches (repeatable; e.g. 'tests')")
    pr.add_argument("--target", nargs="+", default=None, metavar="TGT",
                    help="translation: line-aligned target files, one per SRC (line i of a "
                    "TGT translates line i of its SRC); prepares sentence pairs")
    pr.add_argument("--src-add-special", action="store_true",
                    help="translation: wrap source sentences in bos ... eos "
                    "(data.src_add_special)")
    pr.add_argument("--out", required=True, metavar="DIR", help="the prepared DIR to write")
    pr.add_argument("--tokenizer", default="char", metavar="char|bpe|gpt2|RUN",
                    help="char (default), bpe (trained on a sample), gpt2 (GPT-2's byte-level "
                    "BPE), or a run dir whose tokenizer to use")
    pr.add_argument("--vocab-size", type=int, default=None,
                    help="bpe: vocabulary size (default 8000)")
    pr.add_argument("--pre-tokenizer", default=None, choices=("byte_level", "whitespace"),
                    help="bpe: how text is split before merging (default byte_level)")
    pr.add_argument("--val-fraction", type=float, default=0.1,
                    help="share of the documents held out as val (a .txt file: its tail); "
                    "default 0.1")
    pr.add_argument("--text-field", default="text", metavar="NAME",
                    help="the JSON field or table column that holds the text (default text)")
    pr.add_argument("--seed", type=int, default=1337, help="seed of the train/val split")
    pr.add_argument("--workers", type=int, default=0,
                    help="tokenizing processes (default 0: one per core)")
    pr.add_argument("--errors", default="strict", choices=("strict", "replace"),
                    help="an undecodable byte: stop (strict, default) or read U+FFFD (replace)")
    pr.set_defaults(func=cmd_data_prepare)


def _usage(p: argparse.ArgumentParser) -> int:
    """``attnlab data`` without an action."""
    raise UsageError("choose an action: fetch, list or prepare (see `attnlab data --help`)")


LAUNCH_HELP = (
    "Run an attnlab command under torchrun: on one machine (--nproc-per-node K) or on "
    "several (the same `attnlab launch` on each, with --nnodes N --rdzv-backend c10d "
    "--rdzv-endpoint HOST:PORT --rdzv-id ID). Everything before the command is torchrun's "
    "(`torchrun --help`), plus --join-timeout S: how long to wait for every machine (default "
    "600 s); a rendezvous that does not complete, or an endpoint that cannot be reached, is "
    "one line and exit code 2. Example: attnlab launch --nproc-per-node 2 train RECIPE")


def _register_launch(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("launch", help="run a command under torchrun, on one machine "
                              "or several (DDP or FSDP)", description=LAUNCH_HELP)
    p.add_argument("argv", nargs=argparse.REMAINDER, metavar="[TORCHRUN OPTIONS] COMMAND ...",
                   help="torchrun's options, then an attnlab command and its arguments")
    p.set_defaults(func=cmd_launch)


def cmd_launch(args: argparse.Namespace) -> int:
    """``attnlab launch [TORCHRUN OPTIONS] COMMAND ...`` (main() passes the words unparsed:
    they are torchrun's options)."""
    from attnlab.train.distributed import launch

    words = list(args.argv)
    commands = [c for c in args.commands if c != "launch"]
    at = next((k for k, w in enumerate(words) if w in commands), None)
    if at is None:
        raise UsageError("give an attnlab command after torchrun's options, e.g. `attnlab "
                         f"launch --nproc-per-node 2 train RECIPE` (commands: "
                         f"{', '.join(commands)})")
    if "launch" in words[:at]:
        raise UsageError("launch takes torchrun's options, then the command to run, once: "
                         "`attnlab launch --nproc-per-node 2 train RECIPE` (not launch again)")
    torchrun_args, timeout = [], None
    k = 0
    while k < at:
        word = words[k]
        if word == "--join-timeout" or word.startswith("--join-timeout="):
            value = word.split("=", 1)[1] if "=" in word else \
                (words[k + 1] if k + 1 < at else "")
            k += 1 if "=" in word else 2
            try:
                timeout = float(value)
            except ValueError:
                timeout = -1.0
            if not timeout > 0:
                raise UsageError(f"--join-timeout {value!r}: give the seconds to wait for "
                                 "every machine, a number > 0")
            continue
        torchrun_args.append(word)
        k += 1
    code = _check_before_launch(args.parser, words[at:])
    return launch(torchrun_args, words[at:], timeout) if code is None else code


def _check_before_launch(parser: argparse.ArgumentParser, command: list[str]) -> int | None:
    """``command``'s arguments (``parser``: attnlab's), and a ``train``'s config, checked in
    this process before torchrun starts any, so that bad input is one line, not one per
    process after torchrun's banner: None to launch it, else the exit code (``--help``
    printed: 0; an argument error printed: 2)."""
    from .common import Parser

    try:
        args, extra = parser.parse_known_args(command)
        if extra:  # as main() says them
            words = [w for w in (args.command, getattr(args, "action", None)) if w]
            Parser(prog=" ".join(["attnlab", *words])).error(
                f"unrecognized arguments: {' '.join(extra)}")
    except SystemExit as e:  # (argparse printed the help, or the one line)
        return e.code if isinstance(e.code, int) else 2
    if args.command == "train":
        from ..train.runner import check_checkpoints

        _, run, _ = _train_plan(args)
        if not args.print_config:
            check_checkpoints(run, args.resume)
    return None


def cmd_recipes(args: argparse.Namespace) -> int:
    """List the recipes: the name, what it trains (wrapped), and where a local one is; with
    a name, print that recipe's text."""
    import textwrap

    from ..recipes import describe, local, recipe_text, shipped

    if args.name:
        print(recipe_text(find_recipe(args.name)), end="")
        return 0
    mine, ours = local(), shipped()
    names = sorted({*mine, *ours})
    width = max(map(len, names)) + 2
    said = {name: describe(mine.get(name) or ours[name]) for name in names}  # (errors first)
    for name in names:
        where = f"  [{mine[name]}]" if name in mine else ""
        text = f"{said[name]}{where}".strip()
        lines = textwrap.wrap(text, RECIPES_WIDTH - width, break_on_hyphens=False) or [""]
        print(f"{name:<{width}}{lines[0]}".rstrip())
        for line in lines[1:]:
            print(" " * width + line)
    return 0


def _default_out(stem: str, resume: bool) -> Path:
    """The run dir when ``--out`` is not given: the first of ``runs/STEM``, ``runs/STEM-2``, ...
    without a checkpoint (resumed: the highest-numbered one with a checkpoint)."""
    from ..runs import RunDir

    base = Path("runs") / stem
    if resume:  # the newest: the highest-numbered runs/STEM[-N] with a checkpoint
        numbered = {1: base, **{int(p.name[len(stem) + 1:]): p for p in base.parent.glob(
            f"{stem}-*") if p.name[len(stem) + 1:].isdigit()}}
        held = [n for n, p in numbered.items() if RunDir(p).has_checkpoint()]
        return numbered[max(held)] if held else base
    out, i = base, 1
    while RunDir(out).has_checkpoint():
        i += 1
        out = base.parent / f"{stem}-{i}"
    return out


def cmd_train(args: argparse.Namespace) -> int:
    """Train a recipe (or the demo) into its run dir and print the results; with
    ``--print-config``, print the config it would start from instead."""
    from ..recipes import shipped
    from ..tasks import config_text
    from ..train import train_run
    from ..train.distributed import env_info, lost_process

    recipe, run, rc = _train_plan(args)
    out = run.path
    if args.print_config:  # no recipe: the demo's comments (resumed: the run's config has none)
        source = recipe or (None if args.resume else shipped()["demo"])
        print(json.dumps(rc.to_dict(), indent=2, ensure_ascii=False) if args.json
              else config_text(rc, source.read_text(encoding="utf-8") if source else None))
        return 0
    if args.json:
        raise UsageError("--json is for --print-config (training prints its results as lines)")
    # say where, before a long run that may be stopped (a bad config first; a resume of
    # nothing is refused next)
    if not args.out and (run.has_checkpoint() or not args.resume):
        log.info("run dir: %s%s", out, " (resumed: the newest with a checkpoint)"
                 if args.resume else "")
    try:
        outcome = train_run(rc, out, resume=args.resume)
    except KeyboardInterrupt:
        # under torchrun the first process alone says it (the others exit quietly, 130)
        raise UserInterrupt(interrupted_line(run) if env_info().is_main else None) from None
    except RuntimeError as e:  # under torchrun: another process ended in a collective
        info, said = env_info(), lost_process(e)
        if not info.enabled or said is None:
            raise
        kept = kept_line(run) or ("no checkpoint was written: run the same command again to "
                                  "start over")
        raise RunError(f"process {info.rank} of {info.world_size} lost another process of the "
                       f"run ({said}): that process's output says why it ended; {kept}") from None
    if outcome.is_main:  # under torchrun, the first process alone prints
        _print_results(outcome, out)
        for i, text in enumerate(outcome.samples()):
            print(f"\n--- sample {i + 1} ---\n{text.strip()}")
    return 0


def _train_plan(args: argparse.Namespace) -> tuple[Path | None, RunDir, RunConfig]:
    """What ``train`` would do, checked before any file is written: its recipe (None: the
    demo), its run dir and its config."""
    from ..runs import RunDir

    _check_train_args(args)
    recipe = find_recipe(args.config) if args.config else None
    stem = recipe.stem if recipe else "demo"
    run = RunDir(Path(args.out) if args.out else _default_out(stem, args.resume))
    return recipe, run, _train_config(args, recipe, run)


def _check_train_args(args: argparse.Namespace) -> None:
    """Refuse ``train`` arguments that do not fit together, before any config is read."""
    if args.resume and (args.init_from or any(
            o.partition("=")[0].strip() == "train.init_from" for o in args.overrides)):
        raise UsageError("--init-from (train.init_from) starts a new run from other weights, but "
                         "--resume continues the run in --out from its own checkpoint: give one "
                         "of them (a fine-tuned run resumes without --init-from)")


def _train_config(args: argparse.Namespace, recipe: Path | None, run) -> RunConfig:
    """The run config: the recipe (resumed without one: the run's own config) with ``--set``,
    then ``--init-from`` and ``--seed`` applied, in that order."""
    from ..run_config import RunConfig, toml_value
    from ..train import load_config

    # --init-from wins over a train.init_from of the recipe or of --set (given last)
    given = toml_value(args.init_from) if args.init_from else None
    overrides = args.overrides + ([f"train.init_from={given}"] if given else []) + (
        [f"train.seed={args.seed}"] if args.seed is not None else [])
    if recipe is None and args.resume and run.config_file.is_file():
        RunConfig.of_run(run)  # (a value its config.json should not hold: named with the file)
        return load_config(None, overrides, base=run.read_config())  # the run's own
    return load_config(recipe, overrides)


def _print_results(outcome, out: Path) -> None:
    """The run dir, the last step's metrics and the best checkpoint, one line each."""
    from ..tasks import task_class

    r = outcome.result
    metrics = "  ".join(f"{k} {v:.4f}" for k, v in r.metrics.items())
    print(f"run dir: {out}")
    early = ", stopped early" if r.stopped_early else ""
    # An LM evaluates on sampled val batches while training and on final_eval_batches at the
    # end: the two numbers of one step then differ, so each line says what it measured.
    t = outcome.config.train
    resampled = task_class(outcome.config).sampled_eval \
        and t.final_eval_batches != t.eval_batches
    final = f"; final evaluation on {_scope(t.final_eval_batches)}" if resampled else ""
    print(f"step {r.step}  {metrics}  ({r.wall_s:.1f} s{early}{final})")
    if r.best:
        during = f" (evaluation on {_scope(t.eval_batches)})" if resampled else ""
        print(f"best {r.best['metric']} {r.best['value']:.4f} at step {r.best['step']}{during} "
              f"-> {out / 'best'}")


class UserInterrupt(KeyboardInterrupt):
    """Ctrl-C during training, with the line that says what was kept and how to resume (None:
    another process says it)."""


def kept_line(run) -> str | None:
    """The step a stopped training's last checkpoint holds and the exact command that
    continues from there; None when it has none."""
    meta = run.checkpoint_meta("last") if run.has_checkpoint("last") else {}
    if "step" not in meta:
        return None
    return (f"the last checkpoint ({run.path / 'last'}) holds step {meta['step']}; "
            f"resume with: attnlab train --out {shlex.quote(str(run.path))} --resume")


def interrupted_line(run) -> str:
    """What an interrupted training leaves (:func:`kept_line`, or that nothing was kept)."""
    kept = kept_line(run)
    if kept is None:
        return (f"interrupted before the first checkpoint of {run.path}: nothing to resume; "
                "run the same command again to start over")
    return f"interrupted; {kept}"


def _scope(batches: int) -> str:
    """What ``batches`` val batches mean, in words."""
    return "the whole val split" if batches == 0 else f"{batches} sampled val batches"


@contextlib.contextmanager
def eval_progress(show: bool, what: str) -> Iterator[Callable[[int], object] | None]:
    """A progress bar on stderr of the batches evaluated, when ``show`` (an evaluation of a
    whole split can take long); yields what to tell each batch done (the bar's ``update``),
    or None."""
    if not show:
        yield None
        return
    from tqdm.auto import tqdm

    bar = tqdm(desc=what, unit="batch", file=sys.stderr, dynamic_ncols=True, leave=False)
    try:
        yield bar.update
    finally:
        bar.close()


def cmd_eval(args: argparse.Namespace) -> int:
    from ..train import evaluate_run

    show = args.progress or sys.stderr.isatty()
    with eval_progress(show, f"eval {args.split if not args.data else 'data'}") as progress:
        result = evaluate_run(args.run_dir, args.split, args.data, args.checkpoint,
                              args.device, beam=args.beam, length_penalty=args.length_penalty,
                              stride=args.stride, progress=progress)
    if args.json:
        print(json.dumps(result))
        return 0
    for key, value in result.items():
        print(f"{key}: {value:.4f}" if isinstance(value, float) else f"{key}: {value}")
    return 0


def cmd_average(args: argparse.Namespace) -> int:
    from ..train import average_run, ema_run

    if args.ema:
        result = ema_run(args.run_dir, args.out)
        print(f"the moving average (decay {result['ema_decay']}) of {result['from']} at step "
              f"{result['step']} into {result['out']}")
        return 0
    result = average_run(args.run_dir, args.last, args.out)
    steps = ", ".join(str(s) for s in result["averaged_steps"])
    print(f"averaged steps {steps} of {result['from']} into {result['out']}")
    return 0


def cmd_data_fetch(args: argparse.Namespace) -> int:
    """Download (or copy with ``--from``) a public data set into the cache, checked; print
    where."""
    from ..data import fetch
    from ..tasks import download

    path = fetch(download(args.name), args.cache_dir, args.source_dir)
    print(path)
    return 0


def cmd_data_prepare(args: argparse.Namespace) -> int:
    """Tokenize text files once into a prepared dir of token shards (``--target``: sentence
    pairs); print what it holds."""
    from ..data.prepare import TOKENIZER_KINDS, prepare
    from ..data.shards import read_manifest
    from ..runs import RunDir

    tokenizer = args.tokenizer
    if tokenizer not in TOKENIZER_KINDS:
        if not Path(tokenizer).is_dir():
            raise UsageError(f"--tokenizer {tokenizer!r} is not allowed: one of "
                             f"{', '.join(TOKENIZER_KINDS)}, or a run dir")
        tokenizer = RunDir(Path(tokenizer)).load_tokenizer()
        if tokenizer is None:
            raise RunError(f"--tokenizer {args.tokenizer}: that run dir has no tokenizer")
    for flag, value in (("--vocab-size", args.vocab_size),
                        ("--pre-tokenizer", args.pre_tokenizer)):
        if value is not None and tokenizer != "bpe":  # it would be ignored
            raise UsageError(f"{flag} is for --tokenizer bpe, which trains a tokenizer; "
                             f"--tokenizer {args.tokenizer} brings its own vocabulary")
    common = dict(vocab_size=8000 if args.vocab_size is None else args.vocab_size,
                  pre_tokenizer=args.pre_tokenizer or "byte_level",
                  val_fraction=args.val_fraction, seed=args.seed, workers=args.workers,
                  errors=args.errors, progress=True)
    if args.target is not None:
        return _prepare_pairs(args, tokenizer, common)
    if args.src_add_special:
        raise UsageError("--src-add-special is for sentence pairs: give --target files too")
    out = prepare(args.sources, args.out, tokenizer, text_field=args.text_field,
                  include=args.include, exclude=args.exclude, **common)
    m = read_manifest(out)
    splits = ", ".join(f"{k} {v['tokens']:,} tokens ({v['documents']:,} document"
                       f"{'' if v['documents'] == 1 else 's'})" for k, v in m["splits"].items())
    print(f"{out}: {m['tokenizer']['kind']} tokenizer, {m['tokenizer']['vocab_size']:,} ids "
          f"({m['dtype']}); {splits}")
    return 0


def _prepare_pairs(args: argparse.Namespace, tokenizer, common: dict) -> int:
    """``data prepare SRC... --target TGT...``: line-aligned translation pairs."""
    from ..data.pairs import prepare_pairs, read_pairs_manifest

    if args.include or args.exclude:
        raise UsageError("--include and --exclude choose among the files of folders; sentence "
                         "pairs (--target) are named file by file: give SRC and TGT files only")
    if len(args.target) != len(args.sources):
        raise UsageError(f"--target names {len(args.target)} file(s) for {len(args.sources)} "
                         "SRC file(s); allowed: one target file per source file, in order")
    out = prepare_pairs(args.sources, args.target, args.out, tokenizer,
                        src_add_special=args.src_add_special, **common)
    m = read_pairs_manifest(out)
    splits = ", ".join(f"{k} {v['pairs']:,} pairs ({v['src_tokens']:,} + {v['tgt_tokens']:,} "
                       "tokens)" for k, v in m["splits"].items())
    print(f"{out}: {m['tokenizer']['kind']} tokenizer, {m['tokenizer']['vocab_size']:,} ids "
          f"({m['dtype']}); {splits}")
    return 0


def cmd_data_list(args: argparse.Namespace) -> int:
    """List the data sets ``data fetch`` knows: name, files, what they hold."""
    from ..tasks import downloads

    for name, info in downloads().items():
        print(f"{name}\t{', '.join(f.name for f in info.files)}\t{info.description}")
    return 0

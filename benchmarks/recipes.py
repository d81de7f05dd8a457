"""A shipped recipe trained from local data, timed, then scored: what its recipe card says.

    .venv/bin/python benchmarks/recipes.py multi30k_de_en --ema 0.998 --beam 4
    .venv/bin/python benchmarks/recipes.py shakespeare_char

Prints the machine (lscpu), date, commit and command, then one table: the wall time of
`attnlab train RECIPE` (start-up and the final evaluation included), and the recipe's
figure as `attnlab eval` computes it (val loss over the whole split for a language model,
BLEU with greedy decoding and with `--beam` for translation, accuracy for classification);
with `--average N`, the same scores of the mean of the last N evaluation checkpoints
(`attnlab average`); with `--ema D`, trained with `train.ema_decay = D`, the same scores of
its moving average (`attnlab average --ema`). Then the wall time of each command, and of the
recipe end to end: training, then (with `--average` or `--ema`) averaging, then the last
evaluation of the weights it ends on (with `--beam`, the beam's; with `--stride N`, a language
model's loss in windows every N tokens, `attnlab eval --stride`). Data: attnlab's data cache
(`$ATTNLAB_DATA`, else ~/.cache/attnlab/data), which `attnlab data fetch NAME` fills, or
`--data-dir DATA`, a folder of local copies of the data sets (DATA/tinyshakespeare/input.txt,
DATA/multi30k/{train,val}.{de,en}, DATA/sst2/train.tsv); a missing file stops the script
before training, naming the `attnlab data fetch` that gets it.
`--tiny` trains a few steps of a small model (for the tests).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from data_speed import git_head, machine  # noqa: E402  (the benchmarks' one machine line)

TINY = ["model.d_model=32", "model.n_heads=2", "model.n_layers=1", "model.d_ff=64",
        "train.max_steps=4", "train.eval_every=2", "train.warmup_steps=1",
        "train.compile=false", "train.progress=false", "train.tensorboard=false"]


def attnlab(*args: str) -> str:
    """Run ``attnlab ARGS`` in a fresh process; its stdout (stderr shown when it fails)."""
    res = subprocess.run([sys.executable, "-m", "attnlab", *args], capture_output=True,
                         text=True, cwd=ROOT, check=False)
    if res.returncode != 0:
        raise SystemExit(f"attnlab {' '.join(args)} failed:\n{res.stderr.strip()[-3000:]}")
    return res.stdout


def _data_set(recipe: str):
    """The downloadable data set ``recipe`` trains on, or None (generated, embedded, none)."""
    from attnlab.recipes import find_recipe
    from attnlab.run_config import load_config
    from attnlab.tasks import data_sets

    name = load_config(str(find_recipe(recipe))).data.name
    _, ds = data_sets().get(name, (None, None))
    return None if ds is None or ds.download is None else ds


def data_folder(recipe: str, data_dir: Path | None) -> Path | None:
    """Where the files of ``recipe``'s data set are: under ``data_dir`` (a folder of local
    copies, the data set's folder there as ``attnlab data fetch --from`` reads it:
    ``tinyshakespeare/``, ``multi30k/``, ``sst2/``; or one named as in the cache), or, with no
    ``data_dir``, in attnlab's data cache (``attnlab data fetch NAME`` fills it). None: the
    recipe reads no files."""
    from attnlab.data import default_cache_dir

    ds = _data_set(recipe)
    if ds is None:
        return None
    if data_dir is None:
        return default_cache_dir() / ds.download.name
    local, cached = data_dir / ds.download.local_dir, data_dir / ds.download.name
    return cached if cached.is_dir() and not local.is_dir() else local


def data_overrides(recipe: str, data_dir: Path | None = None) -> list[str]:
    """The ``--set`` overrides that point ``recipe`` at its local data: the files its data set
    declares, in :func:`data_folder`."""
    folder = data_folder(recipe, data_dir)
    if folder is None:  # generated, embedded, or no data set named
        return []
    return [f"data.{key}={folder / file}" for key, file in _data_set(recipe).files.items()]


def check_data(recipe: str, data_dir: Path | None, overrides: list[str] = ()) -> None:
    """Stop (SystemExit) when a file of ``recipe``'s data is missing, saying how to get it;
    a key that ``overrides`` (``KEY=VALUE``) sets is the caller's own and not checked."""
    given = {o.split("=", 1)[0].strip() for o in overrides}
    missing = [s.split("=", 1)[1] for s in data_overrides(recipe, data_dir)
               if s.split("=", 1)[0] not in given and not Path(s.split("=", 1)[1]).is_file()]
    if not missing:
        return
    ds = _data_set(recipe)
    where = (f"in attnlab's data cache ({data_folder(recipe, None).parent})" if data_dir is None
             else f"under --data-dir {data_dir}")
    raise SystemExit(
        f"{recipe}: no {', '.join(missing)}: the {ds.download.name} data set is not {where}. "
        f"Fetch it with `attnlab data fetch {ds.download.name}` (into the cache, or with "
        f"`--cache DIR` elsewhere), or give --data-dir DATA, a folder holding "
        f"{ds.download.local_dir}/{{{','.join(ds.files.values())}}}.")


def timed(walls: dict[str, float], label: str, *args: str) -> str:
    """:func:`attnlab` that adds its wall time to ``walls`` under ``label``."""
    start = time.perf_counter()
    out = attnlab(*args)
    walls[label] = time.perf_counter() - start
    return out


def scores(run: Path, beam: int, walls: dict[str, float], stride: int = 0) -> dict[str, float]:
    """``attnlab eval`` of ``run`` (greedy, and with ``beam`` when it is > 1 and the run
    translates; with ``--stride`` when ``stride`` is given and the run is a language model):
    the metrics as a dict, the beam's BLEU as ``bleu_beam``, the strided loss as
    ``val_loss_stride``."""
    out = json.loads(timed(walls, f"attnlab eval {run.name}", "eval", str(run), "--json"))
    if beam > 1 and "bleu" in out:
        out["bleu_beam"] = json.loads(timed(walls, f"attnlab eval {run.name} --beam {beam}",
                                            "eval", str(run), "--json", "--beam",
                                            str(beam)))["bleu"]
    if stride and "ppl" in out:
        out["val_loss_stride"] = json.loads(timed(
            walls, f"attnlab eval {run.name} --stride {stride}", "eval", str(run), "--json",
            "--stride", str(stride)))["val_loss"]
    return {k: v for k, v in out.items() if isinstance(v, float)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("recipe", help="a shipped recipe name (attnlab recipes)")
    p.add_argument("--data-dir", type=Path, default=None, metavar="DATA",
                   help="a folder of local copies of the data sets (DATA/tinyshakespeare/"
                   "input.txt, DATA/multi30k/, DATA/sst2/train.tsv); default: attnlab's data "
                   "cache, which `attnlab data fetch NAME` fills")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--average", type=int, default=0, metavar="N",
                   help="also score the mean of the last N evaluation checkpoints")
    p.add_argument("--ema", type=float, default=0.0, metavar="D",
                   help="train with train.ema_decay=D and also score the moving average")
    p.add_argument("--beam", type=int, default=1, help="translation: also score this beam")
    p.add_argument("--stride", type=int, default=0, metavar="N",
                   help="language model: also score windows every N tokens (eval --stride)")
    p.add_argument("--out", type=Path, default=None, help="run dir (default: a temporary one)")
    p.add_argument("--tiny", action="store_true", help="a few steps of a tiny model")
    args = p.parse_args(argv)
    check_data(args.recipe, args.data_dir, args.overrides)
    print(f"machine: {machine()}\ndate: {date.today().isoformat()}\ncommit: {git_head()}\n"
          f"command: benchmarks/recipes.py {' '.join(argv if argv is not None else sys.argv[1:])}")
    sets = data_overrides(args.recipe, args.data_dir) + (TINY if args.tiny else [])
    sets += [f"train.keep_checkpoints={args.average}"] if args.average else []
    sets += [f"train.ema_decay={args.ema}"] if args.ema else []
    sets += args.overrides  # (the last word: --set train.keep_checkpoints=8 keeps more)
    walls: dict[str, float] = {}  # command -> seconds, in the order they ran
    with tempfile.TemporaryDirectory() as tmp:
        run = args.out or Path(tmp) / "run"
        timed(walls, f"attnlab train {args.recipe}", "train", args.recipe, "--out", str(run),
              *(f"--set={s}" for s in sets))
        path = [f"attnlab train {args.recipe}"]  # what the recipe runs end to end
        rows = [("trained (best/)", scores(run, args.beam, walls, args.stride))]
        averages = ([(f"average of the last {args.average}", "--last", str(args.average),
                      "avg")] if args.average else []) + \
            ([(f"moving average ({args.ema})", "--ema", "", "ema")] if args.ema else [])
        for name, flag, value, suffix in averages:  # the last one ends the recipe's path
            words = f"attnlab average {run.name} {flag} {value}".strip()
            timed(walls, words, "average", str(run), flag, *([value] if value else []),
                  "--out", f"{run}-{suffix}")
            rows.append((name, scores(Path(f"{run}-{suffix}"), args.beam, walls, args.stride)))
            path[1:] = [words]
        path.append(list(walls)[-1])  # the evaluation of the weights it ends on
    keys = sorted({k for _, r in rows for k in r})
    print(f"\n`attnlab train {args.recipe}`: {walls[path[0]]:.0f} s wall\n")
    print("| weights | " + " | ".join(keys) + " |")
    print("| --- |" + " --- |" * len(keys))
    for name, r in rows:
        print(f"| {name} | " + " | ".join(f"{r[k]:.4f}" if k in r else "" for k in keys) + " |")
    print("\n| command | s wall |\n| --- | ---: |")
    for words, wall in walls.items():
        print(f"| `{words}` | {wall:.0f} |")
    print(f"\nend to end ({', then '.join(f'`{w}`' for w in path)}): "
          f"{sum(walls[w] for w in path):.0f} s wall")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

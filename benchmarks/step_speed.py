"""Time a training step of a shipped recipe two ways, alternately, in fresh processes.

    .venv/bin/python benchmarks/step_speed.py multi30k_de_en --b-torch-dropout
    .venv/bin/python benchmarks/step_speed.py multi30k_de_en --b-set model.dropout=0.0
    .venv/bin/python benchmarks/step_speed.py shakespeare_char --pairs 6 --steps 40

Arm A is `attnlab train RECIPE` as shipped (plus any `--set`); arm B is the same with
`--b-set` overrides, or with `--b-torch-dropout`: attnlab's dropout (`attnlab.nn.dropout`)
replaced by `torch.nn.functional.dropout`. The arms run A B B A A B ... for `--pairs`
pairs, each a fresh process that trains `--skip` + `--steps` steps (no evaluation) and is
timed over the last `--steps` (the run's own clock, `elapsed_s` in metrics.csv: the first
steps, start-up and data preparation are left out). Prints each run's seconds per step and
each pair's B / A ratio, with the median and range. Data: local copies under `--data-dir`.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import subprocess
import sys
import tempfile
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from data_speed import git_head, machine  # noqa: E402
from recipes import ROOT, TINY, data_overrides  # noqa: E402

# arm B with --b-torch-dropout: the library's dropout swapped before the models import it
TORCH_DROPOUT = (
    "import sys, torch.nn.functional as F, attnlab.nn as core\n"
    "core.dropout = lambda x, p: F.dropout(x, p, training=True)\n"
    "from attnlab.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n")
DEFAULT = "from attnlab.cli import main; import sys; sys.exit(main(sys.argv[1:]))"


def seconds_per_step(recipe: str, sets: list[str], skip: int, steps: int, *,
                     torch_dropout: bool) -> float:
    """Train ``skip + steps`` steps of ``recipe`` in a fresh process; seconds per step of the
    last ``steps`` by the run's clock."""
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        sets = sets + [f"train.max_steps={skip + steps}", f"train.log_every={steps}",
                       f"train.eval_every={10 * (skip + steps)}", "train.progress=false",
                       "train.tensorboard=false"]
        code = TORCH_DROPOUT if torch_dropout else DEFAULT
        res = subprocess.run([sys.executable, "-c", code, "train", recipe, "--out", str(run),
                              *(f"--set={s}" for s in sets)],
                             capture_output=True, text=True, cwd=ROOT, check=False)
        if res.returncode != 0:
            raise SystemExit(f"training {recipe} failed:\n{res.stderr.strip()[-3000:]}")
        with open(run / "metrics.csv") as f:
            rows = {int(r["step"]): float(r["elapsed_s"]) for r in csv.DictReader(f)
                    if r["elapsed_s"]}
    # rows at `skip` is absent when skip is not a multiple of steps: time from the start then
    first = rows.get(skip, 0.0)
    return (rows[skip + steps] - first) / (steps if skip in rows else skip + steps)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("recipe", help="a shipped recipe name (attnlab recipes)")
    p.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="for both arms")
    p.add_argument("--b-set", action="append", default=[], metavar="KEY=VALUE",
                   help="for arm B only")
    p.add_argument("--b-torch-dropout", action="store_true",
                   help="arm B: torch.nn.functional.dropout instead of attnlab.nn.dropout")
    p.add_argument("--pairs", type=int, default=4)
    p.add_argument("--steps", type=int, default=30, help="timed steps per run")
    p.add_argument("--skip", type=int, default=None, help="untimed first steps (default: "
                   "--steps, so the log row at that step starts the clock)")
    p.add_argument("--tiny", action="store_true", help="a tiny model, a few steps (for tests)")
    args = p.parse_args(argv)
    if not (args.b_set or args.b_torch_dropout):
        p.error("give arm B something to differ by: --b-set KEY=VALUE or --b-torch-dropout")
    skip = args.steps if args.skip is None else args.skip
    given = " ".join(argv if argv is not None else sys.argv[1:])
    print(f"machine: {machine()}\ndate: {date.today().isoformat()}\ncommit: {git_head()}\n"
          f"command: benchmarks/step_speed.py {given}")
    base = data_overrides(args.recipe, args.data_dir) + (TINY if args.tiny else [])
    base += args.overrides
    arms = {"A": (base, False), "B": (base + args.b_set, args.b_torch_dropout)}
    print(f"A: as shipped{' + ' + ', '.join(args.overrides) if args.overrides else ''}; "
          f"B: {', '.join(args.b_set + (['torch dropout'] if args.b_torch_dropout else []))}\n")
    print("| pair | order | A s/step | B s/step | B / A |")
    print("| ---: | --- | ---: | ---: | ---: |")
    ratios = []
    for i in range(args.pairs):
        order = "AB" if i % 2 == 0 else "BA"
        t = {}
        for arm in order:
            sets, torch_dropout = arms[arm]
            t[arm] = seconds_per_step(args.recipe, sets, skip, args.steps,
                                      torch_dropout=torch_dropout)
        ratios.append(t["B"] / t["A"])
        print(f"| {i + 1} | {order} | {t['A']:.3f} | {t['B']:.3f} | {ratios[-1]:.3f} |",
              flush=True)
    print(f"\nB / A: median {statistics.median(ratios):.3f}, range {min(ratios):.3f}-"
          f"{max(ratios):.3f} over {len(ratios)} pairs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

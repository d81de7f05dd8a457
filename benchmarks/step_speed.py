"""Time a training step of a shipped recipe two ways, alternately, in fresh processes.

    .venv/bin/python benchmarks/step_speed.py multi30k_de_en --b-torch-dropout
    .venv/bin/python benchmarks/step_speed.py multi30k_de_en --b-set model.dropout=0.0
    .venv/bin/python benchmarks/step_speed.py multi30k_de_en --b-src ../before
    .venv/bin/python benchmarks/step_speed.py shakespeare_char --pairs 6 --steps 40
    .venv/bin/python benchmarks/step_speed.py multi30k_de_en --profile --steps 5
    .venv/bin/python benchmarks/step_speed.py shakespeare_char_cpu --b-src ../before --lockstep 100

Arm A is `attnlab train RECIPE` as shipped (plus any `--set`), with this checkout's attnlab;
arm B is the same with `--b-set` overrides, with `--b-torch-dropout`: attnlab's CPU dropout
(`attnlab.speed.cpu_dropout`) left out for `torch.nn.functional.dropout`, or with `--b-src DIR`: the
attnlab of another checkout (DIR/src), such as the commit before a change
(`git worktree add ../before HEAD~1`). The arms run A B B A A B ... for `--pairs`
pairs, each a fresh process that trains `--skip` + `--steps` steps (no evaluation) and is
timed over the last `--steps` (the run's own clock, `elapsed_s` in its metrics: the first
steps, start-up and data preparation are left out). Prints each run's milliseconds per step
and each pair's B / A ratio, with the median and range. On a small shared machine one thread
(`--set train.threads=1`) gives the steadier figures: two threads on two cores feel every
other tenant's load. Data: attnlab's data cache (`attnlab data fetch NAME`), or `--data-dir
DATA`.

`--lockstep TURNS` keeps each arm's process up instead: the two take turns, `--steps` training
steps a turn (after `--skip` untimed ones), TURNS turns each, so a change in the host's speed
falls on both arms within a fraction of a second; each turn is timed around the trainer's
`train_step` calls alone (fit's logging and schedule left out). Prints each pair of processes'
median B / A over its turns, and the median over all turns: the measure for a difference of a
few percent on a shared machine, where whole runs swing by more than that.

`--profile` instead runs arm A once, in this process, with `torch.profiler` around `--steps`
steps after `--skip`: where a step's time goes (matrix products, random numbers, attention,
the loss's softmax, norms, the optimizer, the rest; self time of the ops), the share of the
ops on vocabulary-wide tensors (the output projection and the loss), and the matrix
products' GFLOP/s against `torch.mm`'s best on this machine (fp32 and bf16 squares of
256-2048).
"""

from __future__ import annotations

import argparse
import math
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from data_speed import git_head, machine, src_env  # noqa: E402
from recipes import ROOT, TINY, check_data, data_overrides  # noqa: E402

# arm B with --b-torch-dropout: the trainer keeps the core's dropout (torch's) in the models'
# drop slots instead of putting attnlab.speed's CPU one there
TORCH_DROPOUT = (
    "import sys, attnlab.train.loop as loop\n"
    "loop.use_cpu_dropout = lambda model: model\n"
    "from attnlab.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n")
DEFAULT = "from attnlab.cli import main; import sys; sys.exit(main(sys.argv[1:]))"
# --lockstep: the trainer's fit replaced by turns the parent asks for on stdin ("K": take K
# steps, answer the seconds on a line that starts with TURN); only Trainer.train_step (and a
# compiled model's first step) is called, which every version of attnlab has
TURN = "@turn "
LOCKSTEP = (
    "import os, sys, time, attnlab.train.loop as loop\n"
    "def fit(self):\n"
    "    if getattr(self, 'compile_pending', False):\n"
    "        self._first_step_compiled()\n"
    "    for line in sys.stdin:\n"
    "        begin = time.perf_counter()\n"
    "        for _ in range(int(line)):\n"
    "            self.train_step()\n"
    f"        print({TURN!r} + repr(time.perf_counter() - begin), flush=True)\n"
    "    os._exit(0)\n"
    "loop.Trainer.fit = fit\n")


def timed_settings(skip: int, steps: int) -> list[str]:
    """Train ``skip + steps`` steps, no evaluation until the end, log rows at both ends of the
    timed window."""
    return [f"train.max_steps={skip + steps}", f"train.log_every={math.gcd(skip, steps)}",
            f"train.eval_every={10 * (skip + steps)}", "train.progress=false",
            "train.tensorboard=false"]


def seconds_per_step(recipe: str, sets: list[str], skip: int, steps: int, *,
                     torch_dropout: bool, env: dict[str, str] | None = None) -> float:
    """Train ``skip + steps`` steps of ``recipe`` in a fresh process (in ``env``: which
    attnlab it imports, :func:`src_env`); seconds per step of the last ``steps`` by the run's
    clock."""
    from attnlab.runs import RunDir

    with tempfile.TemporaryDirectory() as tmp:
        run = RunDir(Path(tmp) / "run")
        code = TORCH_DROPOUT if torch_dropout else DEFAULT
        res = subprocess.run([sys.executable, "-c", code, "train", recipe, "--out", str(run.path),
                              *(f"--set={s}" for s in sets + timed_settings(skip, steps))],
                             capture_output=True, text=True, cwd=ROOT, check=False,
                             env=env)
        if res.returncode != 0:
            raise SystemExit(f"training {recipe} failed:\n{res.stderr.strip()[-3000:]}")
        elapsed = {r["step"]: r["elapsed_s"] for r in run.read_metrics()
                   if r.get("elapsed_s") is not None}
    return (elapsed[skip + steps] - elapsed.get(skip, 0.0)) / steps  # skip = 0: from the start


def lockstep(recipe: str, arms: dict[str, tuple[list[str], bool, dict[str, str]]], turns: int,
             skip: int, steps: int) -> list[float]:
    """One pair of processes, one per arm, taking turns: ``skip`` untimed steps each, then
    ``turns`` turns of ``steps`` steps, A first in even turns; B / A of each turn."""
    procs, tmp = {}, tempfile.TemporaryDirectory()
    try:
        for arm, (sets, torch_dropout, env) in arms.items():
            code = LOCKSTEP + (TORCH_DROPOUT if torch_dropout else DEFAULT)
            with open(f"{tmp.name}/{arm}.log", "w") as log:  # (its log: read if it stops)
                procs[arm] = subprocess.Popen(
                    [sys.executable, "-c", code, "train", recipe, "--out", f"{tmp.name}/{arm}",
                     *(f"--set={s}" for s in sets + timed_settings(skip, steps))],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
                    cwd=ROOT, env=env)

        def turn(arm: str, k: int) -> float:
            proc = procs[arm]
            try:
                proc.stdin.write(f"{k}\n")
                proc.stdin.flush()
                for line in proc.stdout:
                    if line.startswith(TURN):
                        return float(line[len(TURN):])
            except BrokenPipeError:
                pass
            proc.wait()
            log = Path(f"{tmp.name}/{arm}.log").read_text(errors="replace")
            raise SystemExit(f"arm {arm} stopped:\n{log.strip()[-3000:]}")

        for arm in procs:
            turn(arm, skip)
        ratios = []
        for i in range(turns):
            t = {arm: turn(arm, steps) for arm in ("AB" if i % 2 == 0 else "BA")}
            ratios.append(t["B"] / t["A"])
        return ratios
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()
        tmp.cleanup()


# where a step's time goes: op names (self time) by group, the first match wins
GROUPS = (("matrix products", ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")),
          ("random numbers (dropout)", ("aten::random_", "aten::bernoulli_", "aten::uniform_")),
          ("attention", ("scaled_dot_product", "flash_attention")),
          ("loss (log-softmax, nll)", ("log_softmax", "nll_loss", "logsumexp")),
          ("norms", ("layer_norm",)),
          ("optimizer", ("aten::_foreach", "adam")))


def mm_peak(dtype: torch.dtype) -> float:
    """The best GFLOP/s of ``torch.mm`` on squares of 256 to 2048 in ``dtype``."""
    best = 0.0
    for n in (256, 512, 1024, 2048):
        a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
        torch.mm(a, b)
        reps = max(2, int(2e9 // (2 * n**3)))
        start = time.perf_counter()
        for _ in range(reps):
            torch.mm(a, b)
        best = max(best, 2 * n**3 * reps / (time.perf_counter() - start) / 1e9)
    return best


def profile_steps(recipe: str, sets: list[str], skip: int, steps: int) -> None:
    """Train ``recipe`` here with the profiler on for ``steps`` steps after ``skip``; print the
    groups' share of those steps' op time and the matrix products' GFLOP/s."""
    from torch.profiler import ProfilerActivity, profile

    from attnlab.cli import main as attnlab_main
    from attnlab.train.loop import Trainer

    plain, seen, prof = Trainer.train_step, [0], profile(activities=[ProfilerActivity.CPU],
                                                            with_flops=True, record_shapes=True)
    wall, vocab = [0.0], [0]

    def train_step(self):  # the profiler on for the chosen steps only
        seen[0] += 1
        vocab[0] = self.task.model_config.vocab_size
        if seen[0] == skip + 1:
            prof.__enter__()
            wall[0] = time.perf_counter()
        out = plain(self)
        if seen[0] == skip + steps:
            wall[0] = time.perf_counter() - wall[0]
            prof.__exit__(None, None, None)
        return out

    Trainer.train_step = train_step
    try:
        with tempfile.TemporaryDirectory() as tmp:
            attnlab_main(["train", recipe, "--out", str(Path(tmp) / "run"),
                          *(f"--set={s}" for s in sets + timed_settings(skip, steps))])
    finally:
        Trainer.train_step = plain
    total, by, flops, mm_us = 0.0, dict.fromkeys([g for g, _ in GROUPS] + ["the rest"], 0.0), 0, 0.0
    for ev in prof.key_averages():
        total += ev.self_cpu_time_total
        group = next((g for g, keys in GROUPS if any(k in ev.key for k in keys)), "the rest")
        by[group] += ev.self_cpu_time_total
        if group == "matrix products":
            flops += ev.flops or 0
            mm_us += ev.self_cpu_time_total
    print(f"{steps} steps after {skip}: {wall[0] / steps:.3f} s a step (wall, profiler on)\n")
    print("| part | ms a step | share |")
    print("| --- | ---: | ---: |")
    for group, us in by.items():
        print(f"| {group} | {us / 1e3 / steps:.0f} | {us / max(total, 1e-9):.0%} |")
    # ops with a vocabulary-sized dimension: the output projection, its gradient, the loss
    wide = sum(ev.self_cpu_time_total for ev in prof.key_averages(group_by_input_shape=True)
               if any(vocab[0] in shape for shape in ev.input_shapes or [] if shape))
    print(f"\nof which on ({vocab[0]:,}-wide) vocabulary tensors (the output projection, its "
          f"gradient, the loss): {wide / 1e3 / steps:.0f} ms a step, "
          f"{wide / max(total, 1e-9):.0%}")
    rate = flops / max(mm_us, 1e-9) / 1e3  # FLOP per microsecond / 1e3 = GFLOP/s
    peaks = {str(d).removeprefix("torch."): mm_peak(d) for d in (torch.float32, torch.bfloat16)}
    print(f"\nmatrix products: {flops / steps / 1e9:.1f} GFLOP a step at {rate:.0f} GFLOP/s; "
          "torch.mm's best here: " + ", ".join(f"{d} {g:.0f} GFLOP/s" for d, g in peaks.items()))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("recipe", help="a shipped recipe name (attnlab recipes)")
    p.add_argument("--data-dir", type=Path, default=None, metavar="DATA",
                   help="a folder of local copies of the data sets (as benchmarks/recipes.py); "
                   "default: attnlab's data cache, which `attnlab data fetch NAME` fills")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="for both arms")
    p.add_argument("--b-set", action="append", default=[], metavar="KEY=VALUE",
                   help="for arm B only")
    p.add_argument("--b-torch-dropout", action="store_true",
                   help="arm B: torch.nn.functional.dropout instead of attnlab.speed.cpu_dropout")
    p.add_argument("--b-src", type=Path, metavar="DIR",
                   help="arm B: the attnlab of another checkout (DIR/src)")
    p.add_argument("--pairs", type=int, default=4)
    p.add_argument("--steps", type=int, default=30, help="timed steps per run")
    p.add_argument("--skip", type=int, default=None, help="untimed first steps (default: "
                   "--steps, so the log row at that step starts the clock)")
    p.add_argument("--lockstep", type=int, default=0, metavar="TURNS",
                   help="both arms' processes stay up and take TURNS turns each of --steps "
                   "steps (--pairs pairs of processes)")
    p.add_argument("--profile", action="store_true",
                   help="instead: where arm A's step time goes, by torch.profiler")
    p.add_argument("--tiny", action="store_true", help="a tiny model, a few steps (for tests)")
    args = p.parse_args(argv)
    if not (args.b_set or args.b_torch_dropout or args.b_src or args.profile):
        p.error("give arm B something to differ by: --b-set KEY=VALUE, --b-torch-dropout "
                "or --b-src DIR")
    skip = args.steps if args.skip is None else args.skip
    check_data(args.recipe, args.data_dir, args.overrides + args.b_set)
    given = " ".join(argv if argv is not None else sys.argv[1:])
    print(f"machine: {machine()}\ndate: {date.today().isoformat()}\ncommit: {git_head()}\n"
          f"command: benchmarks/step_speed.py {given}")
    base = data_overrides(args.recipe, args.data_dir) + (TINY if args.tiny else [])
    base += args.overrides
    if args.profile:
        profile_steps(args.recipe, base, skip, args.steps)
        return 0
    here = src_env(ROOT / "src")
    arms = {"A": (base, False, here), "B": (base + args.b_set, args.b_torch_dropout,
                                            src_env(args.b_src / "src") if args.b_src else here)}
    b_is = args.b_set + (["torch dropout"] if args.b_torch_dropout else [])
    b_is += [f"attnlab of {args.b_src} ({git_head(args.b_src)})"] if args.b_src else []
    print(f"A: as shipped{' + ' + ', '.join(args.overrides) if args.overrides else ''}, "
          f"attnlab of {ROOT} ({git_head(ROOT)}); B: {', '.join(b_is)}\n")
    if args.lockstep:
        print(f"lockstep: {args.lockstep} turns of {args.steps} steps per arm after {skip}, "
              f"in each of {args.pairs} pairs of processes\n")
        print("| pair | turns | B / A (median of the turns) | range |")
        print("| ---: | ---: | ---: | --- |")
        every = []
        for i in range(args.pairs):
            ratios = lockstep(args.recipe, arms, args.lockstep, skip, args.steps)
            every += ratios
            print(f"| {i + 1} | {len(ratios)} | {statistics.median(ratios):.3f} | "
                  f"{min(ratios):.3f}-{max(ratios):.3f} |", flush=True)
        q = statistics.quantiles(every, n=4) if len(every) > 1 else every * 3
        print(f"\nB / A: median {statistics.median(every):.3f} over {len(every)} turns "
              f"(quartiles {q[0]:.3f}-{q[2]:.3f})")
        return 0
    print("| pair | order | A ms/step | B ms/step | B / A |")
    print("| ---: | --- | ---: | ---: | ---: |")
    ratios = []
    for i in range(args.pairs):
        order = "AB" if i % 2 == 0 else "BA"
        t = {}
        for arm in order:
            sets, torch_dropout, env = arms[arm]
            t[arm] = seconds_per_step(args.recipe, sets, skip, args.steps,
                                      torch_dropout=torch_dropout, env=env)
        ratios.append(t["B"] / t["A"])
        ms = {arm: f"{1e3 * t[arm]:.2f}" for arm in "AB"}
        print(f"| {i + 1} | {order} | {ms['A']} | {ms['B']} | {ratios[-1]:.3f} |", flush=True)
    print(f"\nB / A: median {statistics.median(ratios):.3f}, range {min(ratios):.3f}-"
          f"{max(ratios):.3f} over {len(ratios)} pairs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Resident memory of a training run over time: does it stay flat after warm-up?

    .venv/bin/python benchmarks/memory_growth.py multi30k_de_en --steps 600 \
        --set data.src_path=DATA/multi30k/train.de ... (see below)

Runs ``attnlab train RECIPE`` in a child process (with ``--set`` overrides; evaluation is off
unless asked for, so the curve shows the training steps alone) and samples the child's
resident set size (``VmRSS`` of ``/proc/PID/status``) every ``--every`` seconds, next to the
last step logged in the run's metrics. Prints one row per sample, then the growth between the
first sample after ``--warmup`` steps and the last one before the final step (what follows is
the final evaluation), in MB and MB per 100 steps. Linux only.

For Multi30k from a local copy of the data (``attnlab data fetch multi30k`` puts one in
attnlab's data cache, ``~/.cache/attnlab/data/multi30k``)::

    D=~/.cache/attnlab/data/multi30k
    .venv/bin/python benchmarks/memory_growth.py multi30k_de_en --steps 600 \
        --set data.src_path=$D/train.de --set data.tgt_path=$D/train.en \
        --set data.val_src_path=$D/val.de --set data.val_tgt_path=$D/val.en
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from attnlab.runs import RunDir  # noqa: E402


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def last_step(run: RunDir) -> int:
    try:
        rows = run.read_metrics()
    except Exception:  # the file is being written, or not there yet
        return 0
    return int(rows[-1]["step"]) if rows else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("recipe")
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--warmup", type=int, default=100, help="steps before growth is measured")
    p.add_argument("--every", type=float, default=5.0, help="seconds between samples")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--eval", action="store_true", help="keep the recipe's evaluations")
    args = p.parse_args(argv)
    if platform.system() != "Linux":
        p.error("reads /proc: Linux only")
    overrides = [f"train.max_steps={args.steps}", "train.log_every=10", "train.progress=false",
                 "train.tensorboard=false", *args.set]
    if not args.eval:
        overrides.append(f"train.eval_every={args.steps}")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        cmd = [str(ROOT / ".venv" / "bin" / "attnlab"), "train", args.recipe, "--out", str(out)]
        for o in overrides:
            cmd += ["--set", o]
        child = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                 text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        run, t0, samples = RunDir(out), time.perf_counter(), []
        print(f"recipe {args.recipe}, {args.steps} steps; overrides: {' '.join(overrides)}")
        print("| s | step | RSS MB |\n| --- | --- | --- |")
        while child.poll() is None:
            time.sleep(args.every)
            mb = rss_mb(child.pid)
            if mb is None:
                break
            samples.append((time.perf_counter() - t0, last_step(run), mb))
            print(f"| {samples[-1][0]:.0f} | {samples[-1][1]} | {mb:.0f} |", flush=True)
        err = child.stderr.read() if child.stderr else ""
        if child.wait() != 0:
            print(err.strip()[-2000:], file=sys.stderr)
            return 1
    # training steps only: once the last step is logged, what follows is the final evaluation
    # and the loss plot, not growth per step
    after = [s for s in samples if args.warmup <= s[1] < args.steps]
    if len(after) >= 2 and after[-1][1] > after[0][1]:
        (_, s0, m0), (_, s1, m1) = after[0], after[-1]
        print(f"\ngrowth from step {s0} to {s1}: {m1 - m0:+.0f} MB "
              f"({100 * (m1 - m0) / (s1 - s0):+.1f} MB per 100 steps); peak "
              f"{max(s[2] for s in samples):.0f} MB (the final evaluation included)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Memory of each process of data-parallel training on a CPU, measured and estimated.

    .venv/bin/python benchmarks/dist_memory.py          (about a minute on 2 cores)
    .venv/bin/python benchmarks/dist_memory.py --tiny   (seconds: checks that it runs)
    .venv/bin/python benchmarks/dist_memory.py --large --only fsdp --steps 8

Writes a small text and trains a decoder on it for a few steps with ``torchrun
--nproc_per_node 2`` (gloo), under DDP and, in a version with ``train.parallel``, FSDP (else
one line says it is skipped). Each process records its resident memory once torch and attnlab
are imported and its peak (``ru_maxrss``). What training added, less what it adds for a
14K-parameter model (gloo, modules imported on the way, the loss plot: measured first), is the
model's share, printed beside ``attnlab info --world-size 2``'s estimate of it: the training
state (:func:`attnlab.info.device_memory`) and the activations of the process's rows of the
batch, and the seconds each mode's ``torchrun`` took (start-up, ``--steps`` steps, the final
evaluation and samples): run it alternately with and without a setting of the environment
(``MALLOC_MMAP_THRESHOLD_``, ...) to weigh memory against time. Prints the machine, date,
commit and command first. Linux (``/proc/self/statm``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from data_speed import git_head, machine  # noqa: E402  (the benchmarks' one machine line)

NPROC = 2
SHAPES = {  # small but not tiny: the training state outweighs the activations of 2 rows
    "full": {"d_model": 384, "n_heads": 6, "n_layers": 6, "max_len": 64, "steps": 3},
    "large": {"d_model": 768, "n_heads": 12, "n_layers": 12, "max_len": 64, "steps": 3},
    "tiny": {"d_model": 32, "n_heads": 2, "n_layers": 1, "max_len": 16, "steps": 2},
}
BATCH = 4


def rss_now() -> int:
    """This process's resident memory now, in bytes."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE")


def worker(report: str, args: list[str]) -> int:
    """One torchrun process: ``attnlab train ARGS``, then its memory into ``REPORT.RANK``."""
    import torch  # noqa: F401  (imported before the first measurement, as attnlab is)

    from attnlab.cli import main
    from attnlab.train import Trainer  # noqa: F401

    base = rss_now()
    code = main(["train", *args])
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    Path(f"{report}.{os.environ['RANK']}").write_text(json.dumps({"base": base, "peak": peak}))
    return code


def modes() -> list[tuple[str, list[str] | None]]:
    """(name, the --set that chooses it, or None where this version has no such key)."""
    from attnlab.run_config import TrainConfig

    fsdp = "parallel" in {f.name for f in dataclasses.fields(TrainConfig)}
    return [("ddp", []), ("fsdp", ["--set", "train.parallel='fsdp'"] if fsdp else None)]


def estimate(run: Path) -> tuple[int, dict[str, float]]:
    """The parameters of the run's model, and each mode's estimate of a process's bytes."""
    import torch

    from attnlab.config import ModelConfig
    from attnlab.info import device_memory
    from attnlab.info import estimate as costs
    from attnlab.models import build_model

    cfg = ModelConfig.from_dict(json.loads((run / "config.json").read_text())["model"])
    with torch.device("meta"):
        params = sum(p.numel() for p in build_model(cfg).parameters())
    rows = math.ceil(BATCH / NPROC)
    activations = costs(cfg, params, rows, cfg.max_len).train_memory_bytes - 16 * params
    return params, {m: s.total + activations for m, s in device_memory(params, NPROC).items()}


def measure(shape: dict, choose: list[str], tmp: Path,
            name: str) -> tuple[int, dict, list, float]:
    """Train ``shape`` on ``NPROC`` processes with the ``--set``s ``choose``: the parameters,
    each mode's estimate, each rank's (base, peak) bytes and the seconds it took."""
    text = tmp / "text.txt"
    if not text.exists():
        text.write_text("".join(f"line {i}: the quick brown fox jumps over the lazy dog.\n"
                                for i in range(2000)))
    run, report = tmp / name, tmp / f"{name}.json"
    sets = {"data.path": str(text), "model.d_model": shape["d_model"],
            "model.n_heads": shape["n_heads"], "model.n_layers": shape["n_layers"],
            "model.max_len": shape["max_len"], "model.dropout": 0.0,
            "train.max_steps": shape["steps"], "train.batch_size": BATCH, "train.eval_every": 0,
            "train.eval_batches": 1, "train.final_eval_batches": 1,
            "train.precision": "'fp32'", "train.device": "'cpu'", "train.progress": "false",
            "train.tensorboard": "false"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc_per_node={NPROC}", __file__, "--worker", str(report), "--",
               "--out", str(run), *choose,
               *(a for k, v in sets.items() for a in ("--set", f"{k}={v}"))]
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"),
                                                       os.environ.get("PYTHONPATH")]))}
    t0 = time.perf_counter()
    proc = subprocess.run(command, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{name}: failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    params, estimates = estimate(run)
    got = [json.loads(Path(f"{report}.{rank}").read_text()) for rank in range(NPROC)]
    return params, estimates, [(g["base"], g["peak"]) for g in got], seconds


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tiny", action="store_true", help="a tiny model: checks the script runs")
    p.add_argument("--large", action="store_true",
                   help="a GPT-2-small-sized decoder (85M parameters, a char vocabulary)")
    p.add_argument("--steps", type=int, default=None, help="training steps (default 3)")
    p.add_argument("--only", choices=["ddp", "fsdp"], default=None, help="one mode only")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args, rest = p.parse_known_args(argv)
    if args.worker:
        return worker(args.worker, [a for a in rest if a != "--"])
    shape = dict(SHAPES["tiny" if args.tiny else "large" if args.large else "full"])
    shape["steps"] = args.steps or shape["steps"]
    malloc = [f"{k}={v}" for k, v in sorted(os.environ.items())  # (the settings it weighs)
              if k.startswith(("MALLOC_", "GLIBC_TUNABLES"))]
    command = [*malloc, "benchmarks/dist_memory.py", *(argv or sys.argv[1:])]
    print(f"machine: {machine()}\ndate: {date.today().isoformat()}\ncommit: {git_head()}\n"
          f"command: {' '.join(command)}")
    print(f"decoder d_model={shape['d_model']}, {shape['n_layers']} layers, batch {BATCH} x "
          f"{shape['max_len']} tokens, {shape['steps']} steps, fp32, {NPROC} CPU processes "
          "(gloo)\n")
    rows, mib = [], 2**20
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        # what any run adds (gloo, modules imported on the way, the loss plot): the tiny model's
        _, _, fixed, _ = measure(SHAPES["tiny"], [], tmp, "reference")
        for name, choose in modes():
            if args.only not in (None, name):
                continue
            if choose is None:
                print(f"{name.upper()}: skipped (train.parallel is not a config key in this "
                      "version)")
                continue
            params, estimates, got, seconds = measure(shape, choose, tmp, name)
            for rank, ((base, peak), (b0, p0)) in enumerate(zip(got, fixed)):
                rows.append((name.upper(), rank, base, peak, (peak - base) - (p0 - b0),
                             estimates[name], seconds))
    print(f"{params:,} parameters; MiB per process (the model's share: what training added, "
          "less what it added for a 14K-parameter model):\n")
    print("| mode | rank | after imports | peak | the model's share | estimate | share / "
          "estimate | torchrun's seconds |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, rank, base, peak, share, est, seconds in rows:
        print(f"| {name} | {rank} | {base / mib:.0f} | {peak / mib:.0f} | {share / mib:.1f} | "
              f"{est / mib:.1f} | {share / est:.2f} | {seconds:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

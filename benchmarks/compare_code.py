"""Two versions of attnlab side by side: the training step and greedy sampling, alternately.

    git worktree add /tmp/attnlab-before <rev>        # the code to compare against
    .venv/bin/python benchmarks/compare_code.py --base /tmp/attnlab-before/src

Each round runs the same measurement once in a fresh process per code tree (``PYTHONPATH``
set to that tree's ``src``), the two trees back to back, so slow drift in machine load falls
on both. Reported: the median over rounds of each figure and of the per-round ratio
(this tree / base; > 1 means this tree is faster). Shapes: the char-level LM of
``configs/shakespeare_char`` (4 layers, 192 wide, 4 heads, vocabulary 65) for sampling
(128 greedy tokens, batch 1 and 8, KV cache, one thread, column-major inference layout), and
the ``shakespeare_char_cpu`` step (4 x 128, block 64, batch 12, AdamW, fp32 and bf16
autocast, two threads). Random weights: speed does not depend on the values.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from data_speed import src_env  # noqa: E402  (the benchmarks' shared helpers)

# Runs in the child process, against whichever attnlab PYTHONPATH points to. Only API that
# both versions share: a positional model call, `generate` found in either home
# (`attnlab.decoding` now, `attnlab.generate` before the decoding package), and the trainer's
# attention kernels (`attnlab.speed.use_cpu_sdpa` where the tree has a speed layer).
CHILD = r"""
import json, sys, time
import torch
from attnlab import DecoderLM, ModelConfig
try:
    from attnlab.decoding import generate, inference_layout
except ImportError:
    from attnlab.generate import generate, inference_layout
try:  # the speed layer the trainer applies (older trees had its kernels inside the core)
    from attnlab.speed import use_cpu_sdpa
except ImportError:
    use_cpu_sdpa = lambda model: model

what = sys.argv[1]
out = {}

def best(fn, n):
    times = []
    for _ in range(n):
        t0 = time.perf_counter(); fn(); times.append(time.perf_counter() - t0)
    return min(times)

if what == "sample":
    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = ModelConfig(family="decoder", vocab_size=65, d_model=192, n_heads=4, n_layers=4,
                      max_len=256, dropout=0.0, norm="pre", pos="learned", ffn="gelu",
                      bias=False, scale_embeddings=False, pad_id=None)
    model = inference_layout(DecoderLM(cfg).eval())
    for b in (1, 8):
        prompts = [[1 + (i * 7 + j) % 60 for j in range(8)] for i in range(b)]
        run = lambda: generate(model, prompts, 128, temperature=0.0)
        run()
        out[f"sample_b{b}_tok_s"] = b * 128 / best(run, 5)
else:
    torch.set_num_threads(2)
    torch.manual_seed(0)
    cfg = ModelConfig(family="decoder", vocab_size=65, d_model=128, n_heads=4, n_layers=4,
                      max_len=64, dropout=0.0, norm="pre", pos="learned", ffn="gelu",
                      bias=False, scale_embeddings=False, pad_id=None)
    model = use_cpu_sdpa(DecoderLM(cfg)).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    x = torch.randint(0, 65, (12, 64)); y = torch.randint(0, 65, (12, 64))
    for precision in ("fp32", "bf16"):
        def step():
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
                _, loss = model(x, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step(); opt.zero_grad(set_to_none=True)
        for _ in range(5):
            step()
        out[f"train_{precision}_ms"] = 1000 * best(step, 20)
print(json.dumps(out))
"""

HIGHER_IS_BETTER = ("tok_s",)


def measure(src: Path, env: dict[str, str], what: str) -> dict[str, float]:
    res = subprocess.run([sys.executable, "-c", CHILD, what], env=env, capture_output=True,
                         text=True, check=False)
    if res.returncode != 0:
        raise SystemExit(f"measurement in {src} failed:\n{res.stderr.strip()[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--base", type=Path, required=True, help="the src/ folder to compare with")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--only", choices=("sample", "train"), default=None)
    args = p.parse_args(argv)
    this = ROOT / "src"
    envs = {args.base: src_env(args.base), this: src_env(this)}
    kinds = [args.only] if args.only else ["sample", "train"]
    rows: dict[str, dict[str, list[float]]] = {}
    for r in range(args.rounds):
        for kind in kinds:
            order = [("base", args.base), ("this", this)]
            if r % 2:
                order.reverse()  # alternate who goes first
            got = {name: measure(src, envs[src], kind) for name, src in order}
            for key in got["this"]:
                row = rows.setdefault(key, {"base": [], "this": [], "ratio": []})
                a, b = got["base"][key], got["this"][key]
                row["base"].append(a)
                row["this"].append(b)
                row["ratio"].append(b / a if key.endswith(HIGHER_IS_BETTER) else a / b)
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    from run_all import cpu_name  # the benchmarks' one CPU name (lscpu); this folder is on the path

    print(f"CPU: {cpu_name()}; torch threads: sampling 1, training 2; {args.rounds} rounds")
    print(f"base: {args.base}\nthis: {this}\n")
    print("| figure | base | this | this vs base (median, range) |")
    print("| --- | --- | --- | --- |")
    for key, row in rows.items():
        med = statistics.median
        print(f"| {key} | {med(row['base']):.2f} | {med(row['this']):.2f} | "
              f"{med(row['ratio']):.3f}x ({min(row['ratio']):.3f}-{max(row['ratio']):.3f}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

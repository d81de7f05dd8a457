"""Peak memory of attention against sequence length: the fused path vs the written-out one.

    .venv/bin/python benchmarks/attention_memory.py                  # T = 1k, 2k, 4k, 8k
    .venv/bin/python benchmarks/attention_memory.py --lengths 256 512 --no-backward

Batch 1, ``--heads`` heads of dimension 64, fp32, no mask, on CPU. For each path
(``attnlab.nn.fused_attention``, i.e. ``F.scaled_dot_product_attention``, and
``reference_attention``, the scores written out) and each length, one fresh child process
builds q, k, v, reads its peak resident memory (``VmHWM`` of ``/proc/self/status``), runs
forward (and backward through q, k, v), and reads the peak again: the difference is the
memory the attention call itself needed. A case whose estimated need exceeds half the
machine's available memory is skipped and says so. Prints a table and the growth factor per
doubling of T (about 2x = linear, about 4x = quadratic). Linux only.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

CHILD = r"""
import json, sys, torch
from attnlab.nn import fused_attention, reference_attention
def hwm():
    for line in open('/proc/self/status'):
        if line.startswith('VmHWM:'):
            return int(line.split()[1]) * 1024
path, t, heads, backward = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == '1'
torch.set_num_threads(2)
g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(1, heads, t, 64, generator=g).requires_grad_(backward) for _ in range(3))
# warm the kernels at a tiny size so one-off allocations are not counted
for fn in (fused_attention, reference_attention):
    small = [x[:, :, :16].detach().requires_grad_(backward) for x in (q, k, v)]
    out = fn(*small)
    out = out[0] if isinstance(out, tuple) else out
    if backward:
        out.sum().backward()
base = hwm()
if path == 'fused':
    out = fused_attention(q, k, v)
else:
    out = reference_attention(q, k, v)[0]
if backward:
    out.sum().backward()
print(json.dumps({'peak': hwm() - base}))
"""


def available_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def estimate(path: str, t: int, heads: int, backward: bool) -> int:
    """Rough bytes a case needs: the reference keeps a few (H, T, T) fp32 matrices."""
    if path == "fused":
        return 16 * heads * t * 64 * 4
    return (6 if backward else 3) * heads * t * t * 4


def measure(path: str, t: int, heads: int, backward: bool) -> int:
    out = subprocess.run([sys.executable, "-c", CHILD, path, str(t), str(heads),
                          "1" if backward else "0"], capture_output=True, text=True,
                         cwd=ROOT, env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin"})
    if out.returncode != 0:
        raise RuntimeError(out.stderr.strip().splitlines()[-1])
    return json.loads(out.stdout.strip().splitlines()[-1])["peak"]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--no-backward", dest="backward", action="store_false")
    args = p.parse_args(argv)
    avail = available_bytes()
    mode = "forward + backward" if args.backward else "forward"
    print(f"attention peak memory, batch 1, {args.heads} heads x 64, fp32, {mode}; "
          f"{avail / 2**30:.1f} GiB available")
    results: dict[str, dict[int, int | None]] = {"fused": {}, "reference": {}}
    for path in results:
        for t in args.lengths:
            need = estimate(path, t, args.heads, args.backward)
            if need > avail / 2:
                results[path][t] = None
                print(f"  {path} T={t}: skipped (needs ~{need / 2**30:.1f} GiB, more than half "
                      "the available memory)", flush=True)
                continue
            results[path][t] = measure(path, t, args.heads, args.backward)
            print(f"  {path} T={t}: {results[path][t] / 2**20:.1f} MiB", flush=True)
    print("\n| T | fused MiB | growth | written-out MiB | growth |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    prev: dict[str, int | None] = {"fused": None, "reference": None}
    for t in args.lengths:
        cells = []
        for path in ("fused", "reference"):
            m = results[path][t]
            if m is None:
                cells += ["skipped", "-"]
            else:
                growth = f"{m / prev[path]:.1f}x" if prev[path] else "-"
                cells += [f"{m / 2**20:.1f}", growth]
            prev[path] = m
        print(f"| {t} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()

"""Interpretability speed: hooks, head ablation and activation patching, attnlab vs
TransformerLens and nnsight, on a GPT-2-small-shaped model.

    .venv/bin/python benchmarks/interpret.py              # GPT-2 small shape, 64 tokens, 4 pairs
    .venv/bin/python benchmarks/interpret.py --quick      # a 2-layer model: checks it runs

One random-weight GPT-2 (12 layers, 12 heads, 768 wide, vocabulary 50,257) is saved by
``transformers`` into a temporary folder, imported into attnlab (``load_pretrained``) and booted
in TransformerLens 4 (``TransformerBridge``, compatibility mode with the original weights, so
both compute the same numbers: each grid's largest difference is printed). fp32, CPU, no
gradient on either side; the same prompt of ``--tokens`` tokens.

(a) a forward that caches every hook site (``run_with_cache(model, ids)``) against a plain
    forward: the cost of the hooks (aim: at most 1.5x);
(b) the zero-ablation grid of every head (144): ``ablate(model, lm_batch(ids), heads=...)``
    against one ``run_with_hooks`` per head that zeroes its ``hook_z``, as a TransformerLens
    user writes it (aim: attnlab at least 2x faster);
(c) the per-head activation-patching grid: ``patch(..., grids=["heads"])`` against
    ``transformer_lens.patching.get_act_patch_attn_head_out_all_pos`` after the clean
    ``run_with_cache`` (aim: at least 2x);
(e), (f) (b) and (c) against nnsight 0.8 on the same weights (``TransformersModel`` of the
    Hugging Face model): one trace per layer whose ``tracer.invoke`` per head zeroes (or, for
    patching, sets to the clean run's) that head's slice of ``attn.c_proj``'s input, nnsight
    batching the invokes of a trace into one forward, as an nnsight user writes a grid
    (aim: attnlab at least as fast);
(d) the peak memory of a ``--mem-tokens``-token forward with ``run_with_cache`` of one site
    against every site, and a plain forward: the growth of the resident peak (Linux's VmHWM,
    reset before the forward) of a fresh process over its resident memory before, and the
    bytes of the cached tensors: the cache holds only the sites named.

(a)-(c), (e), (f) alternate A B, B A, ... (``--pairs`` pairs, in this process); each pair's ratio is
printed, then the median and the range. The machine, date, commit and command come first.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(HERE))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")  # TransformerLens's patching progress bars

import torch  # noqa: E402
from data_speed import git_head, gpt2_files, machine  # noqa: E402  (shared helpers)

FULL = {"n_layer": 12, "n_head": 12, "n_embd": 768}  # GPT-2 small
QUICK = {"n_layer": 2, "n_head": 4, "n_embd": 64}
AIM_CACHE, AIM_ABLATE, AIM_PATCH = 1.5, 2.0, 2.0
AIM_NNSIGHT = 1.0


# ---- the model, both ways -------------------------------------------------------------------
def save_gpt2(folder: Path, shape: dict, n_positions: int) -> None:
    """A random GPT-2 of ``shape`` and GPT-2's tokenizer files in ``folder``."""
    import transformers

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=50257, n_positions=n_positions, **shape)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(folder)
    vocab, merges = gpt2_files()
    shutil.copy(vocab, folder / "vocab.json")
    shutil.copy(merges, folder / "merges.txt")


def load_both(folder: Path):
    """(attnlab's DecoderLM, TransformerLens's bridge or None with the reason)."""
    from attnlab.interop.pretrained import load_pretrained

    ours = load_pretrained(folder).model.float().eval()
    try:
        from transformer_lens.model_bridge import TransformerBridge

        bridge = TransformerBridge.boot_transformers(str(folder), device="cpu",
                                                     dtype=torch.float32)
        bridge.enable_compatibility_mode(no_processing=True, disable_warnings=True)
        return ours, bridge.eval(), ""
    except Exception as e:  # noqa: BLE001  (a peer that cannot load is reported, not fatal)
        return ours, None, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


# ---- timing ---------------------------------------------------------------------------------
def seconds(fn, repeat: int = 1) -> float:
    """The median of ``repeat`` timed calls of ``fn``."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def abba(a, b, pairs: int, repeat: int = 1) -> list[tuple[float, float]]:
    """(seconds of a, seconds of b) per pair, the order alternating (A B, B A, ...)."""
    a(), b()  # warm-up
    out = []
    for i in range(pairs):
        if i % 2 == 0:
            ta = seconds(a, repeat)
            tb = seconds(b, repeat)
        else:
            tb = seconds(b, repeat)
            ta = seconds(a, repeat)
        out.append((ta, tb))
    return out


def report(name: str, times: list[tuple[float, float]], aim: str, ok) -> dict:
    """Print each pair's B / A and return the row of the summary table."""
    ratios = [tb / ta for ta, tb in times]
    med = statistics.median(ratios)
    print(f"{name}: pairs (A s, B s, B/A): "
          + ", ".join(f"({ta:.3f}, {tb:.3f}, {tb / ta:.2f})" for ta, tb in times))
    return {"part": name, "a": statistics.median(t[0] for t in times),
            "b": statistics.median(t[1] for t in times), "ratio": med,
            "range": (min(ratios), max(ratios)), "aim": aim, "met": ok(med)}


def race(title: str, ours, peers, peer: str, pairs: int, aim: float, out: dict) -> dict:
    """:func:`report` of attnlab's ``ours`` (A) against the peer's ``peers`` (B), which leave
    their grids in ``out["grid"]`` and ``out["peer"]``, and the grids' largest difference."""
    row = report(f"{title} (A attnlab, B {peer})", abba(ours, peers, pairs), f"B/A >= {aim}",
                 lambda r: r >= aim)
    print(f"    largest |attnlab - {peer}| of the grid: "
          f"{(out['grid'] - out['peer'].float()).abs().max():.2e}")
    return row


# ---- (a) - (c) ------------------------------------------------------------------------------
def part_cache(model, ids, pairs: int) -> dict:
    from attnlab.interpret import run_with_cache

    def plain():
        with torch.no_grad():
            model(ids)

    def cached():
        with torch.no_grad():
            run_with_cache(model, ids)
    return report("(a) cache every site (A plain forward, B cached)",
                  abba(plain, cached, pairs, repeat=5), f"B/A <= {AIM_CACHE}",
                  lambda r: r <= AIM_CACHE)


def part_ablate(model, bridge, ids, pairs: int) -> dict:
    from attnlab.interpret import ablate, lm_batch

    layers, heads = model.config.n_layers, model.config.n_heads
    out = {}

    def attnlab_grid():
        out["grid"] = ablate(model, lm_batch(ids), heads=range(heads)).heads

    def zero(h):
        def fn(z, hook):  # (B, T, H, Dh)
            z[:, :, h] = 0.0
            return z
        return fn

    def tl_grid():
        with torch.no_grad():
            base = bridge(ids, return_type="loss")
            grid = torch.zeros(layers, heads)
            for layer in range(layers):
                for h in range(heads):
                    loss = bridge.run_with_hooks(ids, return_type="loss", fwd_hooks=[
                        (f"blocks.{layer}.attn.hook_z", zero(h))])
                    grid[layer, h] = loss - base
        out["peer"] = grid
    return race(f"(b) head ablation, {layers * heads} heads", attnlab_grid, tl_grid,
                "TransformerLens", pairs, AIM_ABLATE, out)


def part_patch(model, bridge, ids, pairs: int) -> dict:
    from transformer_lens.patching import get_act_patch_attn_head_out_all_pos

    from attnlab.interpret import patch

    clean, corrupted = ids[:, :-1], ids[:, :-1].clone()
    corrupted[:, clean.size(1) // 2] = (clean[:, clean.size(1) // 2] + 1) % 50257
    answer, wrong = int(ids[0, -1]), int(ids[0, -1] + 1) % 50257
    out = {}

    def metric(logits):
        return (logits[:, -1, answer] - logits[:, -1, wrong]).mean()

    def attnlab_grid():
        out["grid"] = patch(model, clean, corrupted, answer=answer, wrong=wrong,
                            grids=["heads"]).heads

    def tl_grid():
        with torch.no_grad():
            _, cache = bridge.run_with_cache(clean)
            out["peer"] = get_act_patch_attn_head_out_all_pos(bridge, corrupted, cache, metric)
    return race("(c) head patching grid", attnlab_grid, tl_grid, "TransformerLens", pairs,
                AIM_PATCH, out)


# ---- (e), (f): nnsight --------------------------------------------------------------------
def load_nnsight(folder: Path):
    """nnsight's ``TransformersModel`` of the Hugging Face GPT-2 in ``folder``, or None with the
    reason."""
    try:
        import transformers
        from nnsight import TransformersModel

        hf = transformers.GPT2LMHeadModel.from_pretrained(folder).float().eval()
        tok = transformers.GPT2TokenizerFast.from_pretrained(folder)
        return TransformersModel(hf, tokenizer=tok), ""
    except Exception as e:  # noqa: BLE001  (a peer that cannot load is reported, not fatal)
        return None, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def nnsight_grid(lm, inputs, layers: int, heads: int, value, score) -> torch.Tensor:
    """(layers, heads): ``score(logits)`` of ``inputs`` with head h of layer l set to
    ``value(l, h)`` (its columns of ``attn.c_proj``'s input); one trace per layer, one
    invoke per head (nnsight batches a trace's invokes into one forward)."""
    dh = lm.config.n_embd // heads
    grid = torch.zeros(layers, heads)
    with torch.no_grad():
        for layer in range(layers):
            saved = []
            with lm.trace() as tracer:
                for h in range(heads):
                    with tracer.invoke(inputs):
                        cols = slice(h * dh, (h + 1) * dh)
                        lm.transformer.h[layer].attn.c_proj.input[..., cols] = value(layer, h)
                        saved.append(lm.lm_head.output.save())
            grid[layer] = torch.tensor([float(score(lg)) for lg in saved])
    return grid


def part_ablate_nnsight(model, lm, ids, pairs: int) -> dict:
    import torch.nn.functional as F

    from attnlab.interpret import ablate, lm_batch

    layers, heads = model.config.n_layers, model.config.n_heads
    inputs, targets = ids[:, :-1], ids[:, 1:]
    out = {}

    def loss(logits):
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())

    def attnlab_grid():
        out["grid"] = ablate(model, lm_batch(ids), heads=range(heads)).heads

    def nnsight_ablation():
        saved = {}
        with torch.no_grad(), lm.trace(inputs):
            saved["logits"] = lm.lm_head.output.save()
        base = loss(saved["logits"])
        out["peer"] = nnsight_grid(lm, inputs, layers, heads, lambda layer, h: 0.0,
                                   lambda lg: loss(lg) - base)
    return race(f"(e) head ablation, {layers * heads} heads", attnlab_grid, nnsight_ablation,
                "nnsight", pairs, AIM_NNSIGHT, out)


def part_patch_nnsight(model, lm, ids, pairs: int) -> dict:
    from attnlab.interpret import patch

    layers, heads = model.config.n_layers, model.config.n_heads
    clean, corrupted = ids[:, :-1], ids[:, :-1].clone()
    corrupted[:, clean.size(1) // 2] = (clean[:, clean.size(1) // 2] + 1) % 50257
    answer, wrong = int(ids[0, -1]), int(ids[0, -1] + 1) % 50257
    dh = model.config.d_model // heads
    out = {}

    def attnlab_grid():
        out["grid"] = patch(model, clean, corrupted, answer=answer, wrong=wrong,
                            grids=["heads"]).heads

    def nnsight_patching():
        z = {}  # (filled inside the trace, whose body nnsight runs in a frame of its own)
        with torch.no_grad(), lm.trace(clean):
            for i in range(layers):
                z[i] = lm.transformer.h[i].attn.c_proj.input.save()
        out["peer"] = nnsight_grid(
            lm, corrupted, layers, heads,
            lambda layer, h: z[layer][..., h * dh:(h + 1) * dh],
            lambda lg: (lg[:, -1, answer] - lg[:, -1, wrong]).mean())
    return race("(f) head patching grid", attnlab_grid, nnsight_patching, "nnsight", pairs,
                AIM_NNSIGHT, out)


# ---- (d) memory -----------------------------------------------------------------------------
CHILD = r"""
import json, sys
import torch
from attnlab.interop.pretrained import load_pretrained
from attnlab.interpret import run_with_cache

def status(key):  # kB
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith(key))

folder, tokens, names = sys.argv[1], int(sys.argv[2]), sys.argv[3]
model = load_pretrained(folder).model.float().eval()
ids = torch.randint(0, 50257, (1, tokens), generator=torch.Generator().manual_seed(0))
with torch.no_grad():
    model(ids[:, :8])  # warm-up on a few tokens
    open("/proc/self/clear_refs", "w").write("5")  # the peak (VmHWM) restarts from now
    before = status("VmRSS:")
    held = 0
    if names == "-":
        model(ids)
    else:
        _, cache = run_with_cache(model, ids, names=names)
        held = sum(t.numel() * t.element_size() for t in cache.values())
    peak = status("VmHWM:")
print(json.dumps({"peak_mib": (peak - before) / 1024, "held_mib": held / 2 ** 20}))
"""


def part_memory(folder: Path, tokens: int) -> list[str]:
    """The peak-memory rows: a plain forward, one site cached, every site cached."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    rows = []
    for label, names in (("plain forward", "-"), ("cache one site", "blocks.0.resid_post"),
                         ("cache every site", "*")):
        out = subprocess.run([sys.executable, "-c", CHILD, str(folder), str(tokens), names],
                             capture_output=True, text=True, env=env, check=True).stdout
        got = json.loads(out.strip().splitlines()[-1])
        rows.append(f"| (d) {label}, {tokens} tokens | {got['peak_mib']:.0f} MiB | "
                    f"{got['held_mib']:.1f} MiB |")
    return rows


# ---- main -----------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a 2-layer model, 16 tokens, 2 pairs")
    ap.add_argument("--pairs", type=int, default=None, help="A B pairs (default 4; quick 2)")
    ap.add_argument("--tokens", type=int, default=None, help="prompt tokens (default 64)")
    ap.add_argument("--mem-tokens", type=int, default=None, help="(d)'s tokens (default 1024)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--only", default="abcdef", help="the parts to run, e.g. b or ad "
                    "(default abcdef)")
    args = ap.parse_args(argv)
    pairs = args.pairs or (2 if args.quick else 4)
    tokens = args.tokens or (16 if args.quick else 64)
    mem_tokens = args.mem_tokens or (128 if args.quick else 1024)
    if args.threads:
        torch.set_num_threads(args.threads)
    shape = QUICK if args.quick else FULL
    print(f"machine: {machine()}")
    print(f"date: {datetime.datetime.now().isoformat(timespec='seconds')}")
    print(f"commit: {git_head()}")
    print(f"command: {shlex.join([sys.executable, *sys.argv])}")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; GPT-2 shape {shape}, "
          f"vocabulary 50257, {tokens} tokens, {pairs} pairs\n")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        save_gpt2(folder, shape, max(1024, mem_tokens, tokens + 1))
        model, bridge, why = load_both(folder)
        ids = torch.randint(0, 50257, (1, tokens + 1), generator=torch.Generator().manual_seed(1))
        rows = [part_cache(model, ids[:, :-1], pairs)] if "a" in args.only else []
        if bridge is None:
            print(f"(b), (c) skipped: TransformerLens cannot load the model ({why})")
        else:
            rows += [part(model, bridge, ids, pairs) for key, part in
                     (("b", part_ablate), ("c", part_patch)) if key in args.only]
        if {"e", "f"} & set(args.only):
            lm, why = load_nnsight(folder)
            if lm is None:
                print(f"(e), (f) skipped: nnsight cannot load the model ({why})")
            else:
                rows += [part(model, lm, ids, pairs) for key, part in
                         (("e", part_ablate_nnsight), ("f", part_patch_nnsight))
                         if key in args.only]
        memory = part_memory(folder, mem_tokens) if "d" in args.only else []
    print("\n| part | A (median s) | B (median s) | B/A median (range) | aim | met |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        lo, hi = r["range"]
        print(f"| {r['part']} | {r['a']:.3f} | {r['b']:.3f} | {r['ratio']:.2f} "
              f"({lo:.2f}-{hi:.2f}) | {r['aim']} | {'yes' if r['met'] else 'no'} |")
    print("\n| peak memory (fresh process) | peak resident growth | tensors cached |")
    print("| --- | --- | --- |")
    print("\n".join(memory))


if __name__ == "__main__":
    main()

"""GPU benchmark: training tokens/s and MFU against nanoGPT, sampling against HF, the tests.

    .venv/bin/python benchmarks/gpu.py                     # on a CUDA machine, unchanged
    .venv/bin/python benchmarks/gpu.py --device cpu --tiny # a smoke run of every part on CPU
    .venv/bin/python benchmarks/gpu.py --skip pytest       # the figures only

On one device, in one run:

1. training: a GPT-2-124M-shaped attnlab DecoderLM (12 layers, 12 heads, 768 dims, block
   1024, batch 12, bf16 autocast, the flash SDPA kernel, ``torch.compile``, fused AdamW) on the
   Tiny Shakespeare char data, tokens/s and model FLOPs utilisation (nanoGPT's estimate:
   6N + 12 L T d FLOPs per token, N without the position table, over the device's dense
   bf16 peak), against nanoGPT's own
   ``train.py`` with its default GPT-2 configuration on the same data (run unmodified from the
   scratch copy ``benchmarks/.peers/nanogpt`` that ``run_all.py`` prepares; its iteration
   times are read from its log, the first iterations dropped as warm-up), and nanoGPT's
   ``GPT`` class from the same copy in this script's loop (the two models alone, one loop);
   and ``attnlab train`` itself (the CLI's Trainer and data pipeline, in a subprocess, the
   same model, data, batch and settings; tokens/s from its metrics log) against the same
   ``train.py``;
2. sampling: greedy decoding of a GPT-2-small-shaped model (V = 50257) against HF
   ``generate`` with the same weights, fp32 and bf16, batch 1 and 32;
3. the loader: the same GPT-2-124M-shaped model with GPT-2's vocabulary, its batches read from
   a prepared corpus (``--prepared DIR``, windows through memory maps as ``attnlab train``
   reads them) against random ids made on the device, which cost no loading at all;
4. ``pytest`` on the device: the whole suite, ``tests/train/test_cuda.py``'s device tests included
   (flash attention, fp16 with a GradScaler, nccl with one process), in parallel where
   pytest-xdist is installed.

Prints one table naming the device. ``--tiny`` shrinks every shape (for CPU smoke runs; the
same code paths, flash attention included, except ``torch.compile``). nanoGPT's scratch copy
must exist before a run on a machine without ``../shared`` (run ``run_all.py --only nanogpt``
or ``gpu.py --device cpu --tiny`` once here, and carry ``benchmarks/.peers``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402

# Dense bf16 tensor-core peaks (FLOP/s) from the vendors' data sheets (SXM parts).
# dense bf16 peaks by model name, the most specific first, matched as whole words (an "L4" is
# not an "L40S", an "A10" not an "A100")
PEAK_BF16 = (("H100 PCIe", 756e12), ("H100 NVL", 835e12), ("H100", 989e12), ("H200", 989e12),
             ("A100", 312e12), ("L40S", 362e12), ("L4", 121e12), ("A10", 125e12))


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    from run_all import cpu_name

    return f"CPU {cpu_name()}"


def peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_BF16 if re.search(rf"\b{re.escape(k)}\b", name)), None)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def shapes(args) -> dict:
    if args.tiny:
        return dict(layers=2, heads=2, d=64, block=64, batch=2, accum=1)
    return dict(layers=12, heads=12, d=768, block=1024, batch=12, accum=args.accum)


def input_txt(args) -> Path:
    """Tiny Shakespeare: under --data-dir, else the copy in the nanoGPT scratch folder (all a
    machine without ../shared needs is a carried benchmarks/.peers)."""
    from run_all import SCRATCH

    for path in (args.data_dir / "tinyshakespeare" / "input.txt",
                 SCRATCH / "nanogpt" / "data" / "shakespeare_char" / "input.txt"):
        if path.is_file():
            return path
    raise SystemExit(f"no Tiny Shakespeare: neither {args.data_dir}/tinyshakespeare/input.txt "
                     f"nor {SCRATCH}/nanogpt/data/shakespeare_char/input.txt (run gpu.py "
                     "--device cpu --tiny once where ../shared is, and carry benchmarks/.peers)")


def char_data(args) -> torch.Tensor:
    text = input_txt(args).read_text(encoding="utf-8")
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    return torch.tensor([stoi[c] for c in text[: int(0.9 * len(text))]], dtype=torch.long)


def model_fields(s: dict) -> dict:
    """The attnlab model of every training part, every field the recipe `attnlab train` starts
    from might set (nanoGPT's GPT-2 settings; vocabulary 65 and no pad id: the char data's,
    which `attnlab train` derives itself)."""
    return dict(family="decoder", d_model=s["d"], n_heads=s["heads"], n_layers=s["layers"],
                d_ff=4 * s["d"], max_len=s["block"], dropout=0.0, norm="pre", ffn="gelu",
                pos="learned", bias=False, scale_embeddings=False, tie_embeddings=True)


def attnlab_model(s: dict, vocab_size: int = 65) -> torch.nn.Module:
    from attnlab import ModelConfig, build_model

    return build_model(ModelConfig(**model_fields(s), vocab_size=vocab_size, pad_id=None))


def nanogpt_model(s: dict, args) -> torch.nn.Module:
    """nanoGPT's own GPT class (model.py of the scratch copy, unmodified), as its train.py
    builds it for this data: the same shapes, no bias, no dropout."""
    import importlib.util

    from run_all import nanogpt_copy

    path = nanogpt_copy(args.nanogpt, input_txt(args)) / "model.py"
    spec = importlib.util.spec_from_file_location("nanogpt_model", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    cfg = mod.GPTConfig(block_size=s["block"], vocab_size=65, n_layer=s["layers"],
                        n_head=s["heads"], n_embd=s["d"], dropout=0.0, bias=False)
    return mod.GPT(cfg)


def train_in_loop(args, device: torch.device, which: str = "attnlab", source: str = "char") -> dict:
    """Tokens/s of ``which`` model (attnlab's DecoderLM, or nanoGPT's GPT class) in this
    script's loop: nanoGPT's train.py step (micro-batches, clipping, fused AdamW).

    ``source``: ``char`` (Tiny Shakespeare's characters in memory), or GPT-2's vocabulary with
    batches of ``random`` ids made on the device (no loader at all) or windows read from the
    ``prepared`` DIR ``args.prepared`` (attnlab.data.shards, through memory maps)."""
    s = shapes(args)
    vocab = 65 if source == "char" else 50257
    data = char_data(args) if source == "char" else None
    if source == "prepared":
        from attnlab.data.shards import TokenShards

        shards = TokenShards(args.prepared, "train")
    torch.manual_seed(0)
    model = (attnlab_model(s, vocab) if which == "attnlab" else nanogpt_model(s, args)
             ).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95),
                            fused=device.type == "cuda")
    fwd = torch.compile(model) if (args.compile and not args.tiny) else model
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True  # as nanoGPT's train.py
        torch.backends.cudnn.allow_tf32 = True
    gen = torch.Generator().manual_seed(0)

    def batch():
        if source == "random":
            xy = torch.randint(vocab, (s["batch"], s["block"] + 1), device=device)
            return xy[:, :-1], xy[:, 1:]
        if source == "prepared":
            ix = torch.randint(len(shards) - s["block"] - 1, (s["batch"],), generator=gen)
            w = shards.windows(ix.tolist(), s["block"] + 1)  # (B, T + 1)
            x, y = w[:, :-1], w[:, 1:]
        else:
            ix = torch.randint(len(data) - s["block"] - 1, (s["batch"],), generator=gen)
            x = torch.stack([data[i:i + s["block"]] for i in ix])
            y = torch.stack([data[i + 1:i + 1 + s["block"]] for i in ix])
        if device.type == "cuda":  # as nanoGPT: pinned, so the copies do not wait for the GPU
            x, y = x.pin_memory(), y.pin_memory()
        return x.to(device, non_blocking=True), y.to(device, non_blocking=True)

    def autocast():
        return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" \
            else contextlib.nullcontext()

    def step():
        for _ in range(s["accum"]):
            x, y = batch()
            with autocast():
                _, loss = fwd(x, y)
            (loss / s["accum"]).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    # Flash only, checked once, eagerly: an error here, rather than a silent fallback, if the
    # model's attention call does not qualify (CPU has a flash kernel too, so the smoke run
    # checks it). The timed steps leave the choice to torch, which takes flash first where it
    # qualifies, as nanoGPT's train.py does: with sdpa_kernel entered around every compiled
    # forward, two H200 runs measured 0.95x / 0.94x nanoGPT, without it 1.00x
    # (benchmarks/README.md).
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with torch.no_grad(), autocast(), sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        model(*batch())

    for _ in range(args.warmup):
        step()
    sync(device)
    times = []
    for _ in range(args.iters):
        t0 = time.perf_counter()
        step()
        sync(device)
        times.append(time.perf_counter() - t0)
    tokens = s["batch"] * s["block"] * s["accum"]
    per_iter = statistics.median(times)
    n_matrix = n_params - s["block"] * s["d"]  # nanoGPT leaves the position table out
    flops_per_token = 6 * n_matrix + 12 * s["layers"] * s["d"] * s["block"]
    return {"tokens_s": tokens / per_iter, "ms": 1000 * per_iter,
            "flops_per_token": flops_per_token, "params": n_params}


TRAINER_RECIPE = "shakespeare_char"  # the recipe the trainer part starts from


def trainer_overrides(args, device: torch.device, prepared: Path | None = None) -> list[str]:
    """The ``--set`` values that make :data:`TRAINER_RECIPE` train this script's model, data,
    batch and settings (on the ``prepared`` DIR of GPT-2 tokens, if given)."""
    s = shapes(args)
    data = {"data.path": json.dumps(str(prepared)), "data.tokenizer": '"gpt2"'} if prepared \
        else {"data.path": json.dumps(str(input_txt(args))), "data.tokenizer": '"char"'}
    sets = {**{f"model.{k}": json.dumps(v) for k, v in model_fields(s).items()}, **data,
            "train.device": f'"{device}"',
            "train.compile": json.dumps(args.compile and not args.tiny),
            "train.precision": '"bf16"' if device.type == "cuda" else '"fp32"',
            "train.batch_size": s["batch"], "train.grad_accum": s["accum"],
            "train.block_size": s["block"], "train.lr": 6e-4, "train.beta2": 0.95,
            "train.max_steps": args.warmup + args.iters, "train.eval_every": 0,
            "train.eval_batches": 1, "train.final_eval_batches": 1, "train.log_every": 1,
            "train.progress": "false", "train.tensorboard": "false"}
    return [f"{key}={value}" for key, value in sets.items()]


def train_trainer(args, device: torch.device, prepared: Path | None = None) -> dict:
    """Tokens/s of ``attnlab train`` itself (the CLI, its Trainer and data pipeline, in a
    subprocess) on the same model, data and batch shape: what a user gets, read from the
    run's metrics log (one row per iteration; the first ``warmup`` rows dropped)."""
    import tempfile

    from attnlab.runs import RunDir

    s = shapes(args)
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "attnlab", "train", TRAINER_RECIPE, "--out",
               str(Path(tmp) / "run")]
        for override in trainer_overrides(args, device, prepared):
            cmd += ["--set", override]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])))
        out = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if out.returncode != 0:
            raise RuntimeError(f"attnlab train failed: {out.stderr.strip().splitlines()[-3:]}")
        rows = RunDir(Path(tmp) / "run").read_metrics()
    rates = [r["tokens_per_s"] for r in rows if r.get("tokens_per_s")][args.warmup:]
    tokens_s = statistics.median(rates)
    return {"tokens_s": tokens_s, "ms": 1000 * s["batch"] * s["block"] * s["accum"] / tokens_s}


def train_nanogpt(args, device: torch.device) -> dict:
    from run_all import nanogpt_copy

    path = nanogpt_copy(args.nanogpt, input_txt(args))
    s = shapes(args)
    cmd = [sys.executable, "train.py", "--dataset=shakespeare_char", f"--device={device.type}",
           f"--compile={args.compile and not args.tiny}", f"--batch_size={s['batch']}",
           f"--block_size={s['block']}", f"--n_layer={s['layers']}", f"--n_head={s['heads']}",
           f"--n_embd={s['d']}", f"--gradient_accumulation_steps={s['accum']}",
           f"--max_iters={args.warmup + args.iters}", "--eval_interval=100000",
           "--eval_iters=1", "--log_interval=1", "--always_save_checkpoint=False",
           "--out_dir=out-gpu-bench", "--dropout=0.0"]
    if device.type != "cuda":
        cmd.append("--dtype=float32")
    out = subprocess.run(cmd, cwd=path, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"nanoGPT train.py failed: {out.stderr.strip().splitlines()[-1:]}")
    ms = [float(m) for m in re.findall(r"iter \d+: loss [\d.]+, time ([\d.]+)ms", out.stdout)]
    ms = ms[args.warmup:] or ms
    per_iter = statistics.median(ms) / 1000
    return {"tokens_s": s["batch"] * s["block"] * s["accum"] / per_iter, "ms": 1000 * per_iter}


def sampling(args, device: torch.device) -> list[tuple[str, int, float, float, bool]]:
    """Greedy tokens/s of attnlab and HF ``generate`` on the same weights, fp32 and bf16
    weights, batch 1 and 32: (dtype, batch, HF, attnlab, same tokens)."""
    import copy
    import logging

    from sample_speed import gpt2_like, hf_greedy, interleaved, ours_greedy, rates

    from attnlab.interop import gpt2_to_hf

    logging.getLogger("transformers").setLevel(logging.ERROR)
    layers, d, heads = (2, 64, 2) if args.tiny else (12, 768, 12)
    model = gpt2_like(layers, d, heads, 1024).to(device)
    hf = gpt2_to_hf(model).to(device)
    n, out = args.sample_tokens, []
    for dtype in ("fp32", "bf16"):
        if dtype == "bf16":
            model, hf = (copy.deepcopy(m).to(torch.bfloat16) for m in (model, hf))
        for batch in (1, 32):
            prompt = torch.randint(0, 50257, (batch, 16),
                                   generator=torch.Generator().manual_seed(batch)).to(device)
            # both return token lists, so each timed call ends after the device has finished
            res = interleaved({"hf": hf_greedy(hf, prompt, n),
                               "ours": ours_greedy(model, prompt, n)}, args.repeat)
            rate = rates(res, batch * n)
            out.append((dtype, batch, rate["hf"], rate["ours"], res["hf"][1] == res["ours"][1]))
    return out


def run_pytest(device: torch.device, workers: int) -> str:
    """The whole suite (tests/train/test_cuda.py's device tests run where CUDA is), in ``workers``
    processes when pytest-xdist is installed; the summary line and every failure's line."""
    import importlib.util

    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:warnings", "-p", "no:cacheprovider"]
    if workers > 1 and importlib.util.find_spec("xdist") is not None:
        cmd += ["-n", str(workers)]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    lines = [line for line in out.stdout.strip().splitlines() if line.strip()]
    failed = [line for line in lines if line.startswith(("FAILED", "ERROR"))]
    summary = lines[-1] if lines else f"pytest exited {out.returncode}"
    return "\n".join([summary, *failed])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", "--smoke", dest="tiny", action="store_true",
                   help="tiny shapes (a CPU smoke run)")
    p.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data")
    p.add_argument("--nanogpt", type=Path, default=ROOT.parent / "shared" / "peers" / "nanogpt")
    p.add_argument("--iters", type=int, default=20, help="timed training iterations")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--accum", type=int, default=4, help="micro-batches per iteration (nanoGPT's "
                   "gradient_accumulation_steps; its default is 40)")
    p.add_argument("--no-compile", dest="compile", action="store_false")
    p.add_argument("--prepared", type=Path, default=None, metavar="DIR",
                   help="a prepared DIR of GPT-2 tokens (`attnlab data prepare ... --tokenizer "
                   "gpt2`): the loader part trains from it, against random ids")
    p.add_argument("--sample-tokens", type=int, default=128)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1),
                   help="pytest processes (pytest-xdist), for the test part")
    p.add_argument("--skip", default="", help="comma-separated parts to skip: train, "
                   "trainer (`attnlab train` itself, against nanoGPT's train.py), "
                   "nanogpt-model (nanoGPT's GPT class in this script's loop), nanogpt (its "
                   "train.py), loader (--prepared DIR against random ids), sample, pytest")
    args = p.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    parts = {"train", "trainer", "nanogpt-model", "nanogpt", "loader", "sample", "pytest"}
    if skip - parts:
        p.error(f"--skip {args.skip}: no part named {', '.join(sorted(skip - parts))}; the "
                f"parts are {', '.join(sorted(parts))}")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu.py: CUDA is not available here; use --device cpu --tiny for a smoke run",
              file=sys.stderr)
        sys.exit(2)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    peak = peak_flops(device)
    print(f"device: {device_name(device)}; torch {torch.__version__}"
          f"{'; tiny shapes' if args.tiny else ''}", flush=True)
    rows = []

    def show(name, peer, us, ratio):  # each row as soon as it is measured, and in the table
        rows.append((name, peer, us, ratio))
        print(f"  {name}: {peer} | {us} | {'-' if ratio is None else f'{ratio:.2f}x'}",
              flush=True)

    ours = ng = None
    if "train" not in skip:
        try:
            ours = train_in_loop(args, device)
            mfu = f"{100 * ours['tokens_s'] * ours['flops_per_token'] / peak:.1f}%" \
                if peak else "-"
            ours["cell"] = f"{ours['tokens_s']:,.0f} ({mfu})"
            show("training tokens/s (MFU)", "-", ours["cell"], None)
            ours["row"] = rows[-1]
            print(f"  attnlab: {ours['ms']:.1f} ms/iteration, {ours['params']:,} parameters",
                  flush=True)
        except Exception as exc:  # report, do not hide the other parts
            show("training, attnlab", f"failed: {exc!r}"[:300], "-", None)
    if "nanogpt-model" not in skip:  # the peer's model in this loop: the models alone
        try:
            nm = train_in_loop(args, device, which="nanogpt")
            print(f"  nanoGPT's GPT class in this script's loop: {nm['ms']:.1f} ms/iteration",
                  flush=True)
            show("training tokens/s, both models in one loop", f"{nm['tokens_s']:,.0f} "
                 "(nanoGPT's GPT)", f"{ours['tokens_s']:,.0f}" if ours else "-",
                 ours["tokens_s"] / nm["tokens_s"] if ours else None)
        except Exception as exc:
            show("nanoGPT's model in this loop", f"failed: {exc!r}"[:300], "-", None)
    if "nanogpt" not in skip:
        try:
            ng = train_nanogpt(args, device)
            fpt = ours["flops_per_token"] if ours else None
            mfu = f"{100 * ng['tokens_s'] * fpt / peak:.1f}%" if (peak and fpt) else "-"
            print(f"  nanoGPT: {ng['ms']:.1f} ms/iteration", flush=True)
            if ours:
                rows.remove(ours["row"])  # the attnlab row, now with its peer
            show("training tokens/s (MFU)", f"{ng['tokens_s']:,.0f} ({mfu}) (nanoGPT)",
                 ours["cell"] if ours else "-",
                 ours["tokens_s"] / ng["tokens_s"] if ours else None)
        except Exception as exc:
            show("training vs nanoGPT", f"failed: {exc!r}"[:300], "-", None)
    if "trainer" not in skip:  # the product's own training path, against nanoGPT's train.py
        try:
            tr = train_trainer(args, device)
            vs_loop = f", {tr['tokens_s'] / ours['tokens_s']:.2f}x this script's loop" \
                if ours else ""
            print(f"  attnlab train (its Trainer): {tr['ms']:.1f} ms/iteration{vs_loop}",
                  flush=True)
            show("training tokens/s, `attnlab train` itself",
                 f"{ng['tokens_s']:,.0f} (nanoGPT)" if ng else "-", f"{tr['tokens_s']:,.0f}",
                 tr["tokens_s"] / ng["tokens_s"] if ng else None)
        except Exception as exc:
            show("`attnlab train`", f"failed: {exc!r}"[:300], "-", None)
    if "loader" not in skip and args.prepared:  # does reading the corpus stall the device?
        try:
            rand = train_in_loop(args, device, source="random")
            prep = train_in_loop(args, device, source="prepared")
            show("training tokens/s, GPT-2 vocabulary, batches read from a prepared corpus",
                 f"{rand['tokens_s']:,.0f} (random ids, no loader)", f"{prep['tokens_s']:,.0f}",
                 prep["tokens_s"] / rand["tokens_s"])
            run = train_trainer(args, device, prepared=args.prepared)
            show("training tokens/s, `attnlab train --set data.path=DIR` (prepared corpus)",
                 f"{rand['tokens_s']:,.0f} (random ids in this loop)", f"{run['tokens_s']:,.0f}",
                 run["tokens_s"] / rand["tokens_s"])
        except Exception as exc:
            show("prepared corpus", f"failed: {exc!r}"[:300], "-", None)
    if "sample" not in skip:
        try:
            for dtype, batch, hf, us, same in sampling(args, device):
                show(f"greedy sampling tokens/s, {dtype}, batch {batch}"
                     f"{'' if same else ' (tokens differ)'}", f"{hf:,.0f} (HF generate)",
                     f"{us:,.0f}", us / hf)
        except Exception as exc:
            show("sampling", f"failed: {exc!r}"[:300], "-", None)
    print(f"\ndevice: {device_name(device)}; torch {torch.__version__}"
          f"{'; tiny shapes' if args.tiny else ''}")
    print("| measure | peer | attnlab | ratio |")
    print("| --- | --- | --- | --- |")
    for name, peer, us, ratio in rows:
        print(f"| {name} | {peer} | {us} | {'-' if ratio is None else f'{ratio:.2f}x'} |")
    if "pytest" not in skip:
        print(f"\npytest on {device.type}: {run_pytest(device, args.workers)}", flush=True)


if __name__ == "__main__":
    main()

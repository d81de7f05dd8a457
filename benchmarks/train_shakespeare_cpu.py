"""The shakespeare_char_cpu recipe end to end, and attnlab's training step against HF GPT-2's.

1. Trains the shakespeare_char_cpu recipe (nanoGPT's documented CPU config) on Tiny
   Shakespeare and prints the val loss at iteration 2000 and the wall time (nanoGPT: 1.89 /
   120 s reported; 630 s for 10,000 iterations measured on the 2-core reference machine).
2. Side by side in one process: one training step of attnlab's DecoderLM and of Hugging Face's
   GPT2LMHeadModel with the same configuration (4 layers, 4 heads, 128 dims, block 64,
   vocab 65, dropout 0, tied embeddings, exact GELU), the same batch (12 x 64) and the same
   optimizer (AdamW, decay on matrices only, fused kernel, grad clip 1.0) and precision; and
   nanoGPT's own ``GPT`` (its model.py, from ``--nanogpt``) stepped as its train.py does on a
   CPU: fp32, its ``configure_optimizers`` AdamW, grad clip 1.0. Prints tokens/s of each and
   the ratios. Rounds alternate between the models to share any drift in machine load.
   ``--clock cpu`` times the thread's CPU time instead of wall time (one thread only): on a
   machine shared with other jobs it leaves out the time the process was descheduled.
   (GPT-2 always has biases; attnlab's recipe and nanoGPT's has none.)

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/train_shakespeare_cpu.py
    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/train_shakespeare_cpu.py --skip-train
    HF_HUB_OFFLINE=1 taskset -c 0 .venv/bin/python benchmarks/train_shakespeare_cpu.py \
        --skip-train --threads 1 --clock cpu
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "tinyshakespeare" / "input.txt"
NANOGPT = ROOT.parent / "shared" / "peers" / "nanogpt"
sys.path.insert(0, str(ROOT / "src"))

from attnlab.models import token_loss  # noqa: E402
from attnlab.recipes import RECIPES  # noqa: E402
from attnlab.runs import RunDir  # noqa: E402
from attnlab.tasks import build_task  # noqa: E402
from attnlab.train import build_optimizer, load_config, train_run  # noqa: E402
from attnlab.train.precision import (  # noqa: E402
    autocast,
    fastest,
    probe_key,
    resolve_precision,
    sdpa_backends,
)


def train_recipe(args) -> dict:
    overrides = [f"data.path={args.data}", "train.progress=false", "train.tensorboard=false",
                 *args.set]
    rc = load_config(RECIPES / "shakespeare_char_cpu.toml", overrides)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        outcome = train_run(rc, Path(tmp) / "run")
        wall = time.perf_counter() - t0
        rows = RunDir(Path(tmp) / "run").read_metrics()
    at_end = [r for r in rows if r["val_loss"]][-1]
    return {"step": outcome.result.step, "val_loss_20": float(at_end["val_loss"]),
            "val_loss": outcome.result.metrics["val_loss"], "wall_s": wall,
            "train_s": float(rows[-1]["elapsed_s"]), "precision": rc.train.precision}


def hf_model(cfg):
    from transformers import GPT2Config, GPT2LMHeadModel

    hf_cfg = GPT2Config(vocab_size=cfg.vocab_size, n_positions=cfg.max_len, n_embd=cfg.d_model,
                        n_layer=cfg.n_layers, n_head=cfg.n_heads, n_inner=cfg.d_ff,
                        activation_function="gelu", resid_pdrop=0.0, embd_pdrop=0.0,
                        attn_pdrop=0.0, layer_norm_epsilon=cfg.norm_eps,
                        tie_word_embeddings=True, bos_token_id=None, eos_token_id=None)
    hf_cfg._attn_implementation = "sdpa"
    return GPT2LMHeadModel(hf_cfg)


def nanogpt_model(cfg, path: Path):
    """nanoGPT's GPT (its model.py, imported from ``path``) in the recipe's shape, and the
    optimizer its train.py builds for it on a CPU."""
    spec = importlib.util.spec_from_file_location("nanogpt_model", path / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with contextlib.redirect_stdout(None):  # it prints parameter counts
        model = module.GPT(module.GPTConfig(block_size=cfg.max_len, vocab_size=cfg.vocab_size,
                                            n_layer=cfg.n_layers, n_head=cfg.n_heads,
                                            n_embd=cfg.d_model, dropout=0.0, bias=False))
        opt = model.configure_optimizers(0.1, 1e-3, (0.9, 0.99), "cpu")
    return model, opt


def step_speed(args) -> dict:
    from attnlab import build_model

    torch.manual_seed(0)
    rc = load_config(RECIPES / "shakespeare_char_cpu.toml", [f"data.path={args.data}"])
    task = build_task(rc)
    cfg = task.model_config
    models = {"attnlab": build_model(cfg), "hf_gpt2": hf_model(cfg)}
    if args.sdpa == "auto":  # the same model with attention through SDPA (fp32 flash)
        torch.manual_seed(0)
        models["attnlab_sdpa"] = build_model(cfg)

    def measure() -> str:  # "auto" as the trainer resolves it: its probe, the same cache key
        x, y = task.next_batch()
        model = models["attnlab"]

        def probe(precision: str) -> None:
            with autocast(precision, torch.device("cpu"), sdpa_backends(rc.train.sdpa_backend)):
                loss = token_loss(model(x)[0], y, reduction="sum")
            loss.backward()
            model.zero_grad(set_to_none=True)

        return fastest(probe, probe_key(cfg.to_dict(), [tuple(x.shape), tuple(y.shape)],
                                        rc.train.sdpa_backend))

    precision = resolve_precision(args.precision or rc.train.precision, torch.device("cpu"),
                                  measure)
    opts = {k: build_optimizer(m, rc.train, "cpu") for k, m in models.items()}
    nanogpt = Path(getattr(args, "nanogpt", "") or "")
    if (nanogpt / "model.py").is_file():
        models["nanogpt"], opts["nanogpt"] = nanogpt_model(cfg, nanogpt)
    clock = time.thread_time if getattr(args, "clock", "wall") == "cpu" else time.perf_counter
    batches = [task.next_batch() for _ in range(8)]
    tokens = batches[0][0].numel()

    kernels = sdpa_backends(args.sdpa)

    def context(name):
        named = sdpa_backends("flash") if name == "attnlab_sdpa" else kernels
        return autocast(precision, torch.device("cpu"), named)

    def step(name, i):
        model, opt = models[name], opts[name]
        x, y = batches[i % len(batches)]
        if name == "nanogpt":  # fp32 (its train.py runs no autocast on a CPU), mean loss
            _, loss = model(x, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            return
        with context(name):
            if name.startswith("attnlab"):
                logits, _ = model(x)
            else:
                logits = model(input_ids=x).logits
            loss = token_loss(logits, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    for name in models:
        for i in range(args.warmup):
            step(name, i)
    times = {name: 0.0 for name in models}
    for r in range(args.rounds):
        for name in (models if r % 2 == 0 else reversed(list(models))):
            t0 = clock()
            for i in range(args.steps):
                step(name, i)
            times[name] += clock() - t0
    n = args.rounds * args.steps
    out = {name: n * tokens / t for name, t in times.items()}
    out["ms_attnlab"] = 1000 * times["attnlab"] / n
    out["ms_hf"] = 1000 * times["hf_gpt2"] / n
    out["params_attnlab"] = sum(p.numel() for p in models["attnlab"].parameters())
    out["params_hf"] = sum(p.numel() for p in models["hf_gpt2"].parameters())
    if "attnlab_sdpa" in models:
        out["ms_attnlab_sdpa"] = 1000 * times["attnlab_sdpa"] / n
    if "nanogpt" in models:
        out["ms_nanogpt"] = 1000 * times["nanogpt"] / n
        out["params_nanogpt"] = sum(p.numel() for p in models["nanogpt"].parameters())
    out["precision"] = precision
    out["kernel"] = "torch default" if kernels is None else kernels[0].name
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=str(DATA))
    p.add_argument("--skip-train", action="store_true", help="only the side-by-side step speed")
    p.add_argument("--skip-speed", action="store_true", help="only the recipe run")
    p.add_argument("--set", action="append", default=[], help="recipe override, e.g. "
                   "train.compile=true")
    p.add_argument("--precision", default=None, help="speed part: fp32 or bf16 (default: the "
                   "recipe's auto)")
    p.add_argument("--sdpa", default="auto", help="speed part: attention kernel for both "
                   "models: auto (the trainer's choice), default, math, flash")
    p.add_argument("--nanogpt", default=str(NANOGPT), help="speed part: nanoGPT's code (its "
                   "model.py); a missing one leaves nanoGPT out")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="speed part: wall time, or the thread's CPU time (one thread only)")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--warmup", type=int, default=10)
    args = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.clock == "cpu" and torch.get_num_threads() != 1:
        p.error("--clock cpu times one thread: add --threads 1")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{os.cpu_count()} CPUs")
    if not args.skip_train:
        r = train_recipe(args)
        print("\nshakespeare_char_cpu (nanoGPT CPU recipe: 4x4x128, block 64, batch 12)")
        print("| iters | val loss (20 batches) | val loss (200 batches) | train s | wall s |")
        print("| --- | --- | --- | --- | --- |")
        print(f"| {r['step']} | {r['val_loss_20']:.4f} | {r['val_loss']:.4f} | "
              f"{r['train_s']:.1f} | {r['wall_s']:.1f} |")
    if not args.skip_speed:
        with contextlib.suppress(KeyboardInterrupt):
            s = step_speed(args)
            print(f"\ntraining step, batch 12 x 64, {s['precision']}, attention kernel "
                  f"{s['kernel']}, {args.rounds} x {args.steps} steps each (alternating)")
            print("| model | params | ms/step | tokens/s |")
            print("| --- | --- | --- | --- |")
            print(f"| attnlab DecoderLM | {s['params_attnlab']:,} | {s['ms_attnlab']:.1f} | "
                  f"{s['attnlab']:,.0f} |")
            print(f"| HF GPT2LMHeadModel | {s['params_hf']:,} | {s['ms_hf']:.1f} | "
                  f"{s['hf_gpt2']:,.0f} |")
            if "nanogpt" in s:
                print(f"| nanoGPT GPT (fp32, as its train.py on CPU) | {s['params_nanogpt']:,} "
                      f"| {s['ms_nanogpt']:.1f} | {s['nanogpt']:,.0f} |")
            if "attnlab_sdpa" in s:
                print(f"| attnlab DecoderLM, attention through SDPA (fp32 flash) | "
                      f"{s['params_attnlab']:,} | {s['ms_attnlab_sdpa']:.1f} | "
                      f"{s['attnlab_sdpa']:,.0f} |")
            print(f"attnlab / HF tokens/s: {s['attnlab'] / s['hf_gpt2']:.2f}x")
            if "attnlab_sdpa" in s:
                print(f"attnlab / attnlab through SDPA tokens/s: "
                      f"{s['attnlab'] / s['attnlab_sdpa']:.2f}x")
            if "nanogpt" in s:
                print(f"attnlab / nanoGPT tokens/s: {s['attnlab'] / s['nanogpt']:.2f}x "
                      f"({args.clock} clock)")


if __name__ == "__main__":
    main()

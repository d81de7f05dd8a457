"""`make bench`: one table of speed ratios against the peers, all measured in this one run.

    .venv/bin/python benchmarks/run_all.py              # full: 2000 iterations of each recipe
    .venv/bin/python benchmarks/run_all.py --quick      # 200 iterations, fewer rounds
    .venv/bin/python benchmarks/run_all.py --only hf-step,torch-transformer
    .venv/bin/python benchmarks/run_all.py --smoke      # tiny shapes: checks the script runs

Parts (each a function taking the parsed arguments and returning table rows):

- ``nanogpt``: nanoGPT's own ``train.py`` with its README's CPU recipe, run unmodified from a
  scratch copy (``benchmarks/.peers/nanogpt``, ignored by git) on the local Tiny Shakespeare,
  against ``attnlab train shakespeare_char_cpu`` for the same iterations; both in child
  processes, wall time of each (start-up included), pairs alternating who goes first; val
  loss of each (20 batches, nanoGPT's ``--eval_iters=20``).
- ``hf-step``: one training step of attnlab's DecoderLM against HF ``GPT2LMHeadModel`` with the
  same configuration (``train_shakespeare_cpu.step_speed``).
- ``hf-sample``: greedy decoding, the char shape (4 x 192, vocab 65), against HF ``generate``
  with the same weights at batch 1 and 8, one thread (``sample_speed``'s functions); attnlab
  with ``inference_layout``, as ``attnlab sample`` runs it.
- ``torch-transformer``: attnlab's encoder-decoder ``Transformer`` against a model built on
  ``torch.nn.Transformer`` with the same configuration (post-norm, batch-first, ReLU FFN,
  sinusoidal positions, tied output projection, dropout 0), the same random batch, forward +
  backward + AdamW step, fp32, alternating rounds.

A part whose inputs are missing prints ``skipped: <why>`` in its row instead of failing.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SCRATCH = HERE / ".peers"
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402

from attnlab.data.fetch import sha256_of  # noqa: E402

PARTS = ("nanogpt", "hf-step", "hf-sample", "torch-transformer")


def cpu_name() -> str:
    """The CPU model as ``lscpu`` names it (falls back to the platform string)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    return platform.processor() or platform.machine()


def row(comparison: str, peer: str, ours: str, ratio: float | None, note: str = "") -> dict:
    return {"comparison": comparison, "peer": peer, "attnlab": ours, "ratio": ratio,
            "note": note}


def skipped(comparison: str, why: str) -> dict:
    return row(comparison, f"skipped: {why}", "-", None)


# --- nanoGPT ---------------------------------------------------------------------------------

STAMP = ".prepared-from"  # beside train.bin: the sha256 of the input.txt it was prepared from


def nanogpt_copy(src: Path, data_file: Path, scratch: Path | None = None) -> Path:
    """A scratch copy of nanoGPT (in ``scratch``, default :data:`SCRATCH`) with the char data
    prepared from ``data_file``. Its prepare.py runs unmodified; it imports ``requests`` (only
    used when input.txt is missing), so a stub module is put on its path when the package is
    absent.

    The prepared data records the hash of the file it came from (:data:`STAMP`) and is
    prepared again when ``data_file`` differs: a test's copy prepared from a few KB once
    served `make bench` after it, which then trained nanoGPT on that."""
    scratch = SCRATCH if scratch is None else scratch
    dst = scratch / "nanogpt"
    if not (dst / "train.py").exists():
        shutil.copytree(src, dst, dirs_exist_ok=True)
        for path in (dst, *dst.rglob("*")):  # the peers folder is read-only: copies are not
            path.chmod(path.stat().st_mode | 0o200)
    data = dst / "data" / "shakespeare_char"
    stamp, want = data / STAMP, sha256_of(data_file)
    prepared = stamp.is_file() and stamp.read_text().strip() == want
    if not (prepared and (data / "train.bin").exists()):
        stamp.unlink(missing_ok=True)  # (a kill from here on: prepared again next time)
        if not (data / "input.txt").exists() or not data_file.samefile(data / "input.txt"):
            shutil.copyfile(data_file, data / "input.txt")
        stub = scratch / "stub"
        stub.mkdir(parents=True, exist_ok=True)
        (stub / "requests.py").write_text("")
        env = dict(os.environ, PYTHONPATH=str(stub))
        subprocess.run([sys.executable, "prepare.py"], cwd=data, env=env, check=True,
                       capture_output=True)
        stamp.write_text(want + "\n")
    return dst


def run_nanogpt(path: Path, iters: int, eval_every: int) -> tuple[float, float | None]:
    cmd = [sys.executable, "train.py", "config/train_shakespeare_char.py", "--device=cpu",
           "--compile=False", "--eval_iters=20", "--log_interval=1", "--block_size=64",
           "--batch_size=12", "--n_layer=4", "--n_head=4", "--n_embd=128",
           f"--max_iters={iters}", f"--lr_decay_iters={iters}", "--dropout=0.0",
           f"--eval_interval={eval_every}", "--out_dir=out-bench"]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, cwd=path, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise RuntimeError(f"nanoGPT train.py failed: {out.stderr.strip().splitlines()[-1:]}")
    vals = re.findall(r"step (\d+): train loss [\d.]+, val loss ([\d.]+)", out.stdout)
    return wall, (float(vals[-1][1]) if vals else None)


def run_attnlab(data_file: Path, iters: int,
                eval_every: int) -> tuple[float, float | None, str]:
    from attnlab.runs import RunDir

    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "attnlab", "train", "shakespeare_char_cpu",
               "--out", str(Path(tmp) / "run"), "--set", f"data.path={data_file}",
               "--set", f"train.max_steps={iters}", "--set", f"train.decay_steps={iters}",
               "--set", f"train.eval_every={eval_every}", "--set", "train.progress=false",
               "--set", "train.tensorboard=false"]
        t0 = time.perf_counter()
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if out.returncode != 0:
            raise RuntimeError(f"attnlab train failed: {out.stderr.strip().splitlines()[-1:]}")
        rows = RunDir(Path(tmp) / "run").read_metrics()
        precision = json.loads((Path(tmp) / "run" / "results.json").read_text())["precision"]
    # The last scheduled evaluation (20 batches, like nanoGPT's); the final 200-batch one
    # the recipe adds at the end is in the same column, so take the row at ``iters``.
    vals = [r for r in rows if r.get("val_loss") is not None and r["step"] == iters]
    return wall, (float(vals[0]["val_loss"]) if vals else None), precision


def part_nanogpt(args) -> list[dict]:
    name = f"train shakespeare_char_cpu, {args.iters} iters (wall s, val loss)"
    data_file = args.data_dir / "tinyshakespeare" / "input.txt"
    if not data_file.exists():
        return [skipped(name, f"no {data_file}")]
    if not (args.nanogpt / "train.py").exists():
        return [skipped(name, f"no nanoGPT at {args.nanogpt}")]
    path = nanogpt_copy(args.nanogpt, data_file)
    # nanoGPT evaluates at multiples of eval_interval; make the last iteration one of them.
    eval_every = 250 if args.iters % 250 == 0 else args.iters
    walls = {"nanogpt": [], "attnlab": []}
    losses, precision = {}, "?"
    for pair in range(args.pairs):
        order = ("nanogpt", "attnlab") if pair % 2 == 0 else ("attnlab", "nanogpt")
        for who in order:
            if who == "nanogpt":
                wall, loss = run_nanogpt(path, args.iters, eval_every)
            else:
                wall, loss, precision = run_attnlab(data_file, args.iters, eval_every)
            walls[who].append(wall)
            losses[who] = loss
            print(f"  nanogpt part, pair {pair + 1}: {who} {wall:.1f} s, val loss {loss}",
                  flush=True)
    ng, at = sum(walls["nanogpt"]) / args.pairs, sum(walls["attnlab"]) / args.pairs

    def fmt(wall, loss):
        return f"{wall:.1f} s, val {loss:.3f}" if loss is not None else f"{wall:.1f} s"

    per_pair = ", ".join(f"{a / b:.2f}x" for a, b in zip(walls["nanogpt"], walls["attnlab"]))
    return [row(name, fmt(ng, losses["nanogpt"]), fmt(at, losses["attnlab"]), ng / at,
                f"mean of {args.pairs} pairs, alternating who goes first; per pair {per_pair}; "
                f"nanoGPT trains in fp32 on a CPU, attnlab in {precision} (precision auto: "
                "what it measured fastest here)")]


# --- HF training step ------------------------------------------------------------------------

def part_hf_step(args) -> list[dict]:
    name = "training step, 4x4x128, batch 12x64 (tokens/s)"
    data_file = args.data_dir / "tinyshakespeare" / "input.txt"
    if not data_file.exists():
        return [skipped(name, f"no {data_file}")]
    try:
        import transformers  # noqa: F401
    except ImportError:
        return [skipped(name, "transformers is not installed")]
    from train_shakespeare_cpu import step_speed

    s = step_speed(SimpleNamespace(data=str(data_file), precision=None, sdpa="auto",
                                   warmup=args.step_warmup, rounds=args.step_rounds,
                                   steps=args.step_steps))
    return [row(name, f"{s['hf_gpt2']:,.0f} (HF GPT2LMHeadModel)", f"{s['attnlab']:,.0f}",
                s["attnlab"] / s["hf_gpt2"],
                f"{s['precision']}, attention {s['kernel']}, {args.step_rounds} x "
                f"{args.step_steps} steps each, alternating")]


# --- HF sampling -----------------------------------------------------------------------------

def part_hf_sample(args) -> list[dict]:
    try:
        import transformers  # noqa: F401
    except ImportError:
        return [skipped("greedy sampling, char shape", "transformers is not installed")]
    import logging

    from sample_speed import gpt2_like, hf_greedy, interleaved, ours_greedy, rates

    from attnlab.decoding import inference_layout, layout_pays
    from attnlab.interop import gpt2_to_hf

    logging.getLogger("transformers").setLevel(logging.ERROR)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        shape = (1, 32, 2, 64) if args.smoke else (4, 192, 4, 256)  # layers, D, H, max_len
        base = gpt2_like(*shape, vocab=65)
        hf = gpt2_to_hf(base)  # HF gets the weights as trained
        n, out = args.sample_tokens, []
        for batch in (1, 8):
            # the layout `attnlab sample` takes for this many rows (measured, cached)
            pays = layout_pays(base, batch)
            model = inference_layout(copy.deepcopy(base)) if pays else base
            prompt = torch.randint(0, 65, (batch, 16),
                                   generator=torch.Generator().manual_seed(batch))
            res = interleaved({"hf": hf_greedy(hf, prompt, n),
                               "ours": ours_greedy(model, prompt, n)}, args.sample_repeat)
            rate = rates(res, batch * n)
            same = res["hf"][1] == res["ours"][1]
            out.append(row(f"greedy sampling, {shape[0]}x{shape[1]} V65, batch {batch} "
                           "(tokens/s)",
                           f"{rate['hf']:,.0f} (HF generate)", f"{rate['ours']:,.0f}",
                           rate["ours"] / rate["hf"],
                           f"1 thread, {n} new tokens, median of {args.sample_repeat} "
                           f"rounds, same tokens: {'yes' if same else 'NO'}; weights "
                           f"{'column-major' if pays else 'row-major'} (layout_pays)"))
        return out
    finally:
        torch.set_num_threads(threads)


# --- torch.nn.Transformer --------------------------------------------------------------------

class TorchSeq2Seq(torch.nn.Module):
    """torch.nn.Transformer with the embeddings, sinusoidal positions and tied output
    projection of the paper (what attnlab's encoder-decoder has around its stacks)."""

    def __init__(self, vocab: int, d: int, heads: int, layers: int, d_ff: int, max_len: int):
        super().__init__()
        self.d = d
        self.src_emb = torch.nn.Embedding(vocab, d)
        self.tgt_emb = torch.nn.Embedding(vocab, d)
        self.core = torch.nn.Transformer(d, heads, layers, layers, d_ff, dropout=0.0,
                                         batch_first=True, norm_first=False)
        self.head = torch.nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tgt_emb.weight
        pos = torch.arange(max_len).unsqueeze(1)
        div = torch.exp(torch.arange(0, d, 2) * (-math.log(10000.0) / d))
        pe = torch.zeros(max_len, d)
        pe[:, 0::2], pe[:, 1::2] = torch.sin(pos * div), torch.cos(pos * div)
        self.register_buffer("pe", pe)

    def forward(self, src, tgt):
        scale = math.sqrt(self.d)
        s = self.src_emb(src) * scale + self.pe[: src.size(1)]
        t = self.tgt_emb(tgt) * scale + self.pe[: tgt.size(1)]
        causal = torch.nn.Transformer.generate_square_subsequent_mask(tgt.size(1))
        return self.head(self.core(s, t, tgt_mask=causal, tgt_is_causal=True))


def part_torch_transformer(args) -> list[dict]:
    from attnlab import ModelConfig, build_model

    vocab, d, heads, layers, d_ff, batch, length = ((50, 32, 2, 1, 64, 2, 8) if args.smoke else
                                                    (1000, 256, 4, 3, 1024, 16, 24))
    torch.manual_seed(0)
    cfg = ModelConfig(family="encoder_decoder", vocab_size=vocab, d_model=d, n_heads=heads,
                      n_layers=layers, d_ff=d_ff, dropout=0.0, norm="post", ffn="relu",
                      pos="sinusoidal", max_len=128, tie_embeddings=True, pad_id=None)
    models = {"attnlab": build_model(cfg), "torch": TorchSeq2Seq(vocab, d, heads, layers, d_ff,
                                                                 128)}
    opts = {k: torch.optim.AdamW(m.parameters(), lr=1e-4) for k, m in models.items()}
    g = torch.Generator().manual_seed(1)
    src = torch.randint(0, vocab, (batch, length), generator=g)
    tgt = torch.randint(0, vocab, (batch, length + 1), generator=g)
    tgt_in, targets = tgt[:, :-1], tgt[:, 1:]

    def step(name):
        model, opt = models[name], opts[name]
        if name == "attnlab":
            _, loss = model(src, tgt_in, targets)
        else:
            logits = model(src, tgt_in)
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab),
                                                     targets.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for name in models:
        for _ in range(args.step_warmup):
            step(name)
    times = {k: 0.0 for k in models}
    for r in range(args.step_rounds):
        for name in (("attnlab", "torch") if r % 2 == 0 else ("torch", "attnlab")):
            t0 = time.perf_counter()
            for _ in range(args.step_steps):
                step(name)
            times[name] += time.perf_counter() - t0
    n = args.step_rounds * args.step_steps
    tokens = batch * (2 * length)  # source + target tokens per step
    rate = {k: n * tokens / t for k, t in times.items()}
    params = sum(p.numel() for p in models["attnlab"].parameters())
    return [row(f"encoder-decoder training step, {layers}+{layers}x{d}, batch {batch}x{length} "
                "(tokens/s)", f"{rate['torch']:,.0f} (torch.nn.Transformer)",
                f"{rate['attnlab']:,.0f}", rate["attnlab"] / rate["torch"],
                f"fp32, {params / 1e6:.1f}M params, {args.step_rounds} x {args.step_steps} "
                "steps each, alternating")]


FUNCTIONS = {"nanogpt": part_nanogpt, "hf-step": part_hf_step, "hf-sample": part_hf_sample,
             "torch-transformer": part_torch_transformer}


def table(rows: list[dict]) -> str:
    lines = ["| comparison | peer | attnlab | ratio (higher = attnlab faster) | note |",
             "| --- | --- | --- | --- | --- |"]
    for r in rows:
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}x"
        lines.append(f"| {r['comparison']} | {r['peer']} | {r['attnlab']} | {ratio} | "
                     f"{r['note']} |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true",
                   help="200 training iterations of each recipe, fewer rounds")
    p.add_argument("--smoke", action="store_true",
                   help="tiny shapes and 20 iterations: checks that every part runs (no figures)")
    p.add_argument("--only", default=",".join(PARTS),
                   help=f"comma-separated parts to run, from: {', '.join(PARTS)}")
    p.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data",
                   help="folder holding tinyshakespeare/input.txt")
    p.add_argument("--nanogpt", type=Path, default=ROOT.parent / "shared" / "peers" / "nanogpt",
                   help="an unmodified nanoGPT checkout (copied to benchmarks/.peers/ to run)")
    p.add_argument("--iters", type=int, default=None, help="training iterations (default "
                   "2000, --quick 200)")
    p.add_argument("--pairs", type=int, default=2, help="nanoGPT/attnlab run pairs")
    args = p.parse_args(argv)
    parts = [s.strip() for s in args.only.split(",") if s.strip()]
    bad = [s for s in parts if s not in PARTS]
    if bad:
        p.error(f"--only: unknown part {bad[0]!r}; choose from {', '.join(PARTS)}")
    args.parts = parts
    args.quick = args.quick or args.smoke
    if args.iters is None:
        args.iters = 20 if args.smoke else 200 if args.quick else 2000
    args.step_warmup, args.step_rounds, args.step_steps = (
        (1, 1, 1) if args.smoke else (2, 2, 5) if args.quick else (5, 4, 20))
    args.sample_tokens, args.sample_repeat = (
        (4, 1) if args.smoke else (64, 1) if args.quick else (128, 3))
    return args


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"CPU: {cpu_name()}, {os.cpu_count()} CPUs; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; {'--quick' if args.quick else 'full'} run; "
          f"load average at the start {load}", flush=True)
    rows = []
    for part in args.parts:
        t0 = time.perf_counter()
        try:
            rows += FUNCTIONS[part](args)
        except Exception as exc:  # one failing peer must not hide the others' rows
            rows.append(skipped(part, f"failed: {type(exc).__name__}: {exc}"))
        print(f"  {part}: {time.perf_counter() - t0:.0f} s", flush=True)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"\nCPU: {cpu_name()}; load average at the end {load}\n")
    print(table(rows))
    return rows


if __name__ == "__main__":
    main()

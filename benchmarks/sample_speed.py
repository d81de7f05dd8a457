"""Sampling speed: attnlab's KV-cache decoding vs full recomputation, and vs Hugging Face.

    python benchmarks/sample_speed.py                 # the figures in benchmarks/README.md
    python benchmarks/sample_speed.py --quick         # a smaller, faster run
    python benchmarks/sample_speed.py --layers 4 --d-model 192 --heads 4 --vocab 65 \
        --max-len 256 --skip-cache --no-bf16 --ffn gelu  # configs/shakespeare_char's shape
    python benchmarks/sample_speed.py --only roofline --layers 12 --d-model 768 --heads 12 \
        --quality-run runs/lm --quality-text input.txt   # GPT-2 small; quality on a trained run

(a) greedy tokens/s of ``attnlab.decoding.generate`` with the KV cache and with full
    recomputation at every step (``use_cache=False``), at 256 and 1024 new tokens, batch 1;
(b) a ``transformers.GPT2LMHeadModel`` with the same configuration and the same weights
    (``attnlab.interop.gpt2_to_hf``): HF ``generate`` (greedy, its default dynamic KV cache)
    against attnlab greedy, batch 1 and batch 8, fp32; attnlab as loaded and after
    ``inference_layout`` (column-major weights); bf16 weights reported separately;
(c) the roofline, batch 1: a step reads every weight once, so tokens/s cannot exceed the
    memory bandwidth over the bytes read per token (weights, plus the KV cache at the mean
    context). The bandwidth is measured here, one thread, just before each row (it drifts
    with the machine's load): ``dst.copy_(src)`` of a 256 MiB buffer (far larger than the
    caches), counting bytes read + bytes written per second (STREAM's "copy" convention);
    ``src.sum()`` (read only) is printed beside it. Issue 13 defined the roofline with half
    this bandwidth (the bytes copied); both shares are printed. attnlab in
    every inference dtype (``attnlab.decoding.to_inference_dtype``: fp32 with
    ``inference_layout``, bf16, fp16, int8) against its own roofline, HF ``generate`` in the
    same dtype where HF has one (fp32, bf16, fp16), and the share of greedy tokens equal to
    fp32's (random weights: a weak test; see (d));
(d) with ``--quality-run RUN --quality-text FILE`` (a trained decoder-only run dir and a
    text whose last 10% is held out, e.g. Tiny Shakespeare's input.txt): val loss and
    exact-token agreement of greedy continuations with fp32, per dtype, for attnlab and for
    HF GPT-2 holding the same weights (``gpt2_to_hf``, then the same cast).

All figures come from this one run on this machine; each rate of (b)-(c) is the median of
``--repeat`` interleaved rounds, each ratio the median (and range) of the per-round ratios;
(a) times one run of each mode (full recomputation of 1024 tokens takes minutes). The model is
GPT-2 shaped (pre-norm, learned positions, tanh-GELU unless ``--ffn``, tied embeddings,
vocabulary 50257 by default) with random weights: speed does not depend on the values.
"""

from __future__ import annotations

import argparse
import copy
import logging
import statistics
import time
from pathlib import Path

import torch

from attnlab import DecoderLM, ModelConfig
from attnlab.decoding import generate, inference_layout, layout_pays


def gpt2_like(layers: int, d_model: int, heads: int, max_len: int, vocab: int = 50257,
              seed: int = 0, ffn: str = "gelu_tanh") -> DecoderLM:
    torch.manual_seed(seed)
    cfg = ModelConfig(family="decoder", vocab_size=vocab, d_model=d_model, n_heads=heads,
                      n_layers=layers, max_len=max_len, dropout=0.0, norm="pre",
                      ffn=ffn, pos="learned", scale_embeddings=False, final_norm=True,
                      pad_id=None)
    return DecoderLM(cfg).eval()


def timed(fn) -> tuple[float, object]:
    """Seconds of one call, and its result."""
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def interleaved(fns: dict, repeat: int) -> dict[str, tuple[list[float], object]]:
    """Time several functions in turns (A B C A B C ...), so load drifts hit all alike.
    Returns each function's seconds per round and its last result."""
    results: dict[str, list[float]] = {k: [] for k in fns}
    outs = {k: f() for k, f in fns.items()}  # warm-up
    for _ in range(repeat):
        for k, f in fns.items():
            start = time.perf_counter()
            outs[k] = f()
            results[k].append(time.perf_counter() - start)
    return {k: (v, outs[k]) for k, v in results.items()}


def speedup(times: dict, ours: str, ref: str = "hf") -> str:
    """Median over rounds of ref's time / ours's time in the same round (adjacent in time, so a
    change of machine load mostly cancels), with its range."""
    r = sorted(a / b for a, b in zip(times[ref][0], times[ours][0]))
    return f"{statistics.median(r):.2f}x ({r[0]:.2f}-{r[-1]:.2f})"


def rates(times: dict, tokens: int) -> dict[str, float]:
    """Tokens/s from each function's median round."""
    return {k: tokens / statistics.median(v) for k, (v, _) in times.items()}


def hf_greedy(hf, prompt: torch.Tensor, n: int):
    def run():
        with torch.inference_mode():
            out = hf.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                              max_new_tokens=n, min_new_tokens=n, pad_token_id=0)
        return out[:, prompt.size(1):].tolist()
    return run


def ours_greedy(model, prompt: torch.Tensor, n: int, use_cache: bool = True):
    return lambda: generate(model, prompt, n, temperature=0, use_cache=use_cache)


def section_cache(model, args) -> None:
    print("\n(a) KV cache vs full recomputation: greedy, batch 1, prompt "
          f"{args.prompt_len} tokens\n")
    print("| new tokens | KV cache tok/s | full recompute tok/s | speed-up | same tokens |")
    print("|---:|---:|---:|---:|:---:|")
    prompt = torch.randint(0, args.vocab, (1, args.prompt_len),
                           generator=torch.Generator().manual_seed(1))
    generate(model, prompt, 8, temperature=0)  # warm-up
    for n in args.cache_tokens:
        t_cache, a = timed(ours_greedy(model, prompt, n))
        t_full, b = timed(ours_greedy(model, prompt, n, use_cache=False))
        print(f"| {n} | {n / t_cache:.1f} | {n / t_full:.1f} | {t_full / t_cache:.1f}x | "
              f"{'yes' if a == b else 'NO'} |", flush=True)


def section_hf(model, args) -> None:
    from attnlab.interop import gpt2_to_hf

    logging.getLogger("transformers").setLevel(logging.ERROR)
    hf = gpt2_to_hf(model)
    fast = inference_layout(copy.deepcopy(model))
    n = args.hf_tokens
    print(f"\n(b) Hugging Face GPT2LMHeadModel.generate vs attnlab greedy, same weights, "
          f"{n} new tokens, prompt {args.prompt_len} tokens, fp32\n")
    print("| batch | HF tok/s | attnlab tok/s | ratio | attnlab + inference_layout tok/s "
          "| ratio | same tokens as HF | `attnlab sample` takes (layout_pays) |")
    print("|---:|---:|---:|---:|---:|---:|:---:|:---:|")
    for batch in args.batches:
        prompt = torch.randint(0, args.vocab, (batch, args.prompt_len),
                               generator=torch.Generator().manual_seed(batch))
        res = interleaved({"hf": hf_greedy(hf, prompt, n), "ours": ours_greedy(model, prompt, n),
                           "fast": ours_greedy(fast, prompt, n)}, args.repeat)
        rate = rates(res, batch * n)
        same = res["hf"][1] == res["ours"][1] == res["fast"][1]
        takes = "inference_layout" if layout_pays(model, batch) else "as loaded"
        print(f"| {batch} | {rate['hf']:.1f} | {rate['ours']:.1f} | {speedup(res, 'ours')} | "
              f"{rate['fast']:.1f} | {speedup(res, 'fast')} | {'yes' if same else 'NO'} | "
              f"{takes} |", flush=True)
    if args.bf16:
        print("\nbf16 weights (reported separately: not comparable with fp32)\n")
        print("| batch | HF bf16 tok/s | attnlab bf16 tok/s | ratio |")
        print("|---:|---:|---:|---:|")
        hf16, ours16 = hf.to(torch.bfloat16), copy.deepcopy(model).to(torch.bfloat16)
        for batch in args.batches:
            prompt = torch.randint(0, args.vocab, (batch, args.prompt_len),
                                   generator=torch.Generator().manual_seed(batch))
            res = interleaved({"hf": hf_greedy(hf16, prompt, n),
                               "ours": ours_greedy(ours16, prompt, n)}, args.repeat)
            rate = rates(res, batch * n)
            print(f"| {batch} | {rate['hf']:.1f} | {rate['ours']:.1f} | "
                  f"{speedup(res, 'ours')} |", flush=True)


BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "int8": 1}  # bytes per linear-layer weight


def bandwidth(mib: int = 256, repeat: int = 5) -> tuple[float, float]:
    """(copy, read) memory bandwidth in bytes/s of this thread, best of ``repeat``: copy =
    (bytes read + bytes written) / s of ``dst.copy_(src)``, read = bytes / s of ``src.sum()``,
    over a buffer far larger than the caches."""
    src = torch.randn(mib * 2**18)  # mib MiB of fp32
    dst = torch.empty_like(src)
    dst.copy_(src)
    copy = min(timed(lambda: dst.copy_(src))[0] for _ in range(repeat))
    read = min(timed(src.sum)[0] for _ in range(repeat))
    return 2 * src.nbytes / copy, src.nbytes / read


def bytes_per_token(model, dtype: str, context: float) -> float:
    """Bytes one batch-1 decoding step reads: every linear weight (in ``dtype``), the norms
    and biases, one row of each embedding table (a tied head is counted as the linear it
    also is), and the KV cache at ``context`` positions (fp32, bf16 in the bf16 mode)."""
    from attnlab.nn import LearnedPositions

    act = 2 if dtype == "bf16" else 4
    total = 0.0
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            total += module.weight.numel() * BYTES[dtype]
            total += 0 if module.bias is None else module.bias.numel() * act
        elif isinstance(module, (torch.nn.Embedding, LearnedPositions)):  # one row a step
            total += model.config.d_model * act
        elif not list(module.children()):  # norms
            total += sum(p.numel() for p in module.parameters(recurse=False)) * act
    cfg = model.config
    return total + 2 * cfg.n_layers * context * cfg.d_model * act


def in_dtype(model, dtype: str):
    """A copy of ``model`` converted for decoding in ``dtype`` (fp32: ``inference_layout``)."""
    from attnlab.decoding import to_inference_dtype

    if dtype == "fp32":
        return inference_layout(copy.deepcopy(model))
    return to_inference_dtype(copy.deepcopy(model), dtype)


def hf_in_dtype(hf, dtype: str):
    """HF's model in ``dtype`` (a cast: HF has no int8 path for GPT-2 on CPU)."""
    if dtype == "int8":
        return None
    return copy.deepcopy(hf).to({"fp32": torch.float32, "bf16": torch.bfloat16,
                                 "fp16": torch.float16}[dtype])


def agreement(a: list[list[int]], b: list[list[int]]) -> float:
    """Share of positions where two greedy continuations hold the same token."""
    pairs = [(x, y) for r, s in zip(a, b) for x, y in zip(r, s)]
    return sum(x == y for x, y in pairs) / max(1, len(pairs))


def section_roofline(model, args) -> None:
    from attnlab.interop import gpt2_to_hf

    logging.getLogger("transformers").setLevel(logging.ERROR)
    n, plen = args.hf_tokens, args.prompt_len
    print(f"\n(c) Roofline, batch 1, greedy, {n} new tokens after a {plen}-token prompt. "
          "Bandwidth of one thread, measured just before each row (this VM's swings by a "
          "third between runs): copy (read + write) and read; roofline = copy bandwidth / bytes "
          "per token; issue 13's roofline = half the copy bandwidth (the bytes copied) / bytes "
          "per token, not a bound where reading alone runs at the copy figure\n")
    print("| dtype | MB/token | copy, read GB/s | roofline tok/s | attnlab tok/s | % of roofline "
          "| % of issue 13's roofline | HF tok/s | attnlab / HF | greedy = fp32 (attnlab, HF) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    hf = gpt2_to_hf(model)
    prompt = torch.randint(0, args.vocab, (1, plen), generator=torch.Generator().manual_seed(1))
    ref = {}
    for dtype in args.dtypes:
        fns = {"ours": ours_greedy(in_dtype(model, dtype), prompt, n)}
        hf_d = hf_in_dtype(hf, dtype)
        if hf_d is not None:
            fns["hf"] = hf_greedy(hf_d, prompt, n)
        copy_bw, read_bw = bandwidth(args.bandwidth_mib)
        res = interleaved(fns, args.repeat)
        rate = rates(res, n)
        ref.setdefault("ours", res["ours"][1])
        ref.setdefault("hf", res.get("hf", (None, None))[1])
        mb = bytes_per_token(model, dtype, plen + n / 2) / 1e6
        roof = copy_bw / (mb * 1e6)
        same = f"{agreement(ref['ours'], res['ours'][1]):.0%}"
        hf_cells = "- | -"
        if "hf" in res:
            hf_cells = f"{rate['hf']:.1f} | {speedup(res, 'ours')}"
            same += f", {agreement(ref['hf'], res['hf'][1]):.0%}"
        print(f"| {dtype} | {mb:.1f} | {copy_bw / 1e9:.1f}, {read_bw / 1e9:.1f} | {roof:.1f} | "
              f"{rate['ours']:.1f} | "
              f"{100 * rate['ours'] / roof:.0f}% | {200 * rate['ours'] / roof:.0f}% | "
              f"{hf_cells} | {same} |", flush=True)


def val_loss(model, ids: torch.Tensor, block: int, windows: int) -> tuple[float, torch.Tensor]:
    """Mean next-token loss over the first ``windows`` non-overlapping windows of ``ids``, and
    the model's top-1 prediction at every position (teacher-forced)."""
    import torch.nn.functional as F

    total, count, top1 = 0.0, 0, []
    with torch.inference_mode():
        for start in range(0, min(windows * block, ids.numel() - block), block):
            x = ids[start:start + block].unsqueeze(0)  # (1, T)
            y = ids[start + 1:start + 1 + block].unsqueeze(0)
            out = model(x)
            logits = out[0] if isinstance(out, tuple) else out.logits  # attnlab / HF: (1, T, V)
            total += F.cross_entropy(logits.float().flatten(0, 1), y.flatten(),
                                     reduction="sum").item()
            count += y.numel()
            top1.append(logits.argmax(-1).flatten())
    return total / count, torch.cat(top1)


def section_quality(args) -> None:
    from attnlab.interop import gpt2_to_hf
    from attnlab.runs import load_run

    logging.getLogger("transformers").setLevel(logging.ERROR)
    run = load_run(args.quality_run)
    text = Path(args.quality_text).read_text(encoding="utf-8")
    val = torch.tensor(run.tokenizer.encode(text[int(0.9 * len(text)):]), dtype=torch.long)
    block = run.model.config.max_len
    # prompts from held-out text; prompt + continuation fit in the positions HF's GPT-2 has
    plen = min(32, block // 4)
    n = min(args.quality_tokens, block - plen)
    gen = torch.Generator().manual_seed(0)
    starts = torch.randint(0, val.numel() - plen, (args.quality_prompts,), generator=gen)
    prompts = [val[s:s + plen].tolist() for s in starts]
    print(f"\n(d) Quality, trained run {args.quality_run} "
          f"({sum(p.numel() for p in run.model.parameters()) / 1e6:.2f}M parameters): val loss "
          f"over {args.quality_windows} windows of {block} held-out tokens and the share of "
          "top-1 predictions there equal to fp32's; greedy "
          f"agreement with fp32 over {len(prompts)} prompts of {plen} tokens x {n} new tokens\n")
    print("| dtype | attnlab val loss | top-1 = fp32 | greedy = fp32 | HF val loss "
          "| HF top-1 = fp32 | HF greedy = fp32 |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    try:
        hf = gpt2_to_hf(run.model)
    except (ValueError, ImportError) as exc:
        hf = None
        print(f"(no HF column: {exc})")
    ref = {}
    for dtype in args.dtypes:
        ours = in_dtype(run.model, dtype)
        cells = []
        for name, m in (("ours", ours), ("hf", hf_in_dtype(hf, dtype) if hf else None)):
            if m is None:
                cells += ["-", "-", "-"]
                continue
            if name == "ours":
                out = generate(m, prompts, n, temperature=0)
            else:
                with torch.inference_mode():
                    ids = torch.tensor(prompts)
                    out = m.generate(ids, attention_mask=torch.ones_like(ids),
                                     do_sample=False, max_new_tokens=n, min_new_tokens=n,
                                     pad_token_id=0)[:, ids.size(1):].tolist()
            loss, top1 = val_loss(m, val, block, args.quality_windows)
            ref.setdefault(name, (out, top1))
            same = (top1 == ref[name][1]).float().mean().item()
            cells += [f"{loss:.4f}", f"{same:.2%}", f"{agreement(ref[name][0], out):.1%}"]
        print(f"| {dtype} | " + " | ".join(cells) + " |", flush=True)


SECTIONS = ("cache", "hf", "roofline", "quality")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--d-model", type=int, default=384)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--max-len", type=int, default=1280)
    p.add_argument("--ffn", default="gelu_tanh", choices=["gelu_tanh", "gelu", "relu"],
                   help="the feed-forward activation (GPT-2's tanh GELU by default; the "
                   "shipped recipes train the exact one, 'gelu'); HF's model gets the same")
    p.add_argument("--vocab", type=int, default=50257,
                   help="vocabulary size (65 = the Tiny Shakespeare char recipes)")
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--cache-tokens", type=int, nargs="+", default=[256, 1024])
    p.add_argument("--hf-tokens", type=int, default=128)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (default 1: on a shared 2-core machine a second thread "
                   "makes batch-1 decoding several times slower for both libraries)")
    p.add_argument("--no-bf16", dest="bf16", action="store_false")
    p.add_argument("--skip-cache", action="store_true", help="leave out section (a)")
    p.add_argument("--only", default=None,
                   help=f"comma-separated sections to run, from {', '.join(SECTIONS)} "
                   "(default: cache, hf, roofline; quality when --quality-run is given)")
    p.add_argument("--dtypes", nargs="+", default=["fp32", "bf16", "fp16", "int8"],
                   help="inference dtypes of sections (c) and (d); fp32 is always run first, "
                   "the reference of their '= fp32' columns")
    p.add_argument("--quality-run", default=None, help="a trained decoder-only run dir")
    p.add_argument("--quality-text", default=None, help="its text; the last 10%% is held out")
    p.add_argument("--quality-windows", type=int, default=100)
    p.add_argument("--quality-prompts", type=int, default=16)
    p.add_argument("--quality-tokens", type=int, default=100)
    p.add_argument("--bandwidth-mib", type=int, default=256,
                   help="buffer size of the bandwidth measurement (default 256 MiB)")
    p.add_argument("--quick", action="store_true", help="64/128 tokens, 1 repeat")
    args = p.parse_args(argv)
    args.dtypes = ["fp32", *dict.fromkeys(d for d in args.dtypes if d != "fp32")]
    if args.quick:
        args.cache_tokens, args.hf_tokens, args.repeat = [64, 128], 32, 1
    sections = (args.only.split(",") if args.only else
                ["hf", "roofline"] + ([] if args.skip_cache else ["cache"])
                + (["quality"] if args.quality_run else []))
    bad = [s for s in sections if s not in SECTIONS]
    if bad:
        p.error(f"--only: unknown section {bad[0]!r}; choose from {', '.join(SECTIONS)}")
    if "quality" in sections and not (args.quality_run and args.quality_text):
        p.error("section quality needs --quality-run RUN_DIR and --quality-text FILE")
    torch.set_num_threads(args.threads)
    model = gpt2_like(args.layers, args.d_model, args.heads, args.max_len, args.vocab,
                      ffn=args.ffn)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {args.layers} layers, d_model {args.d_model}, {args.heads} heads, "
          f"vocab {args.vocab}, max_len {args.max_len}, {args.ffn} feed-forward, "
          f"{n_params / 1e6:.1f}M parameters; torch "
          f"{torch.__version__}, {torch.get_num_threads()} threads")
    if "cache" in sections:
        section_cache(model, args)
    if "hf" in sections:
        section_hf(model, args)
    if "roofline" in sections:
        section_roofline(model, args)
    if "quality" in sections:
        section_quality(args)


if __name__ == "__main__":
    main()

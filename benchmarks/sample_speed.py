"""Sampling speed: attnlab's KV-cache decoding vs full recomputation, and vs Hugging Face.

    python benchmarks/sample_speed.py                 # the figures in benchmarks/README.md
    python benchmarks/sample_speed.py --quick         # a smaller, faster run
    python benchmarks/sample_speed.py --layers 4 --d-model 192 --heads 4 --vocab 65 \
        --max-len 256 --skip-cache --no-bf16         # configs/shakespeare_char's shape

(a) greedy tokens/s of ``attnlab.decoding.generate`` with the KV cache and with full
    recomputation at every step (``use_cache=False``), at 256 and 1024 new tokens, batch 1;
(b) a ``transformers.GPT2LMHeadModel`` with the same configuration and the same weights
    (``attnlab.interop.gpt2_to_hf``): HF ``generate`` (greedy, its default dynamic KV cache)
    against attnlab greedy, batch 1 and batch 8, fp32; attnlab as loaded and after
    ``inference_layout`` (column-major weights); bf16 weights reported separately.

All figures come from this one run on this machine; each rate is the median of ``--repeat``
interleaved rounds, each ratio the median (and range) of the per-round ratios. The model is
GPT-2 shaped (pre-norm, learned positions, tanh-GELU, tied embeddings, vocabulary 50257 by
default) with random weights: speed does not depend on the values.
"""

from __future__ import annotations

import argparse
import copy
import logging
import statistics
import time

import torch

from attnlab import DecoderLM, ModelConfig
from attnlab.decoding import generate, inference_layout


def gpt2_like(layers: int, d_model: int, heads: int, max_len: int, vocab: int = 50257,
              seed: int = 0) -> DecoderLM:
    torch.manual_seed(seed)
    cfg = ModelConfig(family="decoder", vocab_size=vocab, d_model=d_model, n_heads=heads,
                      n_layers=layers, max_len=max_len, dropout=0.0, norm="pre",
                      ffn="gelu_tanh", pos="learned", scale_embeddings=False, final_norm=True,
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
          "| ratio | same tokens as HF |")
    print("|---:|---:|---:|---:|---:|---:|:---:|")
    for batch in args.batches:
        prompt = torch.randint(0, args.vocab, (batch, args.prompt_len),
                               generator=torch.Generator().manual_seed(batch))
        res = interleaved({"hf": hf_greedy(hf, prompt, n), "ours": ours_greedy(model, prompt, n),
                           "fast": ours_greedy(fast, prompt, n)}, args.repeat)
        rate = rates(res, batch * n)
        same = res["hf"][1] == res["ours"][1] == res["fast"][1]
        print(f"| {batch} | {rate['hf']:.1f} | {rate['ours']:.1f} | {speedup(res, 'ours')} | "
              f"{rate['fast']:.1f} | {speedup(res, 'fast')} | {'yes' if same else 'NO'} |",
              flush=True)
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--d-model", type=int, default=384)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--max-len", type=int, default=1280)
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
    p.add_argument("--skip-cache", action="store_true", help="only section (b)")
    p.add_argument("--quick", action="store_true", help="64/128 tokens, 1 repeat")
    args = p.parse_args()
    if args.quick:
        args.cache_tokens, args.hf_tokens, args.repeat = [64, 128], 32, 1
    torch.set_num_threads(args.threads)
    model = gpt2_like(args.layers, args.d_model, args.heads, args.max_len, args.vocab)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {args.layers} layers, d_model {args.d_model}, {args.heads} heads, "
          f"vocab {args.vocab}, max_len {args.max_len}, {n_params / 1e6:.1f}M parameters; torch "
          f"{torch.__version__}, {torch.get_num_threads()} threads")
    if not args.skip_cache:
        section_cache(model, args)
    section_hf(model, args)


if __name__ == "__main__":
    main()

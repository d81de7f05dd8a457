"""Beam search vs greedy translation speed (sentences/s) and BLEU on Multi30k validation.

    python benchmarks/beam_speed.py RUN_DIR           # a trained multi30k run (attnlab train)
    python benchmarks/beam_speed.py                   # no run: a tiny random model (plumbing)

Translates ``val.de`` (1,014 sentences) with ``attnlab.decoding.translate_texts``, which
encodes as in training, sorts sentences by length into batches, and decodes with the
decoder's KV cache: greedy, then beam search (``--beam``, default 4; the cache is reordered by
beam each step and finished sentences leave the batch). Prints sentences/s and, for a trained
run, corpus BLEU against ``val.en`` (sacrebleu). Both figures come from this one run.

Without RUN_DIR the model is a small randomly initialised encoder-decoder with a BPE
vocabulary trained on Multi30k train: it mostly repeats one token and never emits the end
token, so every sentence runs to the length limit (1.5 x source + 10 tokens) - a worst case
for speed - and BLEU is not reported.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from attnlab import ModelConfig, Transformer
from attnlab.data import default_cache_dir, read_lines, read_parallel
from attnlab.decoding import inference_layout, translate_texts
from attnlab.runs import Run, load_run

DATA = default_cache_dir() / "multi30k"  # where `attnlab data fetch multi30k` puts it


def random_run(data: Path, d_model: int, layers: int) -> Run:
    """A random encoder-decoder with a joint BPE vocabulary, as a Run (nothing on disk)."""
    from attnlab.tokenizers import BPETokenizer

    texts = read_lines(data / "train.de") + read_lines(data / "train.en")
    tok = BPETokenizer.train(texts, 8000, "whitespace")
    torch.manual_seed(0)
    cfg = ModelConfig(family="encoder_decoder", vocab_size=tok.vocab_size, d_model=d_model,
                      n_heads=4, n_layers=layers, max_len=128, dropout=0.0, norm="pre",
                      share_embeddings=True, pad_id=tok.pad_id)
    model = Transformer(cfg).eval()
    config = {"model": cfg.to_dict(), "data": {"name": "multi30k"}, "train": {}}
    return Run(model, config, tok, Path(tempfile.gettempdir()), Path("random"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("run_dir", nargs="?", help="a trained multi30k run dir (default: random)")
    p.add_argument("--data", type=Path, default=DATA,
                   help="folder with val.de / val.en (default: attnlab's data cache, which "
                   "`attnlab data fetch multi30k` fills)")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--length-penalty", type=float, default=0.6)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--limit", type=int, default=0, help="first N sentences only (0 = all)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--d-model", type=int, default=128, help="random model width")
    p.add_argument("--layers", type=int, default=2, help="random model depth")
    args = p.parse_args()
    if not (args.data / "val.de").is_file():
        p.error(f"no {args.data / 'val.de'}: fetch Multi30k with `attnlab data fetch multi30k`, "
                "or give --data DIR, a folder holding {train,val}.{de,en}")
    torch.set_num_threads(args.threads)
    run = load_run(args.run_dir) if args.run_dir else random_run(args.data, args.d_model,
                                                                 args.layers)
    inference_layout(run.model)
    pairs = read_parallel(args.data / "val.de", args.data / "val.en")  # skips empty lines
    src, ref = [s for s, _ in pairs], [t for _, t in pairs]
    if args.limit:
        src, ref = src[:args.limit], ref[:args.limit]
    n_params = sum(p.numel() for p in run.model.parameters())
    print(f"model: {args.run_dir or 'random (untrained)'}, {n_params / 1e6:.1f}M parameters; "
          f"{len(src)} sentences; batch {args.batch_size}; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads\n")
    print("| decoding | sentences/s | seconds | mean output words | BLEU |")
    print("|---|---:|---:|---:|---:|")
    for beam in (1, args.beam):
        start = time.perf_counter()
        hyps = translate_texts(run.model, src, run.tokenizer,
                               add_special=bool(run.data.get("src_add_special", False)),
                               beam=beam, length_penalty=args.length_penalty,
                               batch_size=args.batch_size)
        seconds = time.perf_counter() - start
        words = sum(len(h.split()) for h in hyps) / len(hyps)
        score = "n/a"
        if args.run_dir:
            from attnlab.metrics import bleu

            score = f"{bleu(hyps, ref):.2f}"
        name = "greedy" if beam == 1 else f"beam {beam} (alpha {args.length_penalty})"
        print(f"| {name} | {len(src) / seconds:.1f} | {seconds:.1f} | {words:.1f} | {score} |",
              flush=True)


if __name__ == "__main__":
    main()

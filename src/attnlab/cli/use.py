"""``attnlab sample | translate | classify``: use a trained run dir.

Results go to stdout (sampled text is streamed as it is produced); bad input is one line on
stderr with exit code 2, checked before a model is loaded (see :mod:`attnlab.cli.common`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path

from ..errors import DataError, DataFileNotFoundError, RunError, UsageError, VocabularyError
from ..info import FAMILY_WORDS

FAMILY_NAMES = {f: f"{words} (family {f!r})" for f, words in FAMILY_WORDS.items()}


def _add_run_args(p: argparse.ArgumentParser) -> None:
    """The arguments every command that uses a run dir takes: the run, its checkpoint, the
    device."""
    p.add_argument("run_dir", help="a training run dir (the --out of `attnlab train`)")
    p.add_argument("--checkpoint", default="best",
                   help="'best' (default; falls back to 'last'), 'last', or a .safetensors file")
    p.add_argument("--device", default="auto",
                   help="auto (default: CUDA, else MPS, else cpu), cpu, cuda, ...")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``sample``, ``translate`` and ``classify`` to the ``attnlab`` parser."""
    p = subparsers.add_parser("sample", help="continue a prompt with a decoder-only LM run",
                              description="Sample text from a trained decoder-only run. One "
                              "prompt: the text is streamed to stdout as it is generated; several "
                              "(--prompt repeated, --prompt-file, or both): they are sampled "
                              "together in one batch and each continuation is printed under a "
                              "'--- prompt N ---' line.")
    _add_run_args(p)
    p.add_argument("--prompt", action="append", default=[],
                   help="the text to continue (repeatable: several prompts are sampled together "
                   "in one batch)")
    p.add_argument("--prompt-file", default=None, metavar="FILE",
                   help="a text file of prompts, one per line (blank lines skipped)")
    p.add_argument("--max-new-tokens", type=int, default=200, help="default 200")
    p.add_argument("--temperature", type=float, default=1.0,
                   help="0 = greedy, 1 = the model's distribution (default 1.0)")
    p.add_argument("--top-k", type=int, default=None, help="sample among the k likeliest tokens")
    p.add_argument("--top-p", type=float, default=None, help="nucleus sampling, in (0, 1]")
    p.add_argument("--seed", type=int, default=None, help="seed: the same seed gives the same text")
    p.add_argument("--num-samples", type=int, default=1, help="samples to draw (default 1)")
    p.add_argument("--stop", action="append", default=[],
                   help="stop a sample at this string (repeatable)")
    p.add_argument("--dtype", default="fp32", metavar="fp32|bf16|fp16|int8",
                   help="weights for decoding (default fp32). bf16: every weight cast to "
                   "bfloat16; fp16 / int8 (CPU): linear layers in float16 or int8 with "
                   "FBGEMM's kernels, fewer bytes per token, slightly different logits (int8: "
                   "also by batch, each call's inputs rounded with one scale)")
    p.set_defaults(func=cmd_sample)

    p = subparsers.add_parser("translate", help="translate sentences with an encoder-decoder run",
                              description="Translate one sentence per line (from --input or "
                              "stdin) in batches; prints one translation per line.")
    _add_run_args(p)
    p.add_argument("--beam", type=int, default=1, help="beam size; 1 = greedy (default)")
    p.add_argument("--length-penalty", type=float, default=0.6,
                   help="GNMT length-penalty alpha for beam search (default 0.6)")
    p.add_argument("--max-len", type=int, default=None,
                   help="most target tokens per sentence, the end token included (default: "
                   "1.5 x the source's tokens + 10, at most the model's max_len)")
    _add_input_args(p, "sentence")
    p.set_defaults(func=cmd_translate)

    p = subparsers.add_parser("classify", help="classify texts with an encoder classifier run",
                              description="Classify one text per line (from --input or stdin); "
                              "prints label<TAB>probability<TAB>text, one line per input line (a "
                              "blank line gives an empty one).")
    _add_run_args(p)
    _add_input_args(p, "text")
    p.set_defaults(func=cmd_classify)


def _add_input_args(p: argparse.ArgumentParser, item: str) -> None:
    """--batch-size and --input of the commands that read one ``item`` per line."""
    p.add_argument("--batch-size", type=int, default=64, help=f"{item}s per batch (default 64)")
    p.add_argument("--input", default=None,
                   help=f"a text file or pipe, one {item} per line; a blank line gives "
                   "an empty output line (default, or -: stdin)")


def _load(args: argparse.Namespace, family: str):
    """The run of ``args.run_dir`` on ``--device``, refused (before its weights are read) when
    its model is not of ``family`` or it has no tokenizer."""
    from ..devices import resolve_device
    from ..runs import RunDir, load_run

    device = str(resolve_device(args.device, flag="--device"))
    # Check the family before loading weights, so a wrong run fails fast and says why.
    cfg = RunDir(args.run_dir).model_config()
    if cfg.family != family:
        raise UsageError(f"`attnlab {args.command}` needs {FAMILY_NAMES[family]} run, but "
                         f"{args.run_dir} holds {FAMILY_NAMES[cfg.family]} model")
    if cfg.head == "mlm":
        raise UsageError(f"`attnlab {args.command}` needs {FAMILY_NAMES[family]} run, but "
                         f"{args.run_dir} holds a masked language model (model.head='mlm'); "
                         f"fine-tune it into a classifier first: attnlab train RECIPE "
                         f"--init-from {args.run_dir}")
    run = load_run(args.run_dir, args.checkpoint, device=device)
    if run.tokenizer is None:
        raise RunError(f"run dir {args.run_dir} has no "
                       f"{RunDir(args.run_dir).tokenizer_file.name}: cannot turn text into ids")
    return run


def _fast_layout(model, rows: int) -> None:
    """On CPU, store the weights in the layout that makes decoding steps of ``rows`` token rows
    faster, where measured so on this machine (:func:`attnlab.decoding.inference_layout`,
    :func:`attnlab.decoding.layout_pays`; same outputs)."""
    from ..decoding import inference_layout, layout_pays

    if next(model.parameters()).device.type == "cpu" and layout_pays(model, rows):
        inference_layout(model)


def _read_lines(path: str | None) -> list[str]:
    """The lines of ``path``: a file, a pipe (``/dev/stdin``, ``<(cmd)``), or stdin for None/-."""
    if path is None or path == "-":
        if not hasattr(sys.stdin, "buffer"):  # a text stream put in its place (tests, notebooks)
            return sys.stdin.read().splitlines()
        data, name = sys.stdin.buffer.read(), "standard input"
    else:
        file = Path(path)
        if not file.exists():
            raise DataFileNotFoundError(f"input file {path} does not exist")
        if file.is_dir():
            raise DataError(f"input {path} is a folder: give a text file, one item per line")
        with open(file, "rb") as f:  # open(): pipes have no size to read ahead
            data, name = f.read(), f"input file {path}"
    try:
        return data.decode("utf-8").splitlines()
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise DataError(f"{name} is not UTF-8 text: line {line} ({e.reason})") from None


def _print_aligned(lines: list[str], batch_size: int, run_batch) -> None:
    """Print one output line per input line, a batch at a time as it finishes: ``run_batch``
    maps a list of non-blank lines to their output lines; a blank input line prints an empty
    line, so the output stays aligned with the input (``paste`` works)."""
    todo = [i for i, line in enumerate(lines) if line.strip()]
    results = [""] * len(lines)
    printed = 0
    for start in range(0, len(todo), batch_size):
        chunk = todo[start:start + batch_size]
        for i, out in zip(chunk, run_batch([lines[i] for i in chunk])):
            results[i] = out
        for i in range(printed, chunk[-1] + 1):
            print(results[i], flush=True)
        printed = chunk[-1] + 1
    for i in range(printed, len(lines)):
        print(results[i], flush=True)


def cmd_sample(args: argparse.Namespace) -> int:
    """Continue each prompt with a decoder-only run: one prompt is streamed as it is sampled,
    several are sampled together in one batch. Every argument is checked before the model
    is loaded."""
    from ..decoding.quant import check_inference_dtype
    from ..devices import resolve_device

    _check_sample_args(args)
    prompts = _prompts(args)
    check_inference_dtype(args.dtype, resolve_device(args.device, flag="--device"), "--dtype")
    run = _load(args, "decoder")
    _check_prompts_encode(run, prompts)
    _check_stops_encode(run, args.stop)
    texts = [p for p, _ in prompts]
    _decoding_weights(run.model, args, 1 if len(texts) == 1 else len(texts) * args.num_samples)
    gen = None
    if args.seed is not None:  # one generator for all samples: the same seed, the same text
        import torch

        gen = torch.Generator(device=next(run.model.parameters()).device).manual_seed(args.seed)
    if len(texts) > 1:
        return _sample_batch(run, texts, args, gen)
    return _stream_samples(run, texts[0], args, gen)


def _check_sample_args(args: argparse.Namespace) -> None:
    """Refuse sampling settings out of range (:class:`attnlab.decoding.Sampler` checks the
    temperature and top-p) and empty stop strings."""
    from ..decoding import Sampler

    if args.max_new_tokens < 0:
        raise UsageError(f"--max-new-tokens {args.max_new_tokens} is not allowed: >= 0")
    if args.num_samples < 1:
        raise UsageError(f"--num-samples {args.num_samples} is not allowed: >= 1")
    if args.seed is not None and not 0 <= args.seed < 2**63:  # as train.seed
        raise UsageError(f"--seed {args.seed} is not allowed: an integer in 0..2**63-1")
    if args.top_k is not None and args.top_k < 1:
        raise UsageError(f"--top-k {args.top_k} is not allowed: >= 1 (leave it out to sample "
                         "from every token)")
    Sampler(args.temperature, args.top_k, args.top_p)
    if any(not s for s in args.stop):
        raise UsageError('--stop "" is empty: a stop string needs at least one character')


def _prompts(args: argparse.Namespace) -> list[tuple[str, str]]:
    """Each prompt of ``--prompt`` and ``--prompt-file`` with where it came from, for the
    messages about it."""
    prompts = [(p, f"--prompt {p!r}") for p in args.prompt]
    if args.prompt_file is not None:
        prompts += [(line, f"line {i + 1} of --prompt-file {args.prompt_file}")
                    for i, line in enumerate(_read_lines(args.prompt_file)) if line.strip()]
        if not prompts:
            raise UsageError(f"--prompt-file {args.prompt_file} has no prompt: give one per line")
    if not prompts:
        raise UsageError("no prompt: give the text to continue with --prompt (repeatable) or "
                         "--prompt-file")
    if not all(p for p, _ in prompts):
        raise UsageError("a prompt is empty: give some text to continue with --prompt")
    return prompts


def _check_prompts_encode(run, prompts: list[tuple[str, str]]) -> None:
    """Refuse, before any output, a prompt the run's tokenizer cannot encode or reads as no
    token at all; the message says which prompt. One warning when some prompts are longer
    than the model's positions: sampling continues from their last tokens
    (:class:`~attnlab.decoding.lm.ContextWindow`)."""
    from ..data.batching import warn_if_cut
    from ..decoding.lm import window_keep

    lengths = []
    for prompt, where in prompts:
        try:
            ids = run.tokenizer.encode(prompt)
        except VocabularyError as e:
            raise VocabularyError(f"{where}: {e}") from None
        if not ids:
            raise DataError(f"{where} is no token for this run's tokenizer (it drops "
                            "whitespace): give some text to continue")
        lengths.append(len(ids))
    max_len = run.model.config.max_len
    warn_if_cut(lengths, max_len, "prompts", last=window_keep(max_len))


def _check_stops_encode(run, stops: list[str]) -> None:
    """Refuse a ``--stop`` string of characters the run's tokenizer has no token for: the
    model can never write it, so the sample would run on past where it was meant to end."""
    tok = run.tokenizer
    for stop in stops:
        try:
            ids = tok.encode(stop)
        except VocabularyError as e:
            raise VocabularyError(f"--stop {stop!r} can never be sampled: {e}") from None
        if tok.unk_id not in (None, tok.eos_id) and tok.unk_id in ids:
            raise VocabularyError(f"--stop {stop!r} can never be sampled: it holds characters "
                                  "this run's tokenizer reads as <unk>; allowed: text of the "
                                  "training data's characters")


def _decoding_weights(model, args: argparse.Namespace, rows: int) -> None:
    """``--dtype``: fp32 in the layout fastest for ``rows`` rows per step, or the weights cast
    to the reduced precision asked for."""
    from ..decoding.quant import to_inference_dtype

    if args.dtype == "fp32":  # the column-major layout helps fp32 only
        _fast_layout(model, rows)
    else:
        to_inference_dtype(model, args.dtype)


def _stream_samples(run, prompt: str, args: argparse.Namespace, gen) -> int:
    """One prompt: each sample written to stdout piece by piece as it is decoded."""
    from ..decoding import stream_text

    out = sys.stdout
    for i in range(args.num_samples):
        if args.num_samples > 1:
            out.write(f"--- sample {i + 1} ---\n")
        out.write(prompt)
        out.flush()
        pieces: Iterator[str] = stream_text(
            run.model, run.tokenizer, prompt, args.max_new_tokens,
            temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, generator=gen,
            stop=args.stop)
        for piece in pieces:
            out.write(piece)
            out.flush()
        out.write("\n")
        out.flush()
    return 0


def _sample_batch(run, prompts: list[str], args: argparse.Namespace, gen) -> int:
    """Several prompts: sampled together in one left-padded batch, printed prompt by prompt."""
    from ..decoding import generate_text

    texts = generate_text(run.model, run.tokenizer, prompts, args.max_new_tokens,
                          temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                          generator=gen, stop=args.stop, num_samples=args.num_samples)
    for i, text in enumerate(texts):  # prompt-major: each prompt's samples together
        p, k = divmod(i, args.num_samples)
        label = f"prompt {p + 1}" + (f", sample {k + 1}" if args.num_samples > 1 else "")
        print(f"--- {label} ---\n{prompts[p]}{text}", flush=True)
    return 0


def cmd_translate(args: argparse.Namespace) -> int:
    """Translate one sentence per line of ``--input`` (or stdin), a batch at a time; one
    output line per input line."""
    from ..decoding import translate_texts
    from ..decoding.translate import check_beam_flags

    check_beam_flags(args.beam, args.length_penalty)
    if args.batch_size < 1:
        raise UsageError(f"--batch-size {args.batch_size} is not allowed: >= 1")
    if args.max_len is not None and args.max_len < 1:
        raise UsageError(f"--max-len {args.max_len} is not allowed: >= 1 (the most target tokens "
                         "per sentence; leave it out for 1.5 x the source's + 10)")
    run = _load(args, "encoder_decoder")
    cfg = run.model.config
    check_beam_flags(args.beam, args.length_penalty, cfg.tgt_vocab_size or cfg.vocab_size)
    cap = cfg.max_len
    if args.max_len is not None and args.max_len > cap:  # before any decoding work
        raise UsageError(f"--max-len {args.max_len} is not allowed: 1..{cap} (the model's target "
                         "positions, its max_len)")
    lines = _read_lines(args.input)
    if not any(line.strip() for line in lines):  # as classify: likely a forgotten pipe
        raise UsageError("no sentence to translate: give one sentence per line")
    _fast_layout(run.model, min(args.batch_size, max(1, len(lines))) * args.beam)
    add_special = bool(run.data.get("src_add_special", False))
    _print_aligned(lines, args.batch_size, lambda texts: translate_texts(
        run.model, texts, run.tokenizer, add_special=add_special, beam=args.beam,
        length_penalty=args.length_penalty, max_len=args.max_len, batch_size=args.batch_size))
    return 0


def cmd_classify(args: argparse.Namespace) -> int:
    """Classify one text per line of ``--input`` (or stdin): ``label<TAB>probability<TAB>text``
    per line."""
    from ..decoding import classify_texts

    if args.batch_size < 1:
        raise UsageError(f"--batch-size {args.batch_size} is not allowed: >= 1")
    from ..runs import RunDir

    why = RunDir(args.run_dir).untrained_head(args.checkpoint)
    if why:
        raise RunError(why)
    run = _load(args, "encoder")
    lines = [line.strip() for line in _read_lines(args.input)]
    if not any(lines):
        raise UsageError("no text to classify: give one text per line")

    def run_batch(texts: list[str]) -> list[str]:
        results = classify_texts(run.model, run.tokenizer, texts, label_names=run.label_names,
                                 max_len=run.data.get("max_len"), batch_size=args.batch_size)
        return [f"{label}\t{prob:.4f}\t{text}" for text, (label, prob) in zip(texts, results)]

    _print_aligned(lines, args.batch_size, run_batch)
    return 0

"""Generation with a decoder-only LM: KV-cache decoding, sampling, stop conditions, streaming.

Shapes: B rows (prompts x samples), P padded prompt length, V vocab.

* :func:`generate` returns the new token ids of every row; :func:`stream` yields them step by
  step as they are produced; :func:`generate_text` / :func:`stream_text` work on strings.
* Several prompts run as one batch, LEFT-padded: ``mask`` marks the real tokens and each row's
  positions are ``cumsum(mask) - 1`` (clamped at 0; with the KV cache, the cache derives them
  from each row's padding, ``KVCache.pad``), so a row gives the same tokens as the
  prompt alone (greedy; sampled rows draw from one shared generator, so they differ). Not
  under int8 weights (``decoding.quant``): each call rounds its input with one scale for all
  rows and positions, so a row's rounding depends on the batch, and on the cache.
* Decoding runs the prompt once (the "prefill", logits of the last position only) and then
  feeds one token per step, reusing the keys/values of earlier positions from a preallocated
  :class:`~attnlab.nn.attention.KVCache`. ``use_cache=False`` recomputes the whole context at
  every step instead (same tokens; slower; the benchmark's baseline).
* Context window: the model has positions ``0..max_len-1``. When a row's next forward would
  need more than ``max_len`` positions, its window slides: only its last
  ``keep = max_len - max(1, max_len // 4)`` tokens (prompt and generated) are kept, the cache
  is emptied, and the batch's windows are recomputed at positions from 0 (each row's from its
  own start, the columns before it masked like padding); decoding then goes on with the cache.
  Each row slides when it would alone, so a batched row still gives the tokens of its prompt
  alone. A prompt longer than ``max_len`` is cut to its last ``keep`` tokens the same way. The
  recomputation costs one prefill per ``max_len - keep`` new tokens; ``use_cache=False``
  follows the same window schedule, so both modes give the same tokens.
* Stopping: a row stops at ``eos_id`` (not included in its output) or once its generated text
  contains one of the ``stop`` strings (the token that completes it is included in the ids;
  the text functions cut the text before the stop string). Generation ends when every row
  has stopped or after ``max_new_tokens``. Checking ``eos_id`` costs one host sync per step;
  without ``eos_id`` and ``stop`` the loop never waits for the device.
"""

from __future__ import annotations

import logging
import numbers
from collections.abc import Iterator, Sequence
from contextlib import closing, nullcontext
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from ..config import check_int
from ..data.batching import pad
from ..nn.attention import padded_positions
from .sampling import Sampler, make_generator
from .speed import decoding_kernels, direct_attributes
from .stream import StopChecker, TextStream, cut_at_stop, decode_after

if TYPE_CHECKING:
    from ..tokenizers import Tokenizer

log = logging.getLogger(__name__)

FINISHED = -1  # the token :func:`stream` reports for a row that has already stopped


def window_keep(max_len: int) -> int:
    """Columns kept when the context window slides (see the module docstring)."""
    return max(1, max_len - max(1, max_len // 4))


def _prompt_list(prompts) -> list[list[int]]:
    """One prompt (ids or a 1-D tensor) or several (lists or a 2-D tensor) -> list of lists."""
    if isinstance(prompts, Tensor):
        if prompts.dim() not in (1, 2):
            raise ValueError(f"prompt tensor must be (T,) or (B, T), got {tuple(prompts.shape)}")
        prompts = prompts.tolist()
    prompts = list(prompts)
    if not prompts:
        raise ValueError("no prompt given: pass the token ids of at least one prompt")
    if all(isinstance(p, numbers.Integral) for p in prompts):
        prompts = [prompts]
    out = []
    for i, p in enumerate(prompts):
        ids = p.tolist() if isinstance(p, Tensor) else list(p)
        if not ids:
            raise ValueError(f"prompt {i} is empty: give at least one token (e.g. a bos token)")
        if not all(isinstance(t, numbers.Integral) for t in ids):
            raise ValueError(f"prompt {i} must be a sequence of integer token ids")
        out.append([int(t) for t in ids])
    return out


def _token_steps(model: nn.Module, ids: Tensor, lengths: list[int], max_new_tokens: int,
                 sampler: Sampler, generator: torch.Generator | None,
                 use_cache: bool) -> Iterator[Tensor]:
    """Yield the next token (B,) of every row, ``max_new_tokens`` times (no stop checks).

    ids (B, P) left-padded prompts of ``lengths`` real tokens. Each row keeps its own window:
    ``first[b]`` is the column where row b's context starts (its padding ends, or where it
    last slid), so a row slides when and as it would alone; the batch's window is the columns
    from the earliest ``first`` on, the columns before a row's ``first`` masked as padding.
    """
    b, p = ids.shape
    max_len = model.config.max_len
    keep = window_keep(max_len)
    # Columns of the prompt and the tokens so far; past max_len + 1 new tokens the buffer is
    # reused (the window moved to its front), so memory does not grow with max_new_tokens.
    size = p + min(max_new_tokens, max_len + 1)
    tokens = torch.zeros(b, size, dtype=torch.long, device=ids.device)
    tokens[:, :p] = ids
    columns = torch.arange(size, device=ids.device)
    first = [p - n for n in lengths]  # host-side: no sync to know each row's window
    start, end, cached = min(first), p, 0  # the window is [start, end); `cached` in the cache
    cache = model.new_cache(b, min(max_len, p + max_new_tokens)) if use_cache else None
    kernels = {}  # decoding_kernels of steps of one row (True) and of more (False)
    moved, pad = True, None  # (a host-to-device copy of `first` only when it changes)
    with direct_attributes(model):  # (until the steps end or the generator is closed)
        for _ in range(max_new_tokens):
            if end - start > max_len:  # some row's next forward would need too many positions:
                first = [end - keep if end - f > max_len else f for f in first]  # keep, recompute
                start, cached, moved = min(first), 0, True
            if moved:
                padded, moved = any(f != start for f in first), False
                pad = torch.tensor(first, device=ids.device) - start if padded else None  # (B,)
            window = columns[start:end] >= pad[:, None] + start if padded else None  # (B, W)
            if cached == 0 and cache is not None:  # (re)start: the cache derives positions
                cache.length, cache.pad = 0, pad
            if cached == 0 or cache is None:
                feed = tokens[:, start:end]
            else:
                feed = tokens[:, end - 1:end]  # (B, 1): the token sampled last step
            # Without a cache, padded rows need explicit positions (with one, the cache has them).
            positions = (padded_positions(0, end - start, pad, ids.device)
                         if padded and cache is None else None)
            one_row = feed.numel() == 1
            if one_row not in kernels:
                kernels[one_row] = decoding_kernels(model, 1 if one_row else None)
            with kernels[one_row]():
                logits, _ = model(feed, mask=window, positions=positions, cache=cache,
                                  last_only=True)  # (B, 1, V)
            nxt = sampler(logits[:, -1], generator)  # (B,)
            if end == size:  # full: move the window [start, end) to the front of the buffer
                tokens[:, :end - start] = tokens[:, start:end].clone()
                first, start, end = [f - start for f in first], 0, end - start
            tokens[:, end] = nxt
            cached, end = end - start, end + 1
            yield nxt


def stream(model: nn.Module, prompts, max_new_tokens: int = 100, *, temperature: float = 1.0,
           top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
           generator: torch.Generator | None = None, eos_id: int | None = None,
           stop: Sequence[str] = (), tokenizer: Tokenizer | None = None, num_samples: int = 1,
           use_cache: bool = True) -> Iterator[Tensor]:
    """Generate step by step: yield a (B,) tensor of new token ids per step, as produced.

    Rows are ``prompt 0 sample 0, prompt 0 sample 1, ..., prompt 1 sample 0, ...``. A row that
    has stopped (eos or a stop string) reports :data:`FINISHED` (-1); the eos token itself is
    reported as -1 too. Stops early when every row has stopped. Arguments as in
    :func:`generate`.
    """
    prompt_ids = _prompt_list(prompts)
    # a tokenizer decodes the ids: only those it has may be drawn
    sampler = Sampler(temperature, top_k, top_p, None if tokenizer is None else
                      tokenizer.vocab_size)
    check_int("max_new_tokens", max_new_tokens, 0)
    check_int("num_samples", num_samples, 1)
    if not hasattr(model, "new_cache") or getattr(model.config, "family", None) != "decoder":
        raise ValueError("generate needs a decoder-only model (family='decoder', DecoderLM)")
    vocab = model.config.vocab_size
    if eos_id is not None:
        check_int("eos_id", eos_id, 0, vocab - 1)
    bad = [t for p in prompt_ids for t in p if not 0 <= t < vocab]
    if bad:
        raise ValueError(f"prompt token ids {bad[:5]} are outside the vocabulary 0..{vocab - 1}")
    rows = [p for p in prompt_ids for _ in range(num_samples)]
    checker = StopChecker(stop, tokenizer, len(rows), rows) if stop else None
    if model.training:
        log.warning("generate: the model is in training mode (dropout on); call model.eval()")
    gen = make_generator(seed, generator, next(model.parameters()).device)
    return _stream_rows(model, rows, max_new_tokens, sampler, gen, eos_id, checker, use_cache)


def _stream_rows(model: nn.Module, rows: list[list[int]], max_new_tokens: int, sampler: Sampler,
                 gen: torch.Generator | None, eos_id: int | None, checker: StopChecker | None,
                 use_cache: bool) -> Iterator[Tensor]:
    device = next(model.parameters()).device
    with torch.inference_mode():
        ids, mask = pad(rows, 0, left=True)  # (B, P) each
        ids, mask = ids.to(device), mask.to(device)
        done = torch.zeros(len(rows), dtype=torch.bool, device=device)
    steps = _token_steps(model, ids, [len(r) for r in rows], max_new_tokens, sampler, gen,
                         use_cache)
    watch = eos_id is not None or checker is not None
    # Each step runs in inference mode, but not the consumer's code between steps; a caller
    # already in inference mode (`generate`) saves entering it again at every step.
    step_mode = nullcontext if torch.is_inference_mode_enabled() else torch.inference_mode
    # The steps are closed explicitly (their direct_attributes end) when this generator is:
    # on Python 3.12 (3.12.3), close() of a generator paused outside any try/with marks it done
    # and its locals (the steps) live on until it is freed.
    try:
        while True:
            with step_mode():
                nxt = next(steps, None)
                if nxt is None:
                    return
                if eos_id is not None:
                    is_eos = nxt == eos_id
                    out = nxt.masked_fill(done | is_eos, FINISHED)
                    done = done | is_eos
                else:
                    out = nxt.masked_fill(done, FINISHED) if checker is not None else nxt
                if checker is not None:
                    done = done | torch.tensor(checker.update(out.tolist()), device=device)
                if watch:  # one host sync per step: has every row stopped?
                    all_done, none_new = torch.stack([done.all(), (out < 0).all()]).tolist()
            if not (watch and none_new):
                yield out
            if watch and all_done:
                return
    finally:
        steps.close()


def generate(model: nn.Module, prompts, max_new_tokens: int = 100, *,
             temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
             seed: int | None = None, generator: torch.Generator | None = None,
             eos_id: int | None = None, stop: Sequence[str] = (),
             tokenizer: Tokenizer | None = None, num_samples: int = 1,
             use_cache: bool = True) -> list[list[int]]:
    """Continue each prompt with up to ``max_new_tokens`` new tokens.

    Args:
        model: a :class:`~attnlab.models.DecoderLM` in eval mode. On CPU, decoding is often
            faster after :func:`~.speed.inference_layout` (1.5x for a GPT-2-sized vocabulary
            at batch 1), which the caller applies where :func:`~.speed.layout_pays`
            (``attnlab.runs.load_run`` returns the layout training saved).
        prompts (list[int] | list[list[int]] | Tensor): one prompt (a list of ids or a (T,)
            tensor) or several (a list of lists or a (B, T) tensor); prompts may have
            different lengths (they are left-padded).
        temperature: 0 = greedy (argmax); > 0 samples from softmax(logits / temperature).
        top_k: sample among the k most likely tokens only. top_p: nucleus, in (0, 1].
        seed: a seed for a new ``torch.Generator`` on the model's device (same seed -> same
            tokens); neither ``seed`` nor ``generator`` = torch's global RNG.
        generator: a generator to draw from.
        eos_id: a row stops at this token (left out of the output).
        stop: strings that end a row once its generated text contains one (needs
            ``tokenizer`` to decode).
        tokenizer: decodes the tokens for ``stop``; only ids below its ``vocab_size`` are
            drawn (a model may have more embedding rows than tokens).
        num_samples: samples per prompt.
        use_cache: KV-cache decoding (default) or full recomputation at every step.

    Returns:
        The new ids of each row (``len(prompts) * num_samples`` lists, prompt-major).
    """
    with torch.inference_mode():
        steps = list(stream(model, prompts, max_new_tokens, temperature=temperature,
                            top_k=top_k, top_p=top_p, seed=seed, generator=generator,
                            eos_id=eos_id, stop=stop, tokenizer=tokenizer,
                            num_samples=num_samples, use_cache=use_cache))
    n_rows = len(_prompt_list(prompts)) * num_samples
    if not steps:
        return [[] for _ in range(n_rows)]
    table = torch.stack(steps, dim=1).tolist()  # (B, steps), one transfer
    return [[t for t in row if t != FINISHED] for row in table]


def _encode_prompts(tokenizer: Tokenizer, prompts: str | Sequence[str]) -> list[list[int]]:
    texts = [prompts] if isinstance(prompts, str) else list(prompts)
    if not texts:
        raise ValueError("no prompt given")
    for i, text in enumerate(texts):
        if not text:
            raise ValueError(f"prompt {i} is empty: give some text to continue" if len(texts) > 1
                             else "the prompt is empty: give some text to continue")
    return [tokenizer.encode(t) for t in texts]


def generate_text(model: nn.Module, tokenizer: Tokenizer, prompts: str | Sequence[str],
                  max_new_tokens: int = 100, *, stop: Sequence[str] = (),
                  stop_at_eos: bool = True, **kwargs) -> list[str]:
    """:func:`generate` on text: the continuation of each prompt (``num_samples`` per prompt),
    cut before the first stop string; stops at the tokenizer's eos unless ``stop_at_eos`` is
    False. Other keyword arguments as in :func:`generate`."""
    eos = tokenizer.eos_id if stop_at_eos else None
    prompt_ids = _encode_prompts(tokenizer, prompts)
    out = generate(model, prompt_ids, max_new_tokens, eos_id=eos, stop=stop, tokenizer=tokenizer,
                   **kwargs)
    per_prompt = len(out) // len(prompt_ids)  # (num_samples rows each, prompt-major)
    return [cut_at_stop(decode_after(tokenizer, prompt_ids[i // per_prompt], ids), stop)
            for i, ids in enumerate(out)]


def stream_text(model: nn.Module, tokenizer: Tokenizer, prompt: str, max_new_tokens: int = 100, *,
                stop: Sequence[str] = (), stop_at_eos: bool = True, **kwargs) -> Iterator[str]:
    """Yield the continuation of one prompt as text pieces, as soon as they are decodable.

    Text that could be the start of a stop string is held back until it is clear; nothing
    from the first stop string on is yielded. Keyword arguments as in :func:`generate`
    (``num_samples`` must be 1).
    """
    if kwargs.get("num_samples", 1) != 1:
        raise ValueError("stream_text streams one sample; call it once per sample")
    if not isinstance(prompt, str):
        raise TypeError(f"stream_text streams one prompt, a string, got {type(prompt).__name__}"
                        "; for several prompts use generate_text")
    eos = tokenizer.eos_id if stop_at_eos else None
    prompt_ids = _encode_prompts(tokenizer, prompt)
    text = TextStream(tokenizer, stop, prompt_ids[0])
    with closing(stream(model, prompt_ids, max_new_tokens, eos_id=eos, stop=stop,
                        tokenizer=tokenizer, **kwargs)) as steps:  # closed with this one
        for step in steps:
            token = int(step[0])
            if token != FINISHED:
                piece = text.push(token)
                if piece:
                    yield piece
            if text.stopped:
                return
    rest = text.flush()
    if rest:
        yield rest


__all__ = [
    "FINISHED",
    "generate",
    "generate_text",
    "stream",
    "stream_text",
    "window_keep",
]

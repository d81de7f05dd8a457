"""Generation with a decoder-only LM: KV-cache decoding, sampling, stop conditions, streaming.

Shapes: B rows (prompts x samples), P padded prompt length, W window width, V vocab.

Prompts run as one left-padded batch in which each row gives the tokens of its prompt alone
(greedy). The prompt is run once (the prefill), then one token per step with a
:class:`~attnlab.nn.KVCache`; :class:`ContextWindow` says what each step feeds, also once the
model's positions run out.
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
from ..nn import padded_positions
from ..speed import cpu_sdpa_in, decoding_kernels, direct_attributes
from .sampling import Sampler, make_generator
from .stream import StopChecker, TextStream, cut_at_stop, decode_after

if TYPE_CHECKING:
    from ..tokenizers import Tokenizer

log = logging.getLogger(__name__)

FINISHED = -1  # the token :func:`stream` reports for a row that has already stopped


def window_keep(max_len: int) -> int:
    """Tokens a row keeps when its :class:`ContextWindow` slides: about three quarters of
    ``max_len``, so the window is computed again once per quarter of ``max_len`` new tokens."""
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


class ContextWindow:
    """The columns of a left-padded batch that the next forward sees, sliding per row.

    The model has positions ``0..max_len-1``. When a row's next forward would need more, its
    window slides: only its last :func:`window_keep` tokens (prompt and generated) stay, and
    the batch's windows are computed again from position 0, since every kept token has a new
    position (with a KV cache: the caller restarts it when :attr:`whole`). Each row slides
    when it would alone, so a batched row gives the tokens of its prompt alone; a prompt
    longer than ``max_len`` is cut the same way. Decoding without a cache follows the same
    schedule, so both give the same tokens.

    Args:
        ids: (B, P) left-padded prompts.
        lengths: the real tokens of each row.
        max_len: the model's positions.
        max_new_tokens: the most tokens :meth:`append` will be given.
        use_cache: whether the model keeps the keys/values of the columns it has seen (then
            one token is fed per step), or recomputes the window at every step.

    Attributes:
        tokens: (B, C) the prompts and the tokens so far; the window is its columns
            ``[start, end)``, W wide.
        first: the column where each row's context starts (its padding ends, or where it
            last slid); the window's columns before it are masked like padding.
        pad: (B,) those columns of each row, ``first - start``, or None when there are none.
        whole: whether the next forward feeds the whole window (the first one, after a
            slide, and every one without a cache), or only the token appended last.
    """

    def __init__(self, ids: Tensor, lengths: list[int], *, max_len: int, max_new_tokens: int,
                 use_cache: bool):
        b, p = ids.shape
        self.max_len, self.keep, self.use_cache = max_len, window_keep(max_len), use_cache
        # Past max_len + 1 new tokens the buffer is reused (the window moves to its front), so
        # memory does not grow with max_new_tokens.
        self.tokens = torch.zeros(b, p + min(max_new_tokens, max_len + 1), dtype=torch.long,
                                  device=ids.device)  # (B, C)
        self.tokens[:, :p] = ids
        self.columns = torch.arange(self.tokens.size(1), device=ids.device)  # (C,)
        self.first = [p - n for n in lengths]  # on the host: no sync to know a row's window
        self.start, self.end = min(self.first), p
        self.whole = True
        self.pad = self._padding()

    def _padding(self) -> Tensor | None:
        """Columns of each row's window before its context (B,); made only when ``first``
        changes (a tensor from host data waits for the device)."""
        if all(f == self.start for f in self.first):
            return None
        return torch.tensor(self.first, device=self.tokens.device) - self.start  # (B,)

    def slide(self) -> None:
        """Slide the rows whose next forward would need more than ``max_len`` positions."""
        if self.end - self.start <= self.max_len:
            return
        self.first = [self.end - self.keep if self.end - f > self.max_len else f
                      for f in self.first]
        self.start, self.whole = min(self.first), True
        self.pad = self._padding()

    def inputs(self) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """The next forward's ids, mask and positions.

        Returns:
            ids (B, W) when :attr:`whole`, else (B, 1): the token appended last; mask (B, W),
            True at each row's context, or None without padding; positions (B, W) of padded
            rows without a cache, else None (a cache derives them from ``pad``).
        """
        width = self.end - self.start
        mask = None if self.pad is None else self.columns[:width] >= self.pad[:, None]  # (B, W)
        if not self.whole:
            return self.tokens[:, self.end - 1:self.end], mask, None
        positions = (padded_positions(0, width, self.pad, self.tokens.device)
                     if self.pad is not None and not self.use_cache else None)
        return self.tokens[:, self.start:self.end], mask, positions

    def append(self, nxt: Tensor) -> None:
        """Add the next token of every row (B,), which the model has not seen yet."""
        if self.end == self.tokens.size(1):  # full: move the window to the buffer's front
            width = self.end - self.start
            self.tokens[:, :width] = self.tokens[:, self.start:self.end].clone()
            self.first = [f - self.start for f in self.first]  # (``pad`` stays the same)
            self.start, self.end = 0, width
        self.tokens[:, self.end] = nxt
        self.end += 1
        self.whole = not self.use_cache  # (with a cache, the model has seen the rest)


def _token_steps(model: nn.Module, ids: Tensor, lengths: list[int], max_new_tokens: int,
                 sampler: Sampler, generator: torch.Generator | None,
                 use_cache: bool) -> Iterator[Tensor]:
    """Yield the next token (B,) of every row, ``max_new_tokens`` times (no stop checks).

    ids (B, P) left-padded prompts of ``lengths`` real tokens. The speed contexts
    (:func:`~attnlab.speed.direct_attributes`, :func:`~attnlab.speed.cpu_sdpa_in`) hold until
    the steps end or the generator is closed.
    """
    max_len = model.config.max_len
    window = ContextWindow(ids, lengths, max_len=max_len, max_new_tokens=max_new_tokens,
                           use_cache=use_cache)
    p = ids.size(1)
    cache = model.decoder.new_cache(ids.size(0), min(max_len, p + max_new_tokens)) \
        if use_cache else None
    kernels = {}  # decoding_kernels of steps of one token (True) and of more (False)
    with direct_attributes(model), cpu_sdpa_in(model):
        for _ in range(max_new_tokens):
            window.slide()
            if cache is not None and window.whole:
                cache.restart(window.pad)  # the window's keys/values are computed again
            feed, mask, positions = window.inputs()
            one = feed.numel() == 1
            if one not in kernels:
                kernels[one] = decoding_kernels(model, 1 if one else None)
            with kernels[one]():
                logits, _ = model(feed, mask=mask, positions=positions, cache=cache,
                                  last_only=True)  # (B, 1, V)
            nxt = sampler(logits[:, -1], generator)  # (B,)
            window.append(nxt)
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
    if getattr(getattr(model, "config", None), "family", None) != "decoder":
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
    """:func:`stream` after its checks: the steps' tokens, with the rows that have stopped
    reported as :data:`FINISHED`. Watching for ``eos_id`` or stop strings costs one host sync
    per step; without them the loop never waits for the device."""
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
    # Closing this generator closes the steps at once (their speed contexts end): closing a
    # generator paused outside any try/with may leave its locals alive until it is freed.
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
        model: a :class:`~attnlab.models.DecoderLM` in eval mode. On a CPU, decoding may be
            faster after :func:`~attnlab.speed.inference_layout`, which the caller applies
            where :func:`~attnlab.speed.layout_pays` (``attnlab.runs.load_run`` returns the
            layout training saved).
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
            ``tokenizer`` to decode); the token that completes one is kept in the ids.
        tokenizer: decodes the tokens for ``stop``; only ids below its ``vocab_size`` are
            drawn (a model may have more embedding rows than tokens).
        num_samples: samples per prompt.
        use_cache: KV-cache decoding (default) or recomputing the window at every step
            (the same tokens).

    Returns:
        The new ids of each row (``len(prompts) * num_samples`` lists, prompt-major). A
        batched row has the ids of its prompt alone, except under int8 weights (see
        :func:`~attnlab.decoding.quant.to_inference_dtype`); sampled rows draw from one
        generator.
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
    False. Other keyword arguments as in :func:`generate`.

    Examples:
        >>> import torch
        >>> from attnlab import DecoderLM, ModelConfig
        >>> from attnlab.decoding import generate_text
        >>> from attnlab.tokenizers import CharTokenizer
        >>> tok = CharTokenizer.from_text("to be or not to be")
        >>> model = DecoderLM(ModelConfig(family="decoder", vocab_size=tok.vocab_size, d_model=32,
        ...                               n_heads=2, n_layers=2, max_len=32)).eval()
        >>> _ = torch.manual_seed(0)
        >>> texts = generate_text(model, tok, ["to be", "not"], max_new_tokens=10, temperature=0.8)
        >>> [len(t) for t in texts]  # an untrained model: any 10 characters
        [10, 10]
    """
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
    "ContextWindow",
    "generate",
    "generate_text",
    "stream",
    "stream_text",
    "window_keep",
]

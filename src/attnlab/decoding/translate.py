"""Greedy and beam-search decoding for the encoder-decoder :class:`~attnlab.models.Transformer`,
and :func:`translate_texts`, the one way from source sentences to translated text (the CLI and
the translation task's BLEU evaluation both use it).

Shapes: B sentences (b still decoding), K beams, S source len, D d_model, V vocab, N tokens.

The source is encoded once, then the decoder reads one token per step with its
:class:`~attnlab.nn.KVCache`; finished sentences leave the batch, so they cost nothing more.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

import torch
from torch import Tensor, nn

from ..config import check_int
from ..data.batching import check_texts, pad, warn_if_cut
from ..errors import UsageError
from ..nn import valid_tokens
from ..speed import cpu_sdpa_in, decoding_kernels, direct_attributes

if TYPE_CHECKING:
    from ..tokenizers import Tokenizer


def _check_model(model: nn.Module) -> None:
    if getattr(getattr(model, "config", None), "family", None) != "encoder_decoder":
        raise ValueError("translation needs an encoder-decoder model (family='encoder_decoder')")


def _source_batch(src: Tensor | Sequence[Sequence[int]], pad_id: int | None,
                  device: torch.device) -> tuple[Tensor, Tensor | None]:
    """Source ids (B, S) and their mask (True at real tokens): a list of id lists is
    right-padded; a (B, S) tensor is taken as it is (mask ``src != pad_id``, or None without a
    pad id)."""
    if isinstance(src, Tensor):
        if src.dim() != 2:
            raise ValueError(f"source ids must be (B, S), got shape {tuple(src.shape)}")
        src = src.to(device)
        return src, (None if pad_id is None else src != pad_id)
    seqs = [list(s) for s in src]
    if not seqs:
        raise ValueError("no source sentence given")
    for i, s in enumerate(seqs):
        if not s:
            raise ValueError(f"source sentence {i} is empty")
    ids, mask = pad(seqs, pad_id)  # (B, S) each
    return ids.to(device), mask.to(device)


def _limits(model: nn.Module, max_len: int | Sequence[int] | None, b: int) -> list[int]:
    """Most target tokens of each of ``b`` sentences: ``max_len`` (one for all, or one each),
    default the model's ``max_len``."""
    cap = model.config.max_len
    limits = _each(cap if max_len is None else max_len, b)
    if len(limits) != b:
        raise ValueError(f"{len(limits)} max_len values for {b} sentences: give one, or one each")
    for n in limits:
        if not (isinstance(n, int) and 1 <= n <= cap):
            raise ValueError(f"max_len={n} is not allowed: 1..{cap} (the model's target "
                             "positions)")
    return limits


def _each(max_len: int | Sequence[int], b: int) -> list[int]:
    """One limit for each of ``b`` sentences."""
    return [max_len] * b if isinstance(max_len, int) else list(max_len)


def _row_limits(max_len: int | Sequence[int], b: int, device) -> tuple[int, Tensor, set[int]]:
    """The longest limit (the buffers' size), each sentence's (b,) as a tensor, and the set of
    them (the steps at which some sentence runs out of room, known without a device sync)."""
    limits = _each(max_len, b)
    return max(limits), torch.tensor(limits, device=device), set(limits)


@torch.inference_mode()
def greedy_search(model: nn.Module, src: Tensor, src_mask: Tensor | None, *,
                  max_len: int | Sequence[int], bos_id: int, eos_id: int) -> list[list[int]]:
    """The most likely next token at every step.

    Args:
        model: the encoder-decoder, in eval mode.
        src: (B, S) source ids.
        src_mask: (B, S) bool, True at real tokens, or None.
        max_len: most tokens of every sentence, or of each (the end token included).
        bos_id: the target start token.
        eos_id: the target end token.

    Returns:
        B id lists (no bos / eos).
    """
    _check_model(model)
    memory = model.encode(src, src_mask)  # (B, S, D)
    valid = valid_tokens(src, model.config.pad_id, src_mask)
    b, dev = src.size(0), src.device
    n, room, _ = _row_limits(max_len, b, dev)  # (B,) tokens each sentence may take
    cache = model.decoder.new_cache(b, n)
    out = torch.full((b, n), eos_id, dtype=torch.long, device=dev)  # (B, N)
    rows = torch.arange(b, device=dev)  # the original sentence of each live row
    nxt = torch.full((b,), bos_id, dtype=torch.long, device=dev)
    for t in range(n):
        logits = model.decode(nxt[:, None], memory, valid, cache=cache, last_only=True)
        nxt = logits[:, -1].argmax(dim=-1)  # (b,)
        out[rows, t] = nxt
        if t == n - 1:
            break
        live = (nxt != eos_id) & (room[rows] > t + 1)  # (b,) not ended, not out of room
        if not bool(live.all()):  # one sync per step
            if not bool(live.any()):
                break
            keep = live.nonzero().squeeze(1)  # finished sentences leave the batch
            cache.reorder(keep)
            memory, rows, nxt = memory[keep], rows[keep], nxt[keep]
            valid = None if valid is None else valid[keep]
    return _until_eos(out.tolist(), eos_id)


def _until_eos(table: list[list[int]], eos_id: int) -> list[list[int]]:
    return [row[:row.index(eos_id)] if eos_id in row else row for row in table]


def check_beam_flags(beam: int, length_penalty: float | None,
                     vocab_size: int | None = None) -> None:
    """``--beam`` and ``--length-penalty`` of ``attnlab translate`` and ``attnlab eval``,
    refused in one line before any work; with the model's target ``vocab_size``, a beam
    wider than it (more hypotheses than the first step has tokens, and memory for each)."""
    if beam < 1:
        raise UsageError(f"--beam {beam} is not allowed: >= 1 (1 = greedy)")
    if vocab_size is not None and beam > vocab_size:
        raise UsageError(f"--beam {beam} is not allowed: 1..{vocab_size} (1 = greedy; at most "
                         "the model's target vocabulary)")
    if length_penalty is not None and not math.isfinite(length_penalty):
        raise UsageError(f"--length-penalty {length_penalty} is not allowed: a finite number "
                         "(0 = none, 0.6 as in GNMT)")


def length_penalty_of(n: Tensor | int, alpha: float) -> Tensor | float:
    """GNMT length penalty ``((5 + n) / 6) ** alpha`` (Wu et al. 2016, eq. 14), n the tokens of
    a hypothesis, its end token included: a beam's log-probability sum is divided by it, so
    longer hypotheses are not ruled out for having more (negative) terms."""
    return ((5 + n) / 6) ** alpha


class Finished(NamedTuple):
    """The K best hypotheses that have ended, of each live sentence, best first.

    Shape:
        scores (b, K): length-normalised log-probabilities (-inf: none yet); seqs (b, K, N):
        their ids; lens (b, K): their lengths (the end token left out).
    """

    scores: Tensor
    seqs: Tensor
    lens: Tensor

    def add(self, scores: Tensor, seqs: Tensor, lens: Tensor) -> Finished:
        """The K best of these and the (b, M) hypotheses given (-inf scores: none)."""
        k, n = self.scores.size(1), self.seqs.size(-1)
        best, idx = torch.cat([self.scores, scores], 1).topk(k, dim=1)  # (b, K)
        seqs = torch.cat([self.seqs, seqs], 1).gather(1, idx[..., None].expand(-1, -1, n))
        return Finished(best, seqs, torch.cat([self.lens, lens], 1).gather(1, idx))

    def rows(self, keep: Tensor) -> Finished:
        """Those of sentences ``keep`` (b',)."""
        return Finished(self.scores[keep], self.seqs[keep], self.lens[keep])

    def best(self, i: int) -> tuple[list[int], float]:
        """Sentence ``i``'s best hypothesis: its ids and score."""
        return self.seqs[i, 0, :int(self.lens[i, 0])].tolist(), float(self.scores[i, 0])


class Candidates(NamedTuple):
    """The 2K best continuations of each sentence's beams, best first, each (b, 2K)."""

    scores: Tensor  # sums of log-probabilities
    beam: Tensor  # the beam (0..K-1) each continues
    token: Tensor  # its next token
    ends: Tensor  # whether that token is the end token


class BeamSearch:
    """The state of a beam search over a batch, one step at a time.

    As in fairseq (or Hugging Face with ``early_stopping=True``): each step ranks the 2K best
    continuations of a sentence's beams. An end token among the first K ends a hypothesis,
    scored ``sum(log p) / lp`` (:func:`length_penalty_of`); the first K that are not the end
    token are the next beams. A sentence is done once K hypotheses have ended, or at its
    ``max_len``, where its live beams end as they are; its best hypothesis goes to
    :attr:`results` and it leaves the batch. With K = 1 this is exactly greedy decoding.

    The K beams of each live sentence are K rows of the decoder's batch (b*K rows,
    sentence-major); after each step the self-attention cache is reordered by the beam each
    new beam came from.

    It takes the arguments of :func:`beam_search` (all but ``return_scores``).

    Shape:
        scores (b, K): sums of log-probabilities of the live beams; seqs (b*K, N): their
        tokens; next_ids (b*K, 1): the tokens the decoder reads next.
    """

    def __init__(self, model: nn.Module, src: Tensor, src_mask: Tensor | None, *, beam: int,
                 length_penalty: float, max_len: int | Sequence[int], bos_id: int,
                 eos_id: int):
        b, dev = src.size(0), src.device
        self.model, self.k, self.alpha, self.eos_id = model, beam, length_penalty, eos_id
        self.n, self.room, self.ends = _row_limits(max_len, b, dev)  # (B,) tokens each may take
        valid = valid_tokens(src, model.config.pad_id, src_mask)
        self.memory = model.encode(src, valid).repeat_interleave(beam, dim=0)  # (B*K, S, D)
        self.valid = None if valid is None else valid.repeat_interleave(beam, dim=0)  # (B*K, S)
        self.cache = model.decoder.new_cache(b * beam, self.n)
        self.scores = torch.zeros(b, beam, device=dev)
        self.scores[:, 1:] = float("-inf")  # all beams start equal: expand only the first
        self.seqs = torch.zeros(b * beam, self.n, dtype=torch.long, device=dev)
        self.finished = Finished(torch.full((b, beam), float("-inf"), device=dev),
                                 torch.zeros(b, beam, self.n, dtype=torch.long, device=dev),
                                 torch.zeros(b, beam, dtype=torch.long, device=dev))
        self.sents = torch.arange(b, device=dev)  # the original index of each live sentence
        self.rank = torch.arange(2 * beam, device=dev)
        self.next_ids = torch.full((b * beam, 1), bos_id, dtype=torch.long, device=dev)
        self.results: dict[int, tuple[list[int], float]] = {}

    def step(self, t: int) -> bool:
        """Decode token ``t`` of every live beam; True once every sentence is done."""
        logits = self.model.decode(self.next_ids, self.memory, self.valid, cache=self.cache,
                                   last_only=True)[:, -1]  # (b*K, V)
        cand = self.candidates(torch.log_softmax(logits.float(), dim=-1))
        self.end_hypotheses(cand, t)
        from_rows, tokens = self.extend(cand, t)
        done = torch.isfinite(self.finished.scores).all(dim=1)  # K hypotheses have ended
        if t + 1 in self.ends:  # (a set on the host: no sync)
            done = done | self.finish_full(t)
        if bool(done.any()):  # one sync per step
            self.results.update({int(self.sents[i]): self.finished.best(i)
                                 for i in done.nonzero().squeeze(1).tolist()})
            if bool(done.all()):
                return True
            from_rows, tokens = self.drop(done, from_rows, tokens)
        self.cache.reorder_self(from_rows)
        self.next_ids = tokens.reshape(-1, 1)
        return False

    def candidates(self, logp: Tensor) -> Candidates:
        """The best continuations, from the next-token log-probabilities (b*K, V)."""
        v = logp.size(-1)
        cand = (self.scores.reshape(-1, 1) + logp).reshape(-1, self.k * v)  # (b, K*V)
        top, idx = cand.topk(min(2 * self.k, self.k * v), dim=-1)  # (b, 2K), best first
        token = idx % v
        return Candidates(top, idx // v, token, token == self.eos_id)

    def end_hypotheses(self, cand: Candidates, t: int) -> None:
        """The end token among a sentence's first K candidates ends that hypothesis."""
        m = cand.scores.size(1)
        now = cand.ends & (self.rank[:m] < self.k)
        scores = torch.where(now, cand.scores / length_penalty_of(t + 1, self.alpha),
                             torch.full_like(cand.scores, float("-inf")))
        beams = self.seqs.view(-1, self.k, self.n)  # (b, K, N)
        seqs = beams.gather(1, cand.beam[..., None].expand(-1, -1, self.n))  # (b, 2K, N)
        self.finished = self.finished.add(scores, seqs, torch.full_like(cand.token, t))

    def extend(self, cand: Candidates, t: int) -> tuple[Tensor, Tensor]:
        """The next beams: each sentence's first K candidates that are not the end token.

        Returns:
            The row (b*K,) each new beam comes from, and its token (b, K).
        """
        m = cand.scores.size(1)
        order = (cand.ends.long() * m + self.rank[:m]).argsort(dim=-1)[:, :self.k]  # (b, K)
        self.scores, beam = cand.scores.gather(1, order), cand.beam.gather(1, order)
        tokens = cand.token.gather(1, order)
        sents = torch.arange(beam.size(0), device=beam.device)
        from_rows = (sents[:, None] * self.k + beam).reshape(-1)  # (b*K,)
        self.seqs = self.seqs.index_select(0, from_rows)
        self.seqs[:, t] = tokens.reshape(-1)
        return from_rows, tokens

    def finish_full(self, t: int) -> Tensor:
        """The sentences (b,) whose room ends with token ``t``: their live beams end as they
        are."""
        full = self.room[self.sents] == t + 1
        live = torch.where(full[:, None], self.scores / length_penalty_of(t + 1, self.alpha),
                           torch.full_like(self.scores, float("-inf")))
        self.finished = self.finished.add(live, self.seqs.view(-1, self.k, self.n),
                                          torch.full_like(live, t + 1, dtype=torch.long))
        return full

    def drop(self, done: Tensor, from_rows: Tensor, tokens: Tensor) -> tuple[Tensor, Tensor]:
        """Take the sentences that are ``done`` (b,) out of the batch; returns ``from_rows``
        and ``tokens`` of the others (the self-attention cache is reordered by the caller)."""
        keep = (~done).nonzero().squeeze(1)  # (b',) live sentences
        self.sents, self.scores = self.sents[keep], self.scores[keep]
        self.finished = self.finished.rows(keep)
        from_rows = from_rows.view(-1, self.k)[keep].reshape(-1)  # (b'*K,)
        keep_rows = (keep[:, None] * self.k + torch.arange(self.k, device=keep.device)).reshape(-1)
        self.seqs, self.memory = self.seqs[keep_rows], self.memory[keep_rows]
        self.valid = None if self.valid is None else self.valid[keep_rows]
        self.cache.reorder_cross(keep_rows)  # the beams of one sentence share its memory
        return from_rows, tokens[keep]


@torch.inference_mode()
def beam_search(model: nn.Module, src: Tensor, src_mask: Tensor | None, *, beam: int,
                length_penalty: float, max_len: int | Sequence[int], bos_id: int, eos_id: int,
                return_scores: bool = False) -> list[list[int]] | list[tuple[list[int], float]]:
    """Beam search with K = ``beam`` (:class:`BeamSearch` says how it goes).

    Args:
        model: the encoder-decoder, in eval mode.
        src: (B, S) source ids.
        src_mask: (B, S) bool, True at real tokens, or None.
        beam: K, the hypotheses kept per sentence.
        length_penalty: alpha of :func:`length_penalty_of` (0: none).
        max_len: most tokens of every sentence, or of each (the end token included).
        bos_id: the target start token.
        eos_id: the target end token.
        return_scores: also return each hypothesis's length-normalised log-probability.

    Returns:
        B id lists (no bos / eos), or with ``return_scores`` B pairs (ids, score).
    """
    _check_model(model)
    if not math.isfinite(length_penalty):
        raise ValueError(f"length_penalty={length_penalty} must be a finite number (0 = none, "
                         "0.6 as in GNMT)")
    check_int("beam", beam, 1)
    search = BeamSearch(model, src, src_mask, beam=beam, length_penalty=length_penalty,
                        max_len=max_len, bos_id=bos_id, eos_id=eos_id)
    for t in range(search.n):  # the last step ends every sentence still live
        if search.step(t):
            break
    results = search.results
    return [results[i] if return_scores else results[i][0] for i in range(src.size(0))]


def translate(model: nn.Module, src: Tensor | Sequence[Sequence[int]], *, beam: int = 1,
              length_penalty: float = 0.6, max_len: int | Sequence[int] | None = None,
              bos_id: int, eos_id: int, pad_id: int | None = None,
              src_mask: Tensor | None = None) -> list[list[int]]:
    """Translate a batch of source sentences: greedy (``beam=1``) or beam search.

    Args:
        model: a :class:`~attnlab.models.Transformer` in eval mode.
        src: a list of source id lists (any lengths; right-padded here) or a (B, S) tensor.
        beam: K hypotheses per sentence; 1 = greedy (identical to beam search with K = 1).
        length_penalty: alpha of the GNMT length penalty; 0 = raw sum of log-probabilities.
        max_len: most target tokens per sentence, the end token included (one for all, or one
            per sentence); default the model's ``max_len``.
        bos_id: the target start token.
        eos_id: the target end token.
        pad_id: pads the source (default the model config's ``pad_id``).
        src_mask: (B, S) bool, True at real source tokens (default ``src != pad_id``).

    Returns:
        The target ids of each sentence, without bos and eos.
    """
    _check_model(model)
    check_int("beam", beam, 1)
    cfg = model.config
    check_int("bos_id", bos_id, 0, (cfg.tgt_vocab_size or cfg.vocab_size) - 1)
    check_int("eos_id", eos_id, 0, (cfg.tgt_vocab_size or cfg.vocab_size) - 1)
    if pad_id is not None:  # (of the source; default the config's)
        check_int("pad_id", pad_id, 0, cfg.vocab_size - 1)
    pad = cfg.pad_id if pad_id is None else pad_id
    device = next(model.parameters()).device
    ids, mask = _source_batch(src, pad, device)
    mask = src_mask if src_mask is not None else mask
    n = _limits(model, max_len, ids.size(0))
    with decoding_kernels(model)(), direct_attributes(model), cpu_sdpa_in(model):
        if beam == 1:
            return greedy_search(model, ids, mask, max_len=n, bos_id=bos_id, eos_id=eos_id)
        return beam_search(model, ids, mask, beam=beam, length_penalty=length_penalty,
                           max_len=n, bos_id=bos_id, eos_id=eos_id)


def decode_limit(model: nn.Module, src_len: int) -> int:
    """Default most target tokens for sources of up to ``src_len`` tokens:
    ``int(1.5 * src_len) + 10`` (a translation may be longer than its source), at most the
    model's ``max_len``."""
    return min(model.config.max_len, int(1.5 * src_len) + 10)


def translate_texts(model: nn.Module, texts: Sequence[str], src_tokenizer: Tokenizer,
                    tgt_tokenizer: Tokenizer | None = None, *, add_special: bool = False,
                    beam: int = 1, length_penalty: float = 0.6, max_len: int | None = None,
                    batch_size: int = 64) -> list[str]:
    """Translate sentences of text with an encoder-decoder model.

    Sources are encoded as in training (``add_special``: the run's ``data.src_add_special``;
    cut to the model's ``max_len``), sorted by length into batches of ``batch_size`` (so
    little of a batch is padding), translated greedily (``beam=1``) or with beam search and
    decoded.

    Args:
        model: a :class:`~attnlab.models.Transformer` in eval mode.
        texts: the source sentences (leading/trailing whitespace is dropped; none may be empty).
        src_tokenizer: encodes the sources.
        tgt_tokenizer: decodes the targets (default the source tokenizer); it gives the bos
            and eos ids.
        beam: as in :func:`translate`.
        length_penalty: as in :func:`translate`.
        max_len: most target tokens per sentence; default :func:`decode_limit` of each
            source (so a sentence's translation does not depend on its batch; under int8
            weights its activations' rounding does: see
            :func:`~attnlab.decoding.quant.to_inference_dtype`).

    Returns:
        One translation per input sentence, in input order.
    """
    _check_model(model)
    check_texts(texts, "sentences")
    check_int("batch_size", batch_size, 1)
    tgt_tokenizer = src_tokenizer if tgt_tokenizer is None else tgt_tokenizer
    bos, eos = tgt_tokenizer.bos_id, tgt_tokenizer.eos_id
    if bos is None or eos is None:
        raise ValueError("the target tokenizer has no bos/eos tokens: cannot translate")
    cap = model.config.max_len
    ids = []
    for i, text in enumerate(texts):
        if not text.strip():
            raise ValueError(f"sentence {i + 1} is empty")
        ids.append(src_tokenizer.encode(text.strip(), add_special))
    warn_if_cut([len(s) for s in ids], cap, "sentences")
    ids = [s[:cap] for s in ids]
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    out = [""] * len(ids)
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        src = [ids[i] for i in chunk]
        limit = [decode_limit(model, len(s)) for s in src] if max_len is None else max_len
        hyps = translate(model, src, beam=beam, length_penalty=length_penalty, max_len=limit,
                         bos_id=bos, eos_id=eos, pad_id=src_tokenizer.pad_id)
        for i, hyp in zip(chunk, hyps):
            out[i] = tgt_tokenizer.decode(hyp)
    return out


__all__ = ["BeamSearch", "beam_search", "decode_limit", "greedy_search", "length_penalty_of",
           "translate", "translate_texts"]

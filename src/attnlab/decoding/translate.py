"""Greedy and beam-search decoding for the encoder-decoder :class:`~attnlab.models.Transformer`,
and :func:`translate_texts`, the one way from source sentences to translated text (the CLI and
the translation task's BLEU evaluation both use it).

Shapes: B sentences, K beams, S source length, D d_model, V target vocab, N max new tokens.

The source is encoded once; the decoder then runs one token per step with its
:class:`~attnlab.nn.attention.KVCache` (self-attention keys/values of earlier steps, and the
cross-attention keys/values of the memory, computed at the first step). Sentences that have
finished are dropped from the batch (``cache.reorder``), so a batch costs what its unfinished
sentences cost. Beam search keeps K hypotheses per sentence as B*K rows and reorders the cache
by the beam each surviving hypothesis came from.

Beam search (as in fairseq, or Hugging Face with ``early_stopping=True``): at each step the
2K best continuations of a sentence's beams are ranked; an end token among the first K ranks
finishes a hypothesis, scored ``sum(log p) / lp`` with the GNMT length penalty
``lp = ((5 + n) / 6) ** length_penalty`` (Wu et al. 2016, eq. 14; n counts the generated tokens
including the end token); the first K continuations that are not the end token become the next
beams. A sentence is done once K hypotheses have finished; at ``max_len`` the live beams are
finished as they are. The best finished hypothesis wins. With K = 1 this is exactly greedy
decoding: the end token finishes the only beam when it is the argmax, and the argmax is
otherwise the next token.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from ..config import check_int
from ..data.batching import check_texts, pad, warn_if_cut
from .speed import decoding_kernels, direct_attributes

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
    """Most likely next token at every step. src (B, S) -> B lists of ids (no bos / eos);
    ``max_len``: most tokens of every sentence, or of each (the end token included)."""
    _check_model(model)
    memory = model.encode(src, src_mask)  # (B, S, D)
    valid = model.src_valid(src, src_mask)
    b = src.size(0)
    max_len, room, _ = _row_limits(max_len, b, src.device)  # (B,) tokens each may take
    cache = model.new_cache(b, max_len)
    out = torch.full((b, max_len), eos_id, dtype=torch.long, device=src.device)  # (B, N)
    rows = torch.arange(b, device=src.device)  # original sentence of each live row
    cur = torch.full((b, 1), bos_id, dtype=torch.long, device=src.device)
    for step in range(max_len):
        logits = model.decode(cur, memory, valid, cache=cache, last_only=True)  # (b, 1, V)
        nxt = logits[:, -1].argmax(dim=-1)  # (b,)
        out[rows, step] = nxt
        live = (nxt != eos_id) & (room[rows] > step + 1)
        if step == max_len - 1 or not bool(live.all()):  # one sync per step
            if step == max_len - 1 or not bool(live.any()):
                break
            keep = live.nonzero().squeeze(1)  # drop finished sentences from the batch
            cache.reorder(keep)
            memory, rows, nxt = memory[keep], rows[keep], nxt[keep]
            valid = None if valid is None else valid[keep]
        cur = nxt[:, None]
    return _until_eos(out.tolist(), eos_id)


def _until_eos(table: list[list[int]], eos_id: int) -> list[list[int]]:
    return [row[:row.index(eos_id)] if eos_id in row else row for row in table]


def length_penalty_of(n: Tensor | int, alpha: float) -> Tensor | float:
    """GNMT length penalty ((5 + n) / 6) ** alpha (Wu et al. 2016)."""
    return ((5 + n) / 6) ** alpha


@torch.inference_mode()
def beam_search(model: nn.Module, src: Tensor, src_mask: Tensor | None, *, beam: int,
                length_penalty: float, max_len: int | Sequence[int], bos_id: int, eos_id: int,
                return_scores: bool = False) -> list[list[int]] | list[tuple[list[int], float]]:
    """Beam search with K = ``beam`` (see the module docstring). src (B, S) -> B id lists, or
    with ``return_scores`` B pairs (ids, length-normalised log-probability); ``max_len``:
    most tokens of every sentence, or of each (the end token included)."""
    _check_model(model)
    if not math.isfinite(length_penalty):
        raise ValueError(f"length_penalty={length_penalty} must be a finite number (0 = none, "
                         "0.6 as in GNMT)")
    if beam < 1:
        raise ValueError(f"beam={beam} must be >= 1")
    dev = src.device
    n, room, ends = _row_limits(max_len, src.size(0), dev)  # (B,) tokens each sentence may take
    k = beam
    valid = model.src_valid(src, src_mask)
    memory = model.encode(src, valid).repeat_interleave(k, dim=0)  # (B*K, S, D)
    valid = None if valid is None else valid.repeat_interleave(k, dim=0)  # (B*K, S)
    b = src.size(0)
    cache = model.new_cache(b * k, n)
    scores = torch.zeros(b, k, device=dev)  # sum of log-probs of each live beam
    scores[:, 1:] = float("-inf")  # all beams start equal: expand only the first
    seqs = torch.zeros(b * k, n, dtype=torch.long, device=dev)  # (B*K, N) live tokens
    fin_scores = torch.full((b, k), float("-inf"), device=dev)  # best finished, normalised
    fin_seqs = torch.zeros(b, k, n, dtype=torch.long, device=dev)
    fin_lens = torch.zeros(b, k, dtype=torch.long, device=dev)
    sents = torch.arange(b, device=dev)  # original index of each live sentence
    results: dict[int, tuple[list[int], float]] = {}
    rank = torch.arange(2 * k, device=dev)
    cur = torch.full((b * k, 1), bos_id, dtype=torch.long, device=dev)
    for step in range(n):
        logits = model.decode(cur, memory, valid, cache=cache, last_only=True)[:, -1]  # (bK, V)
        logp = torch.log_softmax(logits.float(), dim=-1)
        v = logp.size(-1)
        cand = (scores.reshape(-1, 1) + logp).reshape(b, k * v)  # (b, K*V)
        top, idx = cand.topk(min(2 * k, k * v), dim=-1)  # (b, 2K), best first
        src_beam, tok = idx // v, idx % v
        is_eos = tok == eos_id
        # Hypotheses that end here: the end token ranked among the first K.
        fin_now = is_eos & (rank[: top.size(1)] < k)
        new_scores = torch.where(fin_now, top / length_penalty_of(step + 1, length_penalty),
                                 torch.full_like(top, float("-inf")))
        beams = seqs.view(b, k, n)
        new_seqs = beams.gather(1, src_beam[..., None].expand(-1, -1, n))  # (b, 2K, N)
        fin_scores, fin_seqs, fin_lens = _best_k(
            torch.cat([fin_scores, new_scores], 1), torch.cat([fin_seqs, new_seqs], 1),
            torch.cat([fin_lens, torch.full_like(tok, step)], 1), k)
        # The next beams: the first K continuations that are not the end token.
        order = (is_eos.long() * top.size(1) + rank[: top.size(1)]).argsort(dim=-1)[:, :k]
        scores, src_beam = top.gather(1, order), src_beam.gather(1, order)  # (b, K)
        tok = tok.gather(1, order)
        from_rows = (torch.arange(b, device=dev)[:, None] * k + src_beam).reshape(-1)  # (bK,)
        seqs = seqs.index_select(0, from_rows)
        seqs[:, step] = tok.reshape(-1)
        done = torch.isfinite(fin_scores).all(dim=1)  # K hypotheses finished
        if step + 1 in ends:  # (b,) out of room: the live beams finish as they are
            full = room[sents] == step + 1
            live = torch.where(full[:, None], scores / length_penalty_of(step + 1, length_penalty),
                               torch.full_like(scores, float("-inf")))
            fin_scores, fin_seqs, fin_lens = _best_k(
                torch.cat([fin_scores, live], 1), torch.cat([fin_seqs, seqs.view(b, k, n)], 1),
                torch.cat([fin_lens, torch.full_like(live, step + 1, dtype=torch.long)], 1), k)
            done = done | full
        if bool(done.any()):  # one sync per step
            _collect(results, sents, done, fin_scores, fin_seqs, fin_lens)
            if bool(done.all()):
                break
            keep = (~done).nonzero().squeeze(1)  # (b',) live sentences
            sents, scores = sents[keep], scores[keep]
            fin_scores, fin_seqs, fin_lens = fin_scores[keep], fin_seqs[keep], fin_lens[keep]
            from_rows = from_rows.view(b, k)[keep].reshape(-1)
            keep_rows = (keep[:, None] * k + torch.arange(k, device=dev)).reshape(-1)
            seqs, memory = seqs[keep_rows], memory[keep_rows]
            valid = None if valid is None else valid[keep_rows]
            cache.reorder_cross(keep_rows)  # the beams of one sentence share its memory
            tok = tok[keep]
            b = keep.numel()
        cache.reorder_self(from_rows)
        cur = tok.reshape(-1, 1)
    return [results[i] if return_scores else results[i][0] for i in range(src.size(0))]


def _best_k(scores: Tensor, seqs: Tensor, lens: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor]:
    """The k best of (b, M) finished hypotheses (scores, (b, M, N) ids, (b, M) lengths)."""
    best, idx = scores.topk(k, dim=1)  # (b, K)
    n = seqs.size(-1)
    return best, seqs.gather(1, idx[..., None].expand(-1, -1, n)), lens.gather(1, idx)


def _collect(results: dict[int, tuple[list[int], float]], sents: Tensor, done: Tensor,
             fin_scores: Tensor, fin_seqs: Tensor, fin_lens: Tensor) -> None:
    """Store the best (first) finished hypothesis of every sentence that is done."""
    for i in done.nonzero().squeeze(1).tolist():
        length = int(fin_lens[i, 0])
        results[int(sents[i])] = (fin_seqs[i, 0, :length].tolist(), float(fin_scores[i, 0]))


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
    with decoding_kernels(model)(), direct_attributes(model):
        if beam == 1:
            return greedy_search(model, ids, mask, max_len=n, bos_id=bos_id, eos_id=eos_id)
        return beam_search(model, ids, mask, beam=beam, length_penalty=length_penalty,
                           max_len=n, bos_id=bos_id, eos_id=eos_id)


def decode_limit(model: nn.Module, src_len: int) -> int:
    """Default most target tokens for sources of up to ``src_len`` tokens: 1.5 x + 10, at most
    the model's ``max_len``."""
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
            weights its activations' rounding does: see ``decoding.quant``).

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


__all__ = ["beam_search", "decode_limit", "greedy_search", "length_penalty_of", "translate",
           "translate_texts"]

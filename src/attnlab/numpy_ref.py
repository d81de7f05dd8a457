"""Attention and multi-head attention in NumPy, one step at a time, as a textbook writes them.

Nothing here is fast; everything is explicit. The tests check it equals the torch path on the
same weights, so it doubles as an independent reference.

Shapes: T query length, S key length, D d_model, H heads, Dh head dim.
"""

from __future__ import annotations

import numpy as np


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Numerically stable softmax: subtract the row maximum before exponentiating."""
    x = x - np.max(x, axis=axis, keepdims=True)
    e = np.exp(x)
    return e / np.sum(e, axis=axis, keepdims=True)


def scaled_dot_product_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray,
                                 mask: np.ndarray | None = None
                                 ) -> tuple[np.ndarray, np.ndarray]:
    """softmax(Q K^T / sqrt(d_k)) V for one head.

    Args:
        q: (T, Dh) queries; k: (S, Dh) keys; v: (S, Dv) values (leading batch dimensions,
            if any, broadcast).
        mask: (T, S) bool, True = may attend (not torch's additive float mask).

    Returns:
        output (T, Dv) and weights (T, S); a row with nothing to attend is all zeros.
    """
    if mask is not None and np.asarray(mask).dtype != bool:
        raise ValueError("mask must be bool (True = may attend), got dtype "
                         f"{np.asarray(mask).dtype}")
    d_k = q.shape[-1]
    # Step 1: similarity of every query with every key.
    scores = q @ np.swapaxes(k, -1, -2)  # (T, S): Q K^T
    # Step 2: scale, so the logits do not grow with d_k and saturate the softmax (paper 3.2.1).
    scores = scores / np.sqrt(d_k)
    # Step 3: hide the keys a query may not see.
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    # Step 4: turn scores into weights that sum to one over the keys.
    with np.errstate(invalid="ignore"):
        weights = softmax(scores, axis=-1)  # (T, S)
    weights = np.nan_to_num(weights, nan=0.0)  # fully masked rows -> zeros
    # Step 5: each output is the weighted average of the values.
    return weights @ v, weights  # (T, Dv), (T, S)


def multi_head_attention(x: np.ndarray, context: np.ndarray | None, w_q: np.ndarray,
                         w_k: np.ndarray, w_v: np.ndarray, w_o: np.ndarray, n_heads: int,
                         b_q: np.ndarray | None = None, b_k: np.ndarray | None = None,
                         b_v: np.ndarray | None = None, b_o: np.ndarray | None = None,
                         mask: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Multi-head attention for one sequence (paper section 3.2.2).

    Weights follow ``torch.nn.Linear``: ``w_q`` is (H*Dh, D) and ``y = x @ w_q.T + b_q``.

    Args:
        x: (T, D) queries' inputs; context: (S, D) keys'/values' inputs, or None for self.
        mask: (T, S) bool, True = may attend.

    Returns:
        output (T, D) and the per-head weights (H, T, S).
    """
    context = x if context is None else context

    def linear(a: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> np.ndarray:
        return a @ w.T + (0.0 if b is None else b)

    q = linear(x, w_q, b_q)  # (T, H*Dh)
    k = linear(context, w_k, b_k)  # (S, H*Dh)
    v = linear(context, w_v, b_v)  # (S, H*Dh)
    if not isinstance(n_heads, int) or n_heads < 1 or q.shape[-1] % n_heads:
        raise ValueError(f"n_heads={n_heads!r} must be a positive divisor of the projections' "
                         f"width H*Dh={q.shape[-1]}")
    head_dim = q.shape[-1] // n_heads
    heads, all_weights = [], []
    for h in range(n_heads):  # each head attends in its own Dh-dimensional subspace
        part = slice(h * head_dim, (h + 1) * head_dim)
        out, weights = scaled_dot_product_attention(q[:, part], k[:, part], v[:, part], mask)
        heads.append(out)  # (T, Dh)
        all_weights.append(weights)  # (T, S)
    concat = np.concatenate(heads, axis=-1)  # (T, H*Dh)
    return linear(concat, w_o, b_o), np.stack(all_weights)  # (T, D), (H, T, S)


def sinusoidal_table(max_len: int, d_model: int) -> np.ndarray:
    """The paper's positional encodings, one explicit loop over positions and dimensions."""
    table = np.zeros((max_len, d_model))
    for pos in range(max_len):
        for i in range(0, d_model, 2):
            angle = pos / 10000 ** (i / d_model)
            table[pos, i] = np.sin(angle)
            if i + 1 < d_model:
                table[pos, i + 1] = np.cos(angle)
    return table


def layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray,
               eps: float = 1e-5) -> np.ndarray:
    """(x - mean) / sqrt(var + eps) * gamma + beta over the last axis (biased variance)."""
    mean = x.mean(axis=-1, keepdims=True)
    var = x.var(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta

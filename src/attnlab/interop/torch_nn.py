"""Convert ``torch.nn.MultiheadAttention`` and ``torch.nn.Transformer`` to attnlab modules that
compute the same function. Two conventions differ, and the caller converts them:

* masks: torch's ``*_key_padding_mask`` and bool ``attn_mask`` are True = IGNORE; attnlab's
  masks are True = may attend (``valid = ~key_padding_mask``).
* layout: attnlab is batch-first. A seq-first torch module (``batch_first=False``) has the
  same weights, so it converts too; transpose its (S, B, D) inputs to (B, S, D).
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from ..config import ModelConfig
from ..nn import Decoder, Encoder, MultiHeadAttention, key_mask
from .weight_map import load_mapped


def _check_mha(m: nn.MultiheadAttention) -> None:
    if not isinstance(m, nn.MultiheadAttention):
        raise TypeError(f"expected a torch.nn.MultiheadAttention, got {type(m).__name__}")
    if not m._qkv_same_embed_dim:
        raise ValueError(
            f"nn.MultiheadAttention with kdim={m.kdim}/vdim={m.vdim} != embed_dim={m.embed_dim} "
            f"is not supported: attnlab projects keys and values from d_model"
        )
    if m.bias_k is not None or m.add_zero_attn:
        raise ValueError("nn.MultiheadAttention with add_bias_kv=True or add_zero_attn=True is "
                         "not supported by attnlab")


def mha_state(m: nn.MultiheadAttention, prefix: str = "") -> dict[str, Tensor]:
    """attnlab ``MultiHeadAttention`` parameters from a torch one: the packed
    ``in_proj_weight`` (3D, D), q/k/v in that order, is attnlab's ``qkv_proj``; ``out_proj``
    maps directly."""
    _check_mha(m)
    out: dict[str, Tensor] = {f"{prefix}qkv_proj.weight": m.in_proj_weight}
    if m.in_proj_bias is not None:
        out[f"{prefix}qkv_proj.bias"] = m.in_proj_bias
    out[f"{prefix}out_proj.weight"] = m.out_proj.weight
    if m.out_proj.bias is not None:
        out[f"{prefix}out_proj.bias"] = m.out_proj.bias
    return out


def mha_from_torch(m: nn.MultiheadAttention) -> MultiHeadAttention:
    """An attnlab :class:`MultiHeadAttention` with the weights of ``m`` (same dtype and device).

    Call it batch-first with a True = may-attend mask: ``attn(x, context, mask=~pad[:, None,
    None, :])`` matches ``m(x, ctx, ctx, key_padding_mask=pad)``.
    """
    _check_mha(m)
    attn = MultiHeadAttention(m.embed_dim, m.num_heads, dropout=m.dropout,
                              bias=m.in_proj_bias is not None)
    load_mapped(attn, mha_state(m))
    return attn.to(m.in_proj_weight)


def _activation(layer: nn.Module) -> str:
    """attnlab ``ffn`` name of a torch Transformer layer's activation."""
    act = layer.activation
    if act is F.relu or isinstance(act, nn.ReLU):
        return "relu"
    if act is F.gelu or (isinstance(act, nn.GELU) and act.approximate == "none"):
        return "gelu"
    if isinstance(act, nn.GELU) and act.approximate == "tanh":
        return "gelu_tanh"
    raise ValueError(f"activation {act!r} is not supported: attnlab has relu, gelu and "
                     f"gelu (tanh approximation)")


def _norm_state(norm: nn.Module | None, name: str) -> dict[str, Tensor]:
    """LayerNorm weight and bias (if any) under attnlab name ``name``."""
    if norm is None:
        return {}
    if not isinstance(norm, nn.LayerNorm) or norm.weight is None:
        raise ValueError(f"norm {norm!r} is not supported: only nn.LayerNorm with its "
                         "weights (elementwise_affine=True)")
    out = {f"{name}.weight": norm.weight}
    if norm.bias is not None:
        out[f"{name}.bias"] = norm.bias
    return out


def config_from_torch(t: nn.Transformer) -> ModelConfig:
    """The attnlab :class:`ModelConfig` (family ``"encoder_decoder"``) of an ``nn.Transformer``.

    Raises:
        ValueError: layers that attnlab cannot express (see :func:`_check_mha`, activations
            other than relu/gelu, different norm placement, activation or LayerNorm eps across
            layers, a final norm on only one of the two stacks).
    """
    if not isinstance(t, nn.Transformer):
        raise TypeError(f"expected a torch.nn.Transformer (encoder and decoder), got "
                        f"{type(t).__name__}")
    enc_layers, dec_layers = list(t.encoder.layers), list(t.decoder.layers)
    if not enc_layers or not dec_layers:
        raise ValueError(f"an nn.Transformer with {len(enc_layers)} encoder and "
                         f"{len(dec_layers)} decoder layers: each stack needs at least one")
    first = enc_layers[0]
    attn = first.self_attn
    norm_first = {layer.norm_first for layer in enc_layers + dec_layers}
    acts = {_activation(layer) for layer in enc_layers + dec_layers}
    if len(norm_first) > 1 or len(acts) > 1:
        raise ValueError("layers with different norm_first or activation are not supported")
    if (t.encoder.norm is None) != (t.decoder.norm is None):
        raise ValueError("a final norm on only one of encoder and decoder is not supported")
    eps = {m.eps for m in t.modules() if isinstance(m, nn.LayerNorm)}
    if len(eps) > 1:
        raise ValueError(f"LayerNorms with different eps ({sorted(eps)}) are not supported: "
                         "attnlab has one norm_eps")
    return ModelConfig(
        family="encoder_decoder",
        d_model=attn.embed_dim,
        n_heads=attn.num_heads,
        n_layers=len(enc_layers),
        n_decoder_layers=len(dec_layers),
        d_ff=first.linear1.out_features,
        dropout=first.dropout.p,
        attn_dropout=attn.dropout,
        norm="pre" if norm_first.pop() else "post",
        norm_eps=first.norm1.eps,
        final_norm=t.encoder.norm is not None,
        ffn=acts.pop(),
        bias=first.linear1.bias is not None,
        pad_id=None,
    )


class TransformerStacks(nn.Module):
    """The encoder and decoder stacks of a converted ``nn.Transformer`` (an attnlab
    :class:`~attnlab.nn.Encoder` and :class:`~attnlab.nn.Decoder`): torch's has no embeddings
    and no output projection, so this is no full :class:`~attnlab.models.Transformer`.

    ``forward`` mirrors ``nn.Transformer.forward`` with attnlab's mask convention; the decoder
    is causal by default (torch called with a causal ``tgt_mask``), and
    ``tgt_is_causal=False`` matches torch called without one.
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.encoder = Encoder(config, config.n_layers)
        self.decoder = Decoder(config, config.n_decoder_layers, cross=True)

    def forward(self, src: Tensor, tgt: Tensor, *, src_valid: Tensor | None = None,
                tgt_valid: Tensor | None = None, memory_valid: Tensor | None = None,
                tgt_is_causal: bool = True) -> Tensor:
        """src (B, S, D), tgt (B, T, D) -> (B, T, D); causal in the decoder unless
        ``tgt_is_causal=False``.

        ``src_valid``/``tgt_valid``/``memory_valid`` (B, S|T|S) bool, True at real positions,
        are ``~src_key_padding_mask`` etc. of torch.
        """
        memory = self.encoder(src, key_mask(src_valid))
        return self.decoder(tgt, memory, self_mask=key_mask(tgt_valid),
                            memory_mask=key_mask(memory_valid), is_causal=tgt_is_causal)


def _ffn_state(layer: nn.Module, prefix: str) -> dict[str, Tensor]:
    out = {}
    for torch_name, name in (("linear1", "w1"), ("linear2", "w2")):
        lin = getattr(layer, torch_name)
        out[f"{prefix}ffn.{name}.weight"] = lin.weight
        if lin.bias is not None:
            out[f"{prefix}ffn.{name}.bias"] = lin.bias
    return out


def transformer_from_torch(t: nn.Transformer) -> TransformerStacks:
    """attnlab encoder and decoder stacks with the weights of ``t`` (same dtype and device).

    Mapping: ``in_proj_weight`` -> qkv_proj, ``out_proj`` -> out_proj, ``linear1/2`` ->
    ffn.w1/w2; encoder ``norm1/norm2`` -> norm1/norm2; decoder ``norm1`` (self-attention),
    ``norm2`` (cross-attention), ``norm3`` (FFN) -> norm1, norm_cross, norm2; the final
    ``encoder.norm``/``decoder.norm`` -> ``.norm``.
    """
    cfg = config_from_torch(t)
    stacks = TransformerStacks(cfg)
    mapped: dict[str, Tensor] = {}
    for i, layer in enumerate(t.encoder.layers):
        p = f"encoder.layers.{i}."
        mapped |= mha_state(layer.self_attn, p + "self_attn.") | _ffn_state(layer, p)
        mapped |= _norm_state(layer.norm1, p + "norm1") | _norm_state(layer.norm2, p + "norm2")
    for i, layer in enumerate(t.decoder.layers):
        p = f"decoder.layers.{i}."
        mapped |= mha_state(layer.self_attn, p + "self_attn.")
        mapped |= mha_state(layer.multihead_attn, p + "cross_attn.") | _ffn_state(layer, p)
        mapped |= _norm_state(layer.norm1, p + "norm1")
        mapped |= _norm_state(layer.norm2, p + "norm_cross")
        mapped |= _norm_state(layer.norm3, p + "norm2")
    mapped |= _norm_state(t.encoder.norm, "encoder.norm")
    mapped |= _norm_state(t.decoder.norm, "decoder.norm")
    load_mapped(stacks, mapped)
    return stacks.to(t.encoder.layers[0].linear1.weight)

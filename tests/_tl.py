"""TransformerLens as a test oracle: one random GPT-2 seen by attnlab and by TransformerLens.

``gpt2_pair(folder)`` saves a small random-weight GPT-2 (every weight redrawn, biases and norm
parameters too, so a dropped bias or a swapped norm shows) with GPT-2's tokenizer files, and
returns it imported by attnlab and booted by TransformerLens 4's ``TransformerBridge``.
``tl_name(site)`` gives TransformerLens's hook name of an attnlab hook site.

Layout differences to mind when comparing (attnlab -> TransformerLens):

- ``blocks.{i}.attn.q|k|v|z``: attnlab (B, H, T, Dh), TransformerLens (B, T, H, Dh):
  compare ``ours`` with ``theirs.transpose(1, 2)``.
- ``blocks.{i}.attn.pattern``: both (B, H, T, S).
- ``pos_embed``: attnlab (T, D) (learned positions, shared by the batch), TransformerLens
  (B, T, D).
- ``final_norm`` is the norm's output, affine included: TransformerLens's ``ln_final.hook_out``
  (its ``hook_normalized`` is before the weight and bias when the weights are not folded).
- the bridge is put in compatibility mode with ``no_processing=True``: HookedTransformer's hook
  names, and the original weights (no folded norms, no centring), so activations compare
  one to one.

TransformerLens is only an oracle here: none of its code is copied into attnlab.
"""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

import pytest
import torch

from _runs import gpt2_files, scramble

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# attnlab site (after "blocks.{i}.") -> TransformerLens hook (after "blocks.{i}.")
BLOCK_NAMES = {"resid_pre": "hook_resid_pre", "resid_mid": "hook_resid_mid",
               "resid_post": "hook_resid_post", "attn_out": "hook_attn_out",
               "ffn_out": "hook_mlp_out", "attn.q": "attn.hook_q", "attn.k": "attn.hook_k",
               "attn.v": "attn.hook_v", "attn.pattern": "attn.hook_pattern",
               "attn.z": "attn.hook_z"}
TOP_NAMES = {"embed": "hook_embed", "pos_embed": "hook_pos_embed",
             "final_norm": "ln_final.hook_out"}
HEADS_SECOND = ("attn.q", "attn.k", "attn.v", "attn.z")  # (B, H, T, Dh) in attnlab


def tl_name(site: str) -> str:
    """TransformerLens's hook name of attnlab's hook site ``site`` (decoder-only names:
    ``blocks.1.attn.pattern`` -> ``blocks.1.attn.hook_pattern``, ``blocks.0.ffn_out`` ->
    ``blocks.0.hook_mlp_out``, ``final_norm`` -> ``ln_final.hook_out``). A site GPT-2 has no
    counterpart of (cross-attention, encoder-decoder prefixes) is a KeyError."""
    if site in TOP_NAMES:
        return TOP_NAMES[site]
    m = re.fullmatch(r"blocks\.(\d+)\.(.+)", site)
    if m is None or m.group(2) not in BLOCK_NAMES:
        raise KeyError(f"no TransformerLens hook for attnlab site {site!r}")
    return f"blocks.{m.group(1)}.{BLOCK_NAMES[m.group(2)]}"


def as_attnlab(site: str, theirs: torch.Tensor) -> torch.Tensor:
    """TransformerLens's tensor of ``site`` in attnlab's layout ((B, T, H, Dh) ->
    (B, H, T, Dh) for q, k, v, z; the others unchanged)."""
    return theirs.transpose(1, 2) if site.endswith(HEADS_SECOND) else theirs


def boot_bridge(folder: Path):
    """TransformerLens's bridge of the GPT-2 in ``folder`` (eval, fp32, CPU, original weights,
    HookedTransformer hook names); skips the test when TransformerLens cannot load it."""
    if importlib.util.find_spec("transformer_lens") is None:
        pytest.skip("TransformerLens is not installed (the oracle of these tests)")
    try:
        from transformer_lens.model_bridge import TransformerBridge

        bridge = TransformerBridge.boot_transformers(str(folder), device="cpu",
                                                     dtype=torch.float32)
        bridge.enable_compatibility_mode(no_processing=True, disable_warnings=True)
    except (ImportError, OSError, RuntimeError, ValueError) as e:  # offline, version drift
        pytest.skip(f"TransformerLens cannot load a local GPT-2 offline: "
                    f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    return bridge.eval()


def gpt2_pair(folder: Path, *, n_layer: int = 2, n_head: int = 4, n_embd: int = 64,
              n_positions: int = 64, seed: int = 0):
    """Save a random GPT-2 (vocab 50257, scrambled weights) and its tokenizer into ``folder``;
    returns ``(attnlab_model, bridge)``: attnlab's import of it (a DecoderLM, eval, fp32) and
    TransformerLens's TransformerBridge of the same folder (eval, fp32)."""
    transformers = pytest.importorskip("transformers", reason="needs pip install 'attnlab[hf]'")
    from attnlab.interop.pretrained import load_pretrained

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(vocab_size=50257, n_positions=n_positions, n_embd=n_embd,
                                  n_layer=n_layer, n_head=n_head)
    scramble(transformers.GPT2LMHeadModel(cfg), seed=seed).save_pretrained(folder)
    gpt2_files(folder)
    model = load_pretrained(folder).model.float().eval()
    return model, boot_bridge(folder)

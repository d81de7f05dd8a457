"""Weight conversion to and from other implementations.

* ``torch.nn``: :func:`mha_from_torch` (``nn.MultiheadAttention``) and
  :func:`transformer_from_torch` (``nn.Transformer`` -> attnlab encoder + decoder stacks).
* Hugging Face ``transformers`` (``pip install attnlab[hf]``, imported lazily):
  :func:`gpt2_from_hf` / :func:`gpt2_to_hf` (GPT-2 <-> :class:`~attnlab.models.DecoderLM`) and
  :func:`bert_from_hf` (BERT encoder -> :class:`~attnlab.models.EncoderClassifier`).
* ONNX (``pip install onnx onnxscript onnxruntime``, imported lazily): :func:`export_onnx`.

Checkpoint-specific parameter names live only in this package.
"""

from .bert import bert_config, bert_from_hf
from .gpt2 import gpt2_config, gpt2_from_hf, gpt2_to_hf
from .onnx_export import export_onnx
from .torch_nn import TransformerStacks, config_from_torch, mha_from_torch, transformer_from_torch

__all__ = [
    "TransformerStacks",
    "bert_config",
    "bert_from_hf",
    "config_from_torch",
    "export_onnx",
    "gpt2_config",
    "gpt2_from_hf",
    "gpt2_to_hf",
    "mha_from_torch",
    "transformer_from_torch",
]

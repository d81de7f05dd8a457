"""Weight conversion to and from other implementations.

* ``torch.nn``: :func:`mha_from_torch` (``nn.MultiheadAttention``) and
  :func:`transformer_from_torch` (``nn.Transformer`` -> attnlab encoder + decoder stacks).
* Hugging Face ``transformers`` (``pip install attnlab[hf]``, imported lazily):
  :func:`gpt2_from_hf` / :func:`gpt2_to_hf` (GPT-2 <-> :class:`~attnlab.models.DecoderLM`) and
  :func:`bert_from_hf` / :func:`bert_to_hf` (``BertModel`` / ``BertForSequenceClassification``
  <-> :class:`~attnlab.models.EncoderClassifier`), :func:`marian_to_hf` (the paper's
  :class:`~attnlab.models.Transformer` -> ``MarianMTModel``),
  :func:`llama_from_hf` / :func:`llama_to_hf` (Llama <-> :class:`~attnlab.models.DecoderLM`).
* Pretrained models: :func:`load_pretrained` (a Hugging Face model directory, or the name
  ``"all-MiniLM-L6-v2"`` -> model + tokenizer), :func:`import_run` (-> a run dir),
  :func:`export_hf` (a run dir -> a Hugging Face model directory); tokenizers in and out of
  Hugging Face files: :func:`load_hf_tokenizer`, :func:`save_hf_tokenizer`.
* ONNX (``pip install onnx onnxscript onnxruntime``, imported lazily): :func:`export_onnx`
  (every family; :func:`example_inputs` makes the inputs).

Checkpoint-specific parameter names live only in this package.
"""

from .bert import bert_classifier_from_hf, bert_config, bert_from_hf, bert_labels, bert_to_hf
from .gpt2 import gpt2_config, gpt2_from_hf, gpt2_to_hf
from .hf_tokenizer import load_hf_tokenizer, save_hf_tokenizer
from .llama import llama_config, llama_from_hf, llama_to_hf
from .marian import marian_to_hf
from .onnx_export import example_inputs, export_onnx
from .pretrained import Pretrained, export_hf, import_run, load_pretrained, to_hf
from .torch_nn import TransformerStacks, config_from_torch, mha_from_torch, transformer_from_torch

__all__ = [
    "Pretrained",
    "TransformerStacks",
    "bert_classifier_from_hf",
    "bert_config",
    "bert_from_hf",
    "bert_labels",
    "bert_to_hf",
    "config_from_torch",
    "example_inputs",
    "export_hf",
    "export_onnx",
    "gpt2_config",
    "gpt2_from_hf",
    "gpt2_to_hf",
    "import_run",
    "llama_config",
    "llama_from_hf",
    "llama_to_hf",
    "load_hf_tokenizer",
    "load_pretrained",
    "marian_to_hf",
    "mha_from_torch",
    "save_hf_tokenizer",
    "to_hf",
    "transformer_from_torch",
]

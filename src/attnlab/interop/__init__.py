"""Weights in and out of other implementations; checkpoint-specific parameter names live only
in this package.

``torch.nn`` (:mod:`.torch_nn`); Hugging Face GPT-2, BERT, Llama, GPT-NeoX and MarianMT
(:mod:`.gpt2`, :mod:`.bert`, :mod:`.llama`, :mod:`.neox`, :mod:`.marian`;
``pip install 'attnlab[hf]'``); model folders <-> run dirs (:mod:`.pretrained`) with their
tokenizer files (:mod:`.hf_tokenizer`); ONNX (:mod:`.onnx_export`). The optional packages are
imported where they are used.
"""

from .bert import bert_classifier_from_hf, bert_config, bert_from_hf, bert_labels, bert_to_hf
from .gpt2 import gpt2_config, gpt2_from_hf, gpt2_to_hf
from .hf_tokenizer import load_hf_tokenizer, save_hf_tokenizer
from .llama import llama_config, llama_from_hf, llama_to_hf
from .marian import marian_to_hf
from .neox import neox_config, neox_from_hf, neox_to_hf
from .onnx_export import example_inputs, export_onnx, export_onnx_run
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
    "export_onnx_run",
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
    "neox_config",
    "neox_from_hf",
    "neox_to_hf",
    "save_hf_tokenizer",
    "to_hf",
    "transformer_from_torch",
]

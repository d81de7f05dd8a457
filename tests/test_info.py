"""Cost estimates checked against PyTorch's own FLOP counter and parameter counts."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from attnlab import ModelConfig, build_model
from attnlab.info import estimate, report


@pytest.mark.parametrize("family, ffn", [("decoder", "gelu"), ("decoder", "swiglu"),
                                         ("encoder_decoder", "relu")])
def test_forward_flops_match_torch_flop_counter(family, ffn):
    cfg = ModelConfig(family=family, vocab_size=97, d_model=32, n_heads=4, n_layers=2,
                      ffn=ffn, dropout=0.0, max_len=64)
    model = build_model(cfg).eval()
    b, t = 2, 16
    x = torch.randint(0, 97, (b, t))
    # attention_maps(layers=True) runs every layer on the written-out attention path, whose
    # matmuls the counter sees (it does not count the fused SDPA kernel on CPU).
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model.attention_maps(x) if family == "decoder" else model.attention_maps(x, x)
    measured = counter.get_total_flops() / (b * t)
    est = estimate(cfg, model.num_parameters(), b, t)
    assert est.flops_per_token_forward == pytest.approx(measured, rel=0.02)
    assert est.flops_per_token_train == 3 * est.flops_per_token_forward


def test_masked_lm_flops_count_its_head_at_the_masked_tokens_only():
    cfg = ModelConfig(family="encoder", head="mlm", vocab_size=997, d_model=32, n_heads=4,
                      n_layers=2, dropout=0.0, max_len=64)
    model = build_model(cfg).eval()
    b, t = 2, 20
    x = torch.randint(1, 997, (b, t))
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model.attention_maps(x)  # every layer written out, and the head at every token
    every_token = counter.get_total_flops() / (b * t)
    skipped = 2 * 32 * 997 * (1 - 0.15)  # training computes the head at the masked 15% only
    est = estimate(cfg, model.num_parameters(), b, t)
    assert est.flops_per_token_forward == pytest.approx(every_token - skipped, rel=0.02)


def test_memory_grows_with_batch_and_report_lists_components():
    cfg = ModelConfig(vocab_size=50, d_model=32, n_heads=4, n_layers=2)
    model = build_model(cfg)
    small, big = (estimate(cfg, model.num_parameters(), b, 32) for b in (1, 8))
    assert big.train_memory_bytes > small.train_memory_bytes > 16 * model.num_parameters()
    assert big.kv_cache_bytes == 8 * small.kv_cache_bytes == 8 * (2 * 2 * 32 * 32 * 4)
    text = report(cfg, model.num_parameters(by_component=True), 4, 32)
    assert "decoder.0.attention" in text and "FLOPs per token" in text
    assert f"{model.num_parameters():,}" in text

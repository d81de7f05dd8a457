"""Cost estimates checked against PyTorch's own FLOP counter and parameter counts."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from attnlab import ModelConfig, attention_maps, build_model
from attnlab.info import count_parameters, device_memory, estimate, human_bytes, report


@pytest.mark.parametrize("family, ffn, dec", [("decoder", "gelu", None),
                                              ("decoder", "swiglu", None),
                                              ("encoder_decoder", "relu", None),
                                              ("encoder_decoder", "relu", 1),
                                              ("encoder_decoder", "relu", 4)])
def test_forward_flops_match_torch_flop_counter(family, ffn, dec):
    cfg = ModelConfig(family=family, vocab_size=97, d_model=32, n_heads=4, n_layers=2,
                      ffn=ffn, dropout=0.0, max_len=64, n_decoder_layers=dec)
    model = build_model(cfg).eval()
    b, t = 2, 16
    x = torch.randint(0, 97, (b, t))
    # attention_maps(layers=True) runs every layer on the written-out attention path, whose
    # matmuls the counter sees (it does not count the fused SDPA kernel on CPU).
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        attention_maps(model, x) if family == "decoder" else attention_maps(model, x, x)
    measured = counter.get_total_flops() / (b * t)
    est = estimate(cfg, count_parameters(model), b, t)
    assert est.flops_per_token_forward == pytest.approx(measured, rel=0.02)
    assert est.flops_per_token_train == 3 * est.flops_per_token_forward


def test_masked_lm_flops_count_its_head_at_the_masked_tokens_only():
    cfg = ModelConfig(family="encoder", head="mlm", vocab_size=997, d_model=32, n_heads=4,
                      n_layers=2, dropout=0.0, max_len=64)
    model = build_model(cfg).eval()
    b, t = 2, 20
    x = torch.randint(1, 997, (b, t))
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        attention_maps(model, x)  # every layer written out, and the head at every token
    every_token = counter.get_total_flops() / (b * t)
    skipped = 2 * 32 * 997 * (1 - 0.15)  # training computes the head at the masked 15% only
    est = estimate(cfg, count_parameters(model), b, t)
    assert est.flops_per_token_forward == pytest.approx(every_token - skipped, rel=0.02)


def test_memory_grows_with_batch_and_report_lists_components():
    cfg = ModelConfig(vocab_size=50, d_model=32, n_heads=4, n_layers=2)
    model = build_model(cfg)
    small, big = (estimate(cfg, count_parameters(model), b, 32) for b in (1, 8))
    assert big.train_memory_bytes > small.train_memory_bytes > 16 * count_parameters(model)
    assert big.kv_cache_bytes == 8 * small.kv_cache_bytes
    text = report(cfg, count_parameters(model, by_component=True), 4, 32)
    assert "decoder.0.attention" in text and "FLOPs per token" in text
    assert f"{count_parameters(model):,}" in text


@pytest.mark.parametrize("family, dec", [("decoder", None),
                                         ("encoder_decoder", None), ("encoder_decoder", 3)])
def test_kv_cache_bytes_are_those_of_a_filled_cache(family, dec):
    """Self-attention keys and values of every decoder layer, and for an encoder-decoder the
    cross-attention keys and values of the memory too (source length = target length)."""
    cfg = ModelConfig(family=family, vocab_size=40, d_model=32, n_heads=4, n_layers=2,
                      n_decoder_layers=dec, max_len=20, dropout=0.0)
    model = build_model(cfg).eval()
    b, t = 3, 20
    ids = torch.randint(1, 40, (b, 1))
    cache = model.decoder.new_cache(b, t)
    with torch.no_grad():
        if family == "decoder":
            model(ids, cache=cache)
        else:
            src = torch.randint(1, 40, (b, t))
            model.decode(ids, model.encode(src), cache=cache)
    tensors = [*cache.k, *cache.v, *(x for pair in cache.cross if pair for x in pair)]
    actual = sum(x.numel() * x.element_size() for x in tensors)
    assert estimate(cfg, count_parameters(model), b, t).kv_cache_bytes == actual


def test_memory_per_process_under_ddp_and_fsdp_is_the_training_state_counted_by_hand():
    """Weights, gradients and AdamW's moments of a tiny model, as they are after a step:
    numel * bytes of each tensor; DDP also copies the gradients into its buckets, FSDP keeps
    a third of each on each of 3 processes."""
    cfg = ModelConfig(vocab_size=11, d_model=8, n_heads=2, n_layers=1, d_ff=16, max_len=4)
    model = build_model(cfg)
    opt = torch.optim.AdamW(model.parameters())
    sum((p ** 2).sum() for p in model.parameters()).backward()
    opt.step()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    grads = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters())
    moments = sum(t.numel() * t.element_size() for state in opt.state.values()
                  for name, t in state.items() if name in ("exp_avg", "exp_avg_sq"))
    mem = device_memory(count_parameters(model), 3)
    assert (mem["ddp"].parameters, mem["ddp"].gradients, mem["ddp"].optimizer) == (
        weights, 2 * grads, moments)
    assert mem["fsdp"].parameters == pytest.approx(weights / 3)
    assert mem["fsdp"].gradients == pytest.approx(grads / 3)
    assert mem["fsdp"].optimizer == pytest.approx(moments / 3)
    assert mem["fsdp"].total == pytest.approx((weights + grads + moments) / 3)
    text = report(cfg, count_parameters(model, by_component=True), 4, 4, world_size=3)
    ddp = next(line for line in text.splitlines() if line.strip().startswith("DDP"))
    assert ddp.split()[1:] == human_bytes(weights).split() + human_bytes(2 * grads).split() + \
        human_bytes(moments).split() + human_bytes(weights + 2 * grads + moments).split()
    assert "plus activations of 2 rows" in text
    assert "DDP" not in report(cfg, {"all": 1}, 4, 4)  # (one process: no such table)


SHAPES = [dict(family="decoder", ffn="gelu", pos="learned", bias=False),
          dict(family="decoder", ffn="swiglu", pos="rope", tie_embeddings=False),
          dict(family="decoder", ffn="none", pos="sinusoidal"),
          dict(family="encoder", pos="learned", embed_norm=True, pooling="pooler"),
          dict(family="encoder", head="mlm", pos="learned"),
          dict(family="encoder_decoder", ffn="relu", n_decoder_layers=3),
          dict(family="encoder_decoder", share_embeddings=True, tie_embeddings=False),
          dict(family="encoder_decoder", tgt_vocab_size=700, tie_embeddings=False)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "-".join(map(str, s.values())))
def test_min_parameters_counts_the_matrices_of_the_built_model(shape):
    """From the config alone: never more than the built model's count (it refuses sizes
    before any weight exists), and within 5% of it at a real size (biases, norms and a
    classifier's head are all it leaves out); at a toy size still below it."""
    from attnlab.info import min_parameters

    real = ModelConfig(vocab_size=1000, d_model=256, n_heads=4, n_layers=2, max_len=128,
                       **shape)
    with torch.device("meta"):
        built = count_parameters(build_model(real))
    assert 0.95 * built <= min_parameters(real) <= built
    toy = ModelConfig(vocab_size=11, d_model=8, n_heads=2, n_layers=1, max_len=4, **shape)
    assert 0 < min_parameters(toy) <= count_parameters(build_model(toy))


def test_check_fits_refuses_a_model_larger_than_the_device_before_it_is_made(monkeypatch):
    """8 bytes a parameter (fp32 weights and gradients) against the device's memory; FSDP's
    processes hold 1/K each; a device of unknown memory is not refused."""
    from attnlab import info
    from attnlab.errors import ConfigError

    cfg = ModelConfig(vocab_size=1000, d_model=256, n_heads=4, n_layers=2)
    need = 8 * info.min_parameters(cfg)
    monkeypatch.setattr(info, "memory_of", lambda device: need - 1)
    with pytest.raises(ConfigError, match=r"too large to train here: model.vocab_size=1,000, "
                       r"model.d_model=256, model.d_ff=1,024, model.n_layers=2 make at least"):
        info.check_fits(cfg, torch.device("cpu"))
    info.check_fits(cfg, torch.device("cpu"), shards=2)  # half of it on each of 2
    monkeypatch.setattr(info, "memory_of", lambda device: need)
    info.check_fits(cfg, torch.device("cpu"))
    monkeypatch.setattr(info, "memory_of", lambda device: None)
    info.check_fits(ModelConfig(d_model=10**6, n_heads=4), torch.device("cpu"))
    monkeypatch.undo()
    assert info.memory_of(torch.device("cpu")) > 2**20  # this machine's, read for real


def test_check_micro_batches_refuses_more_than_memory_holds_and_names_the_most(monkeypatch):
    from attnlab import info
    from attnlab.errors import ConfigError

    monkeypatch.setattr(info, "host_memory", lambda: 1000)
    info.check_micro_batches(10, 100)  # exactly the memory: allowed
    with pytest.raises(ConfigError, match=r"train.grad_accum=11 is not allowed: .* allowed: "
                       r"at most 10$"):
        info.check_micro_batches(11, 100)
    monkeypatch.setattr(info, "host_memory", lambda: None)
    info.check_micro_batches(10**12, 100)  # memory unknown: not refused

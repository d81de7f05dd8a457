"""train.optimizer = "muon": which parameters Muon takes, its step against a NumPy reference
of the algorithm (Jordan et al. 2024; the AdamW-matched step size of Liu et al. 2025) and
against torch.optim.Muon, the AdamW half against torch.optim.AdamW (resume:
tests/train/test_train_loop.py). CPU, tiny models."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnlab import ModelConfig, build_model
from attnlab.config import ConfigError
from attnlab.train import TrainConfig, build_optimizer
from attnlab.train.optim import Muon, MuonAdamW, in_layer_matrix, orthogonalize, set_lr


def model(family: str = "decoder", seed: int = 0):
    torch.manual_seed(seed)
    return build_model(ModelConfig(family=family, vocab_size=13, d_model=16, n_heads=2,
                                   n_layers=2, max_len=8, dropout=0.0, bias=True))


def loss_of(m) -> torch.Tensor:
    g = torch.Generator().manual_seed(5)
    x, y = torch.randint(0, 13, (3, 8), generator=g), torch.randint(0, 13, (3, 8), generator=g)
    return m(x, y)[1]


@pytest.mark.parametrize("family", ["decoder", "encoder", "encoder_decoder"])
def test_muon_takes_the_matrices_inside_the_layers_and_adamw_the_rest(family):
    m = model(family)
    opt = build_optimizer(m, TrainConfig(optimizer="muon"), "cpu")
    assert isinstance(opt, MuonAdamW)
    muon = {id(p) for g in opt.muon.param_groups for p in g["params"]}
    adamw = {id(p) for g in opt.adamw.param_groups for p in g["params"]}
    names = {id(p): n for n, p in m.named_parameters()}
    assert muon and not muon & adamw and muon | adamw == set(names)  # each once (tied: once)
    for i, n in names.items():
        expected = ".layers." in f".{n}" and m.get_parameter(n).dim() == 2
        assert (i in muon) is expected, n
    assert not any(n.startswith(("emb", "src_emb", "tgt_emb")) for i, n in names.items()
                   if i in muon)
    assert in_layer_matrix("decoder.layers.0.ffn.w1.weight", torch.zeros(2, 2))
    assert not in_layer_matrix("decoder.layers.0.ffn.w1.bias", torch.zeros(2))
    assert not in_layer_matrix("emb.tok.weight", torch.zeros(2, 2))


def newton_schulz(g: np.ndarray, steps: int = 5) -> np.ndarray:
    """The quintic iteration of Muon's reference, in float64."""
    a, b, c = 3.4445, -4.7750, 2.0315
    x = g / (np.linalg.norm(g) + 1e-7)
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T
    for _ in range(steps):
        s = x @ x.T
        x = a * x + (b * s + c * s @ s) @ x
    return x.T if tall else x


def conditioned_grads(params, seed: int) -> None:
    """Gaussian gradients whose matrices have singular values spread over ~8x, none tiny: a
    step along the gradient itself is far from Muon's, and bf16 rounding (torch.optim.Muon
    iterates in bf16) stays small (a real gradient's near-zero singular values amplify it)."""
    g = torch.Generator().manual_seed(seed)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g)
        if p.dim() == 2:  # scale the short side
            short = int(p.shape[0] > p.shape[1])
            p.grad *= torch.linspace(0.5, 4.0, p.shape[short]).unsqueeze(1 - short)


def test_one_muon_step_matches_a_numpy_reference_and_adamw_half_matches_torch_adamw():
    cfg = TrainConfig(optimizer="muon", lr=0.02, weight_decay=0.1, beta1=0.8, beta2=0.95)
    m, ref = model(), model()
    opt = build_optimizer(m, cfg, "cpu")
    set_lr(opt, 0.01)  # the schedule reaches both halves
    rest = [p for n, p in ref.named_parameters() if not in_layer_matrix(n, p)]
    adamw_ref = torch.optim.AdamW([{"params": [p for p in rest if p.dim() == 2]},  # embeddings
                                   {"params": [p for p in rest if p.dim() < 2],
                                    "weight_decay": 0.0}],  # (decay on matrices only)
                                  lr=0.01, betas=(0.8, 0.95), eps=cfg.eps, weight_decay=0.1)
    before = {n: p.detach().double().numpy().copy() for n, p in m.named_parameters()}
    conditioned_grads(m.parameters(), 7)
    conditioned_grads(ref.parameters(), 7)
    grads = {n: p.grad.double().numpy().copy() for n, p in m.named_parameters()}
    opt.step()
    adamw_ref.step()
    for n, p in m.named_parameters():
        if in_layer_matrix(n, p):
            # momentum 0.95 from zero, Nesterov: the update orthogonalises g + 0.95 * g
            lr = 0.01 * 0.2 * max(p.shape) ** 0.5  # scaled to an AdamW step's RMS
            step = before[n] * (1 - 0.01 * 0.1) - p.detach().double().numpy()
            want = lr * newton_schulz(1.95 * grads[n])
            np.testing.assert_allclose(step, want, rtol=0, atol=1e-4 * np.abs(want).max(),
                                       err_msg=n)
            # (a step along the plain gradient, of the same size, is far off: the test can tell)
            plain = grads[n] * np.linalg.norm(want) / np.linalg.norm(grads[n])
            assert np.linalg.norm(plain - want) > 0.3 * np.linalg.norm(want), n
        else:
            torch.testing.assert_close(p, ref.get_parameter(n), rtol=1e-6, atol=1e-7,
                                       msg=n)
    # the iteration makes the step near-orthogonal: singular values of the update near 1
    n = "decoder.layers.0.ffn.w1.weight"
    sv = np.linalg.svd(newton_schulz(1.95 * grads[n]), compute_uv=False)
    assert 0.5 < sv.min() and sv.max() < 1.3


def test_muon_takes_the_steps_of_torch_optim_muon():
    torch.manual_seed(0)
    mats = [torch.nn.Parameter(torch.randn(r, c) * 0.1) for r, c in ((24, 8), (8, 24), (8, 8))]
    twins = [torch.nn.Parameter(p.detach().clone()) for p in mats]
    ours = Muon(mats, lr=0.02, weight_decay=0.1)
    theirs = torch.optim.Muon(twins, lr=0.02, weight_decay=0.1, adjust_lr_fn="match_rms_adamw")
    for step in range(3):  # momentum carries over steps
        conditioned_grads(mats, step)
        conditioned_grads(twins, step)
        start = [p.detach().clone() for p in mats + twins]
        ours.step()
        theirs.step()
        deltas = [p.detach() - s for p, s in zip(mats + twins, start)]
        for a, b in zip(deltas[:3], deltas[3:]):
            # the same step, within torch's bf16 rounding (2-4%); a step without the
            # momentum of the steps before, or scaled otherwise, is 10% or more off
            assert torch.linalg.norm(a - b) < 0.06 * torch.linalg.norm(b)


def test_training_in_bf16_iterates_in_bf16():
    m = model()
    assert build_optimizer(m, TrainConfig(optimizer="muon"), "cpu").muon.ns_dtype == torch.float32
    opt = build_optimizer(m, TrainConfig(optimizer="muon"), "cpu", "bf16")
    assert opt.muon.ns_dtype == torch.bfloat16
    g = torch.randn(24, 8, dtype=torch.float64)
    want = torch.from_numpy(newton_schulz(g.numpy()))
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 0.06)):
        got = orthogonalize(g, dtype=dtype)
        assert got.dtype == torch.float64  # back in the gradient's dtype
        assert torch.linalg.norm(got - want) < tol * torch.linalg.norm(want)


def test_muon_lowers_the_loss_of_a_tiny_language_model():
    m = model()
    opt = build_optimizer(m, TrainConfig(optimizer="muon", lr=0.01), "cpu")
    first = float(loss_of(m).detach())
    for _ in range(20):
        opt.zero_grad()
        loss_of(m).backward()
        opt.step()
    assert float(loss_of(m).detach()) < 0.5 * first


def test_a_bad_optimizer_name_says_what_is_allowed():
    with pytest.raises(ConfigError, match="optimizer.*'adamw'.*'muon'"):
        TrainConfig(optimizer="sgd")


def test_muon_on_a_model_without_layer_matrices_is_refused():
    emb = torch.nn.Sequential(torch.nn.Embedding(5, 4))
    with pytest.raises(ConfigError, match="no matrix inside the model's layers"):
        build_optimizer(emb, TrainConfig(optimizer="muon"), "cpu")

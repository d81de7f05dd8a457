"""What only a CUDA device runs: the flash and memory-efficient SDPA kernels in bf16/fp16, fp16
training with a GradScaler, bf16 autocast, exact resume, nccl with one process, and decoding on
the device. Every test here skips on a machine without CUDA (CI's); `benchmarks/gpu.py` runs
the whole suite on a GPU."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from attnlab import ModelConfig, build_model
from attnlab.decoding.lm import generate
from attnlab.nn import causal_mask, fused_attention, key_mask, reference_attention
from attnlab.runs import RunDir, read_metrics
from attnlab.train import RunConfig, resolve_precision, train_run

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA device (none here); benchmarks/gpu.py runs "
                                       "these tests on a GPU")

TEXT = "".join(f"line {i}: the quick brown fox jumps over the lazy dog; {i * 7 % 13}.\n"
               for i in range(60))


def lm_dict(tmp_path, **train) -> dict:
    path = tmp_path / "text.txt"
    path.write_text(TEXT)
    base = {"precision": "fp32", "progress": False, "tensorboard": False, "log_every": 1,
            "warmup_steps": 2, "lr": 3e-3, "seed": 3, "device": "cuda", "batch_size": 4,
            "max_steps": 6, "eval_every": 3}
    return {"model": {"d_model": 32, "n_heads": 2, "n_layers": 2, "dropout": 0.1,
                      "norm": "pre", "max_len": 16},
            "data": {"path": str(path)}, "train": {**base, **train}}


def qkv(dtype, b=2, h=4, t=128, s=128, dh=64, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(b, h, n, dh, device="cuda", generator=g, dtype=dtype,
                        requires_grad=True) for n in (t, s, s)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("case", ["none", "causal", "padding", "kv_cache_causal"])
def test_the_gpu_kernels_equal_the_written_out_attention(dtype, case):
    """Flash (no mask, causal from the top left) and memory-efficient (a boolean mask; causal
    aligned to the end, as a KV cache needs) against the written-out formula in float64,
    forward and backward."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if case in ("none", "causal") and torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("the flash kernel needs a GPU of compute capability 8.0 or newer")
    if dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16")
    t = 16 if case == "kv_cache_causal" else 128
    q, k, v = qkv(dtype, t=t)
    mask, causal = None, case in ("causal", "kv_cache_causal")
    if case == "padding":
        lengths = torch.tensor([128, 77], device="cuda")
        mask = key_mask(torch.arange(128, device="cuda") < lengths[:, None])  # (B, 1, 1, S)
    backend = SDPBackend.FLASH_ATTENTION if case in ("none", "causal") else \
        SDPBackend.EFFICIENT_ATTENTION
    with sdpa_kernel([backend]):  # the named kernel or an error, never a silent fallback
        out = fused_attention(q, k, v, mask, is_causal=causal)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), grad)
    ref_in = [x.detach().double().requires_grad_() for x in (q, k, v)]
    if causal:
        full = causal_mask(t, 128, device="cuda")
        mask = full if mask is None else mask & full
    ref = reference_attention(*ref_in, mask).output
    want = torch.autograd.grad(ref, ref_in, grad.double())
    tol = dict(atol=2e-2, rtol=2e-2) if dtype == torch.bfloat16 else dict(atol=5e-3, rtol=5e-3)
    torch.testing.assert_close(out.double(), ref, **tol)
    for a, b in zip(got, want):
        torch.testing.assert_close(a.double(), b, **tol)


def test_auto_precision_is_bf16_on_a_gpu_that_has_it():
    want = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    assert resolve_precision("auto", torch.device("cuda")) == want


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_reduced_precision_training_on_the_gpu_learns(tmp_path, precision):
    """fp16 goes through the GradScaler (its scale is checkpointed), bf16 through autocast; both
    fit the tiny text about as well as fp32 does."""
    if precision == "bf16" and not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16")
    losses = {}
    for p in ("fp32", precision):
        d = lm_dict(tmp_path, precision=p, max_steps=40, eval_every=40, lr=1e-2)
        out = train_run(RunConfig.from_dict(d), tmp_path / p)
        rows = read_metrics(tmp_path / p / "metrics.csv")
        assert all(torch.isfinite(torch.tensor(r["train_loss"])) for r in rows)
        losses[p] = rows[-1]["val_loss"]
        assert out.result.step == 40
    assert losses[precision] < 0.8 * read_metrics(tmp_path / "fp32" / "metrics.csv")[0][
        "train_loss"]
    assert losses[precision] == pytest.approx(losses["fp32"], rel=0.1)
    scaler = RunDir(tmp_path / precision).load_state("last")["scaler"]
    if precision == "fp16":  # the loss scale goes into the checkpoint, for an exact resume
        assert float(scaler["scale"]) > 0 and scaler["_growth_tracker"] >= 0
    else:  # bf16 needs no loss scaling: the scaler is off
        assert not scaler


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_resume_on_the_gpu_gives_the_same_losses(tmp_path, precision):
    """Stopped at step 3 and resumed: the same losses (the RNG of the device, the dropout masks
    and the fp16 loss scale all come back). CUDA's backward kernels may add in another order
    from run to run, so the weights are compared to 1e-5, not bit for bit as on a CPU."""
    d = lm_dict(tmp_path, precision=precision, decay_steps=6)
    train_run(RunConfig.from_dict(d), tmp_path / "whole")
    half = {**d, "train": {**d["train"], "max_steps": 3}}
    train_run(RunConfig.from_dict(half), tmp_path / "split")
    train_run(RunConfig.from_dict(d), tmp_path / "split", resume=True)
    a = read_metrics(tmp_path / "whole" / "metrics.csv")
    b = read_metrics(tmp_path / "split" / "metrics.csv")
    assert [r["step"] for r in a] == [r["step"] for r in b] == [1, 2, 3, 4, 5, 6]
    for ra, rb in zip(a, b):
        assert ra["lr"] == rb["lr"]
        assert ra["train_loss"] == pytest.approx(rb["train_loss"], abs=1e-4)
    wa = load_file(tmp_path / "whole" / "last" / "model.safetensors")
    wb = load_file(tmp_path / "split" / "last" / "model.safetensors")
    for key in wa:
        torch.testing.assert_close(wa[key], wb[key], rtol=0, atol=1e-5)


def test_torchrun_with_one_process_uses_nccl_and_trains_what_one_process_trains(tmp_path):
    """One process under torchrun goes through the process group (nccl) and DDP, the path of
    K GPUs, and trains what a plain process trains."""
    script = tmp_path / "attnlab_main.py"
    script.write_text("import sys\nfrom attnlab.cli import main\nsys.exit(main())\n")
    text = tmp_path / "text.txt"
    text.write_text(TEXT)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ATTNLAB_CACHE_DIR": str(tmp_path / "c")}
    args = ["train", "--set", f"data.path={text}",
            "--set", "model.d_model=32", "--set", "model.n_heads=2", "--set", "model.n_layers=1",
            "--set", "model.max_len=16", "--set", "model.dropout=0.0",
            "--set", "train.precision='fp32'", "--set", "train.device='cuda'",
            "--set", "train.progress=false", "--set", "train.tensorboard=false",
            "--set", "train.batch_size=6", "--set", "train.max_steps=3",
            "--set", "train.log_every=1", "--set", "train.eval_every=0"]
    runs = {}
    for name, launcher in (("one", [sys.executable, str(script)]),
                           ("ddp", [sys.executable, "-m", "torch.distributed.run",
                                    "--standalone", "--nproc_per_node=1", str(script)])):
        proc = subprocess.run(launcher + args + ["--out", str(tmp_path / name)], env=env,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[name] = proc.stderr
    assert "1 process (DDP, nccl)" in runs["ddp"], runs["ddp"][-2000:]
    assert "DDP" not in runs["one"]
    a = read_metrics(tmp_path / "one" / "metrics.csv")
    b = read_metrics(tmp_path / "ddp" / "metrics.csv")
    assert [r["step"] for r in a] == [r["step"] for r in b] == [1, 2, 3]
    for ra, rb in zip(a, b):
        assert ra["train_loss"] == pytest.approx(rb["train_loss"], abs=1e-5)


def test_decoding_on_the_gpu_gives_the_cpu_tokens():
    cfg = ModelConfig(family="decoder", vocab_size=97, d_model=64, n_heads=4, n_layers=2,
                      max_len=64, dropout=0.0)
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    prompts = [[5, 9, 4, 12], [7, 7]]
    cpu = generate(model, prompts, 24, temperature=0)
    gpu_model = model.to("cuda")
    assert generate(gpu_model, prompts, 24, temperature=0) == cpu
    assert generate(gpu_model, prompts, 24, temperature=0, use_cache=False) == cpu
    # the logits themselves, in bf16 on the device, stay close to fp32's
    ids = torch.tensor([prompts[0] * 8], device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        low, _ = gpu_model(ids)
    high, _ = gpu_model(ids)
    assert F.cosine_similarity(low.float().flatten(), high.flatten(), dim=0) > 0.999

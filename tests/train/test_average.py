"""Weight averaging: train.keep_checkpoints keeps the last N evaluations' weights, and
`attnlab average` writes their mean as a run dir that evaluates like any other; with
train.ema_decay the run keeps the moving average of its weights, and `attnlab average --ema`
writes that."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from attnlab.cli import main
from attnlab.errors import RunError, UsageError
from attnlab.models import build_model
from attnlab.runs import RunDir
from attnlab.train import RunConfig, WeightEMA, average_run, ema_run, train_run

TEXT = "to be, or not to be, that is the question.\n" * 8
TINY = {"d_model": 32, "n_heads": 2, "n_layers": 1, "dropout": 0.1, "norm": "pre", "max_len": 16}
TRAIN = {"device": "cpu", "precision": "fp32", "progress": False, "tensorboard": False,
         "log_every": 1, "warmup_steps": 2, "lr": 3e-3, "seed": 3, "batch_size": 4}


def lm_run(tmp_path, name: str = "run", **train) -> RunDir:
    path = tmp_path / "text.txt"
    path.write_text(TEXT)
    d = {"model": TINY, "data": {"path": str(path)},
         "train": {**TRAIN, "max_steps": 10, "eval_every": 2, "keep_checkpoints": 3, **train}}
    train_run(RunConfig.from_dict(d), tmp_path / name)
    return RunDir(tmp_path / name)


def weights(path) -> dict[str, torch.Tensor]:
    return load_file(str(path))


def test_training_keeps_the_last_n_evaluations_weights(tmp_path):
    run = lm_run(tmp_path)
    kept = run.step_checkpoints()
    assert [s for s, _ in kept] == [6, 8, 10]
    last = weights(run.find_checkpoint("last"))
    assert all(torch.equal(last[k], v) for k, v in weights(kept[-1][1]).items())
    assert not (tmp_path / "off").exists()
    assert lm_run(tmp_path, "off", keep_checkpoints=0).step_checkpoints() == []


def test_the_average_of_identical_checkpoints_is_that_checkpoint(tmp_path):
    run = lm_run(tmp_path, keep_checkpoints=1)
    (step, path), = run.step_checkpoints()
    model = build_model(RunConfig.from_dict(run.read_config()).model)
    run.load_weights(model, str(path))
    for s in (step + 2, step + 4):  # the same weights under two more steps
        run.save_step_weights(s, model, {"step": s}, keep=3)
    out = average_run(run.path, 3, tmp_path / "avg")
    assert out["averaged_steps"] == [step, step + 2, step + 4]
    want, got = weights(path), weights(RunDir(tmp_path / "avg").find_checkpoint("best"))
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)


def test_the_average_of_two_checkpoints_is_the_mean_of_each_tensor(tmp_path):
    run = lm_run(tmp_path)
    (_, a), (_, b) = run.step_checkpoints()[-2:]
    average_run(run.path, 2, tmp_path / "avg")
    wa, wb = weights(a), weights(b)
    got = weights(RunDir(tmp_path / "avg").find_checkpoint("last"))
    assert any(not torch.equal(wa[k], wb[k]) for k in wa)  # two different checkpoints
    for k in wa:
        torch.testing.assert_close(got[k], (wa[k].double() + wb[k].double()).div(2).float(),
                                   rtol=0, atol=0)


def test_an_averaged_run_evaluates_but_is_not_resumed(tmp_path, capsys):
    run = lm_run(tmp_path)
    assert main(["average", str(run.path), "--last", "3", "--out", str(tmp_path / "avg")]) == 0
    assert "steps 6, 8, 10" in capsys.readouterr().out
    evaluates_but_is_not_resumed(tmp_path / "avg", capsys,
                                 "average of 3 checkpoints .* cannot be resumed")


def evaluates_but_is_not_resumed(path, capsys, refusal: str) -> None:
    """An averaged run dir evaluates like any other; resuming it is refused with ``refusal``."""
    assert main(["eval", str(path)]) == 0
    assert "val_loss" in capsys.readouterr().out
    rc = RunConfig.from_dict(RunDir(path).read_config()).replace("train", max_steps=20)
    with pytest.raises(RunError, match=refusal):
        train_run(rc, path, resume=True)


def test_averaging_refusals_name_what_is_allowed(tmp_path, capsys):
    run = lm_run(tmp_path)
    with pytest.raises(RunError, match="keeps 3 step checkpoint.*train.keep_checkpoints=5"):
        average_run(run.path, 5, tmp_path / "avg")
    with pytest.raises(UsageError, match="--last must be >= 1"):
        average_run(run.path, 0, tmp_path / "avg")
    with pytest.raises(UsageError, match="not the run being averaged"):
        average_run(run.path, 2, run.path)
    assert not (tmp_path / "avg").exists()
    assert main(["average", str(run.path), "--last", "9", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "keep_checkpoints=9" in err
    # a run dir that is not there is said so (it said it kept 0 step checkpoints)
    assert main(["average", str(tmp_path / "nope"), "--last", "2", "--out",
                 str(tmp_path / "x")]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"attnlab average: error: run dir {tmp_path / 'nope'} does not exist (give the --out "
        "folder of a training)"]


def test_the_moving_average_follows_its_recurrence_in_float64():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))
    ema = WeightEMA(model, 0.9)
    ref = {k: p.detach().double().clone() for k, p in model.named_parameters()}
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for n in range(1, 41):  # the warmup (1 + n) / (10 + n) < 0.9 up to n = 80: then 0.9
        opt.zero_grad()
        (model(torch.randn(5, 4)) - 1).pow(2).mean().backward()
        opt.step()
        ema.update()
        d = min(0.9, (1 + n) / (10 + n))
        for k, p in model.named_parameters():
            ref[k] = d * ref[k] + (1 - d) * p.detach().double()
    assert ema.updates == 40
    for k, v in ema.state_dict()["weights"].items():
        torch.testing.assert_close(v.double(), ref[k], rtol=0, atol=1e-6)
    assert not torch.allclose(ema.shadow["0.weight"], model[0].weight)  # it lags the weights
    fresh = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))
    ema.copy_to(fresh)
    assert all(torch.equal(p, ema.shadow[k]) for k, p in fresh.named_parameters())


def test_a_moving_average_of_constant_weights_is_those_weights():
    model = torch.nn.Linear(3, 2)
    ema = WeightEMA(model, 0.999)
    for _ in range(5):
        ema.update()
    assert all(torch.equal(p, ema.shadow[k]) for k, p in model.named_parameters())


def test_training_keeps_the_moving_average_resumes_it_exactly_and_writes_it_as_a_run(
        tmp_path, capsys):
    whole = lm_run(tmp_path, "whole", ema_decay=0.8, decay_steps=10)
    lm_run(tmp_path, "split", ema_decay=0.8, decay_steps=10, max_steps=4)
    assert RunDir(tmp_path / "split").load_state()["ema"]["updates"] == 4
    d = RunDir(tmp_path / "split").read_config()
    train_run(RunConfig.from_dict(d).replace("train", max_steps=10), tmp_path / "split",
              resume=True)
    a, b = whole.load_state()["ema"], RunDir(tmp_path / "split").load_state()["ema"]
    assert a["updates"] == b["updates"] == 10
    assert all(torch.equal(a["weights"][k], b["weights"][k]) for k in a["weights"])
    assert main(["average", str(whole.path), "--ema", "--out", str(tmp_path / "ema")]) == 0
    assert "moving average (decay 0.8)" in capsys.readouterr().out
    got = weights(RunDir(tmp_path / "ema").find_checkpoint("best"))
    last = weights(whole.find_checkpoint("last"))
    model = build_model(RunConfig.from_dict(whole.read_config()).model)
    names = dict(model.named_parameters())
    for k, v in a["weights"].items():
        assert torch.equal(got[k], v) and not torch.equal(got[k], last[k]), k
    assert got.keys() == last.keys() and set(a["weights"]) == set(names)
    evaluates_but_is_not_resumed(tmp_path / "ema", capsys,
                                 "moving average of the weights of .* cannot be resumed")


def test_a_moving_average_switched_on_at_resume_starts_from_the_resumed_weights(tmp_path):
    run = lm_run(tmp_path, "run", max_steps=4, decay_steps=10)
    d = run.read_config()
    train_run(RunConfig.from_dict(d).replace("train", max_steps=6, ema_decay=0.5), run.path,
              resume=True)
    assert run.load_state()["ema"]["updates"] == 2


def test_moving_average_refusals_name_what_is_allowed(tmp_path, capsys):
    run = lm_run(tmp_path)
    with pytest.raises(RunError, match="keeps no moving average.*train.ema_decay=D"):
        ema_run(run.path, tmp_path / "ema")
    with pytest.raises(UsageError, match="not the run being averaged"):
        ema_run(run.path, run.path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(RunError, match="no last/ checkpoint"):
        ema_run(tmp_path / "empty", tmp_path / "ema")
    assert not (tmp_path / "ema").exists()
    for bad in ("1.0", "-0.1", "nan"):
        with pytest.raises(Exception, match="ema_decay"):
            RunConfig.from_dict({"train": {"ema_decay": float(bad)}})
    assert main(["average", str(run.path), "--last", "2", "--ema", "--out",
                 str(tmp_path / "x")]) == 2
    assert "not allowed with argument" in capsys.readouterr().err



def test_best_holds_the_better_of_the_model_and_its_moving_average(tmp_path, monkeypatch):
    """Each evaluation scores the model and its moving average; best/ keeps whichever scores
    better, its manifest says which, and the model trains on untouched by the swap."""
    from attnlab.train import loop

    ema_wins = True

    def scripted(self, split="val", max_batches=None):  # lower is better; falls with the step
        params = dict(self.model.named_parameters())
        averaged = all(torch.equal(params[k], v.to(params[k].dtype))
                       for k, v in self.ema.shadow.items())
        return {"val_loss": (1.0 if averaged == ema_wins else 2.0) / self.step, "ppl": 1.0}

    monkeypatch.setattr(loop.Trainer, "evaluate", scripted)
    last = {}
    for ema_wins in (True, False):
        run = lm_run(tmp_path, f"ema_{ema_wins}", ema_decay=0.8, keep_checkpoints=0)
        rows = [r for r in run.read_metrics() if r.get("val_loss") is not None]
        assert [r["step"] for r in rows] == [2, 4, 6, 8, 10]
        assert all(r["ema_val_loss"] is not None for r in rows)
        meta = run.checkpoint_meta("best")
        assert meta["step"] == 10 and meta["value"] == pytest.approx(0.1)
        assert meta["weights"] == ("ema" if ema_wins else "model")
        best = weights(run.find_checkpoint("best"))
        last[ema_wins] = weights(run.find_checkpoint("last"))
        for k, v in run.load_state()["ema"]["weights"].items():
            assert torch.equal(best[k], v if ema_wins else last[ema_wins][k]), k
    # the swaps put the model's own weights back: both runs trained the same
    assert all(torch.equal(last[True][k], v) for k, v in last[False].items())

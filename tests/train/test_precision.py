"""precision = "auto": a measured choice, cached; the oneDNN cache bound; bf16 stays close."""

import json
import os

import pytest
import torch

from attnlab import DecoderLM, ModelConfig
from attnlab.speed import probe
from attnlab.train import precision as prec


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE_DIR", str(tmp_path / "cache"))


class FakeClock:
    """A clock that advances by what the last step 'cost'."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def make_step(clock, cost, calls):
    """A step whose call costs ``cost[precision]``: seconds, or an iterator of each call's."""
    def step(precision):
        calls.append(precision)
        c = cost[precision]
        clock.now += c if isinstance(c, float) else next(c)
    return step


@pytest.mark.parametrize("cost, expected", [({"fp32": 2.0, "bf16": 1.0}, "bf16"),
                                            ({"fp32": 1.0, "bf16": 1.5}, "fp32")])
def test_fastest_picks_the_measured_faster_precision(cost, expected):
    clock, calls = FakeClock(), []
    assert prec.fastest(make_step(clock, cost, calls), "k", rounds=3, clock=clock) == expected
    # one warm-up each, then 3 timed rounds each, alternating the order
    assert calls == ["fp32", "bf16", "fp32", "bf16", "bf16", "fp32", "fp32", "bf16"]


def test_fastest_is_not_fooled_by_one_slow_call():
    # fp32 is faster, but one of its calls was descheduled for 10 s (another job on the
    # machine): its summed time would lose to bf16, its fastest call wins
    clock, calls = FakeClock(), []
    fp32_costs = iter([1.0, 1.0, 10.0, 1.0, 1.0, 1.0])  # warm-up, then 5 timed calls
    step = make_step(clock, {"fp32": fp32_costs, "bf16": 2.0}, calls)
    assert prec.fastest(step, "k", rounds=5, clock=clock) == "fp32"
    assert len(calls) == 12


def test_a_precision_many_times_slower_in_the_first_two_rounds_is_timed_no_more():
    """bf16 on a CPU without bf16 units (22x slower, 5 s a step, was seen): after its warm-up
    and two slow rounds fp32 is timed alone; one fast round among them keeps it timed."""
    clock, calls = FakeClock(), []
    assert prec.fastest(make_step(clock, {"fp32": 1.0, "bf16": 3.0}, calls), "k", rounds=5,
                        clock=clock) == "fp32"
    assert calls == ["fp32", "bf16", "fp32", "bf16", "bf16", "fp32", "fp32", "fp32", "fp32"]
    assert probe._read_cache(probe.cache_file())["k"]["ms"] == {"fp32": 1000.0, "bf16": 3000.0}
    clock, calls = FakeClock(), []
    bf16_costs = iter([5.0, 5.0, 1.0, 5.0, 5.0, 5.0])  # warm-up, then 5 timed calls
    step = make_step(clock, {"fp32": 1.0, "bf16": bf16_costs}, calls)
    assert prec.fastest(step, "k2", rounds=5, clock=clock) == "fp32"
    assert calls.count("bf16") == 6  # timed in every round
    clock, calls = FakeClock(), []  # under SLOWER times: timed in every round
    prec.fastest(make_step(clock, {"fp32": 1.0, "bf16": 2.9}, calls), "k3", clock=clock)
    assert calls.count("bf16") == 6


def test_fastest_is_cached_per_key():
    clock, calls = FakeClock(), []
    step = make_step(clock, {"fp32": 1.0, "bf16": 3.0}, calls)
    assert prec.fastest(step, "a", clock=clock) == "fp32"
    n = len(calls)
    assert prec.fastest(step, "a", clock=clock) == "fp32"
    assert len(calls) == n  # answered from the cache: no new measurement
    flipped = make_step(clock, {"fp32": 3.0, "bf16": 1.0}, calls)
    assert prec.fastest(flipped, "b", clock=clock) == "bf16"  # another key measures again
    assert probe.cache_file().is_file()


def test_a_damaged_cache_is_measured_again():
    probe.cache_file().parent.mkdir(parents=True)
    probe.cache_file().write_text("{not json")
    clock, calls = FakeClock(), []
    assert prec.fastest(make_step(clock, {"fp32": 2.0, "bf16": 1.0}, calls), "k",
                        clock=clock) == "bf16"  # measured (not a default)
    assert calls and probe._read_cache(probe.cache_file())["k"]["precision"] == "bf16"


def test_probe_key_depends_on_the_model_the_batch_and_the_attention_kernels():
    a = prec.probe_key({"d_model": 64}, [(4, 16)])
    assert a == prec.probe_key({"d_model": 64}, [(4, 16)], "auto")
    assert a != prec.probe_key({"d_model": 128}, [(4, 16)])
    assert a != prec.probe_key({"d_model": 64}, [(8, 16)])
    assert a != prec.probe_key({"d_model": 64}, [(4, 16)], "math")


def test_probe_key_tells_cpus_of_one_name_apart_by_their_bf16_units(monkeypatch):
    """A VM's "AMD EPYC" names generations with and without avx512_bf16 (and Intel names
    don't always say AMX): the measured answer of one must not be reused on the other."""
    monkeypatch.setattr(probe, "cpu_model", lambda: "AMD EPYC")
    monkeypatch.setattr(probe, "cpu_features", lambda: ["avx512_bf16", "avx512f", "avx2"])
    with_bf16 = prec.probe_key({"d_model": 64}, [(4, 16)])
    monkeypatch.setattr(probe, "cpu_features", lambda: ["avx512f", "avx2"])
    assert prec.probe_key({"d_model": 64}, [(4, 16)]) != with_bf16
    monkeypatch.undo()
    assert set(probe.cpu_features()) <= set(probe.BF16_FLAGS)


def test_processes_measure_unless_all_have_an_answer_and_then_take_the_same():
    """``reduce`` sums over processes; here it adds another process's cache state."""
    def other(state):  # the other process's votes: [fp32, bf16, miss]
        return lambda v: [a + b for a, b in zip(v, state)] if len(v) == 3 else v

    clock = FakeClock()
    step = make_step(clock, {"fp32": 1.0, "bf16": 2.0}, calls := [])
    probe._write_cache(probe.cache_file(), "k", {"precision": "bf16"})  # this one has an answer
    assert prec.fastest(step, "k", clock=clock, reduce=other([0, 0, 1])) == "fp32"
    assert calls  # the other one had none: both measured
    calls.clear()
    probe._write_cache(probe.cache_file(), "k", {"precision": "bf16"})
    assert prec.fastest(step, "k", clock=clock, reduce=other([0, 1, 0])) == "bf16"
    assert prec.fastest(step, "k", clock=clock, reduce=other([1, 0, 0])) == "fp32"  # a tie
    assert not calls


def test_resolve_precision():
    cpu = torch.device("cpu")
    assert prec.resolve_precision("auto", cpu, lambda: "bf16") == "bf16"
    assert prec.resolve_precision("auto", cpu, lambda: "fp32") == "fp32"
    assert prec.resolve_precision("auto", cpu) == "fp32"  # nothing measured: no guess
    assert prec.resolve_precision("bf16", cpu) == "bf16"
    with pytest.raises(ValueError, match="fp16"):
        prec.resolve_precision("fp16", cpu)


def test_bound_kernel_caches_keeps_a_users_value(monkeypatch):
    monkeypatch.delenv("LRU_CACHE_CAPACITY", raising=False)
    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "7")
    prec.bound_kernel_caches(64)
    assert os.environ["LRU_CACHE_CAPACITY"] == "64"
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "7"


def test_bf16_autocast_stays_close_to_fp32():
    """What the probe may switch to changes the numbers only within bf16's precision."""
    torch.manual_seed(0)
    cfg = ModelConfig(family="decoder", vocab_size=50, d_model=64, n_heads=4, n_layers=2,
                      max_len=32, dropout=0.0, norm="pre", pos="learned")
    model = DecoderLM(cfg).eval()
    ids = torch.randint(0, 50, (2, 32))
    cpu = torch.device("cpu")
    with prec.autocast("fp32", cpu):
        ref, loss_ref = model(ids, ids)
    with prec.autocast("bf16", cpu):
        low, loss_low = model(ids, ids)
    assert low.dtype == torch.bfloat16
    assert torch.allclose(low.float(), ref, atol=0.05, rtol=0.05)
    assert abs(loss_low.item() - loss_ref.item()) < 0.01 * loss_ref.item()


def test_amp_is_the_one_forward_context_of_training_and_evaluation():
    """The Trainer and evaluate_run (attnlab eval) enter the same Amp: autocast in the resolved
    precision, and the attention kernels of train.sdpa_backend."""
    import inspect

    from attnlab.train import evaluate, loop

    cpu = torch.device("cpu")
    with prec.Amp("bf16", cpu)():
        assert torch.is_autocast_enabled("cpu")
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16
    assert torch.backends.cuda.flash_sdp_enabled()  # torch's own choice, by default
    with prec.Amp("fp32", cpu, "math")():
        assert not torch.is_autocast_enabled("cpu")
        assert torch.backends.cuda.math_sdp_enabled()
        assert not torch.backends.cuda.flash_sdp_enabled()
    assert torch.backends.cuda.flash_sdp_enabled()
    for module in (loop, evaluate):  # neither builds its own context
        source = inspect.getsource(module)
        assert "Amp(" in source and "autocast(" not in source, module.__name__


def test_bf16_is_chosen_only_when_it_wins_clearly_and_in_most_rounds():
    """A busy machine made a 3% "win" stick (and then a 4x slower run): fp32 stays unless
    bf16 is faster by the margin and in most rounds."""
    clock, calls = FakeClock(), []
    assert prec.fastest(make_step(clock, {"fp32": 1.0, "bf16": 0.97}, calls), "close",
                        clock=clock) == "fp32"
    assert prec.fastest(make_step(clock, {"fp32": 1.0, "bf16": 0.7}, calls), "clear",
                        clock=clock) == "bf16"
    # one lucky bf16 call (its fastest is far below fp32's) but slower in most rounds
    bf16 = iter([1.0, 0.5, 1.2, 1.2, 1.2, 1.2])  # warm-up, then 5 timed calls

    def step(precision):
        clock.now += 1.0 if precision == "fp32" else next(bf16)

    assert prec.fastest(step, "lucky", clock=clock) == "fp32"


def _auto_lm(tmp_path):
    """A tiny language model run with ``precision = "auto"``: a log row every 2 of 6 steps."""
    from attnlab.train import RunConfig

    text = tmp_path / "t.txt"
    text.write_text("to be or not to be, that is the question.\n" * 40)
    rc = RunConfig.from_dict({
        "model": {"d_model": 16, "n_heads": 2, "n_layers": 1, "max_len": 16},
        "data": {"path": str(text)},
        "train": {"device": "cpu", "precision": "auto", "progress": False, "warmup_steps": 1,
                  "tensorboard": False, "max_steps": 6, "log_every": 2, "eval_every": 0,
                  "batch_size": 4}})
    return rc


def test_a_choice_that_trains_much_slower_than_measured_is_measured_again(tmp_path, caplog,
                                                                        monkeypatch):
    """An "auto" run says once what it chose and how to choose; at its second log row, bf16
    steps far slower than the cached measurement are measured again, the cache takes the new
    answer, and a changed answer is said (the next run takes it)."""
    import logging

    from attnlab.train import loop, train_run

    rc = _auto_lm(tmp_path)
    with caplog.at_level(logging.INFO, logger="attnlab"):
        train_run(rc, tmp_path / "a")
    said = [r.getMessage() for r in caplog.records if "train.precision auto:" in r.getMessage()]
    assert len(said) == 1 and "--set train.precision=fp32 or bf16" in said[0], said
    assert " ms" in said[0]  # with what was measured

    for measured_again in ("fp32", "bf16"):
        answers = iter(["bf16", measured_again])

        def scripted(step, key, answers=answers, **kwargs):  # cached: bf16 takes a microsecond
            choice = next(answers)
            ms = {"fp32": 0.002, "bf16": 0.001} if choice == "bf16" else {"fp32": 1.0,
                                                                          "bf16": 2.0}
            probe._write_cache(probe.cache_file(), key, {"precision": choice, "ms": ms})
            return choice

        monkeypatch.setattr(loop, "fastest", scripted)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="attnlab"):
            train_run(rc, tmp_path / f"b_{measured_again}")
        assert next(answers, None) is None  # measured again at the second log row
        warned = [r.getMessage() for r in caplog.records if "measured again" in r.getMessage()]
        # a busy machine that measures bf16 ahead again says nothing
        assert len(warned) == (measured_again == "fp32"), [r.getMessage() for r in
                                                           caplog.records]
        entries = probe._read_cache(probe.cache_file())
        assert [e["precision"] for e in entries.values()] == [measured_again]


def test_fp32_chosen_on_a_busy_machine_is_measured_again(tmp_path, caplog, monkeypatch):
    """A probe run while other jobs held the cores measured fp32 and bf16 both slow, called
    the close race for fp32 and cached it: every later run trained in fp32 (1.3x slower on
    an AMD EPYC). Steps far faster than that measurement show it was a busy machine: measured
    again at the second log row, the cache takes bf16 and the user is told."""
    import logging

    from attnlab.train import loop, train_run

    rc = _auto_lm(tmp_path)
    answers = iter([("fp32", {"fp32": 99_000.0, "bf16": 66_000.0}),  # 99 s: a busy machine
                    ("bf16", {"fp32": 3.0, "bf16": 2.0})])

    def scripted(step, key, **kwargs):
        choice, ms = next(answers)
        probe._write_cache(probe.cache_file(), key, {"precision": choice, "ms": ms})
        return choice

    monkeypatch.setattr(loop, "fastest", scripted)
    with caplog.at_level(logging.INFO, logger="attnlab"):
        train_run(rc, tmp_path / "run")
    assert next(answers, None) is None  # measured again at the second log row
    warned = [r.getMessage() for r in caplog.records if "measured again" in r.getMessage()]
    assert len(warned) == 1 and "faster than measured (the machine was busy then)" in warned[0]
    assert "the next run takes bf16" in warned[0]
    assert [e["precision"] for e in probe._read_cache(probe.cache_file()).values()] == ["bf16"]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["precision"] == "fp32"  # the run itself stays in what it started in

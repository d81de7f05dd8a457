"""Run configs (TOML + --set overrides), optimizer groups and learning-rate schedules."""

from __future__ import annotations

import math
import tomllib
from pathlib import Path

import pytest
import torch

from attnlab import ModelConfig, build_model
from attnlab.config import ConfigError
from attnlab.recipes import RECIPES
from attnlab.run_config import apply_overrides, config_toml, parse_value, toml_value
from attnlab.train import DEMO, RunConfig, TrainConfig, load_config, lr_at, noam_peak
from attnlab.train.optim import build_optimizer, cosine_lr, inverse_sqrt_lr, param_groups

CONFIGS = RECIPES  # the shipped recipes


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_toml_sections_and_overrides(tmp_path):
    toml = write(tmp_path / "r.toml", '[model]\nd_model = 64\nn_heads = 2\n'
                 '[data]\nname = "shakespeare"\n[train]\nlr = 1e-3\n')
    rc = load_config(toml, ["train.lr=3e-4", "model.norm=pre", "data.path=/tmp/x y.txt",
                            "train.compile=true"])
    assert rc.model.d_model == 64 and rc.model.norm == "pre"
    assert rc.train.lr == 3e-4 and rc.train.compile is True
    assert rc.data.path == "/tmp/x y.txt" and rc.data.name == "shakespeare"
    assert {"model.d_model", "model.norm", "train.lr", "data.path"} <= rc.explicit
    assert "model.vocab_size" not in rc.explicit
    again = RunConfig.from_dict(rc.to_dict())
    assert again == rc  # round trip through the dict config.json stores


def test_parse_value_reads_toml_literals_else_text():
    assert parse_value("3") == 3 and parse_value("1e-3") == 1e-3
    assert parse_value("true") is True and parse_value("[1, 2]") == [1, 2]
    assert parse_value('"quoted"') == "quoted" and parse_value("plain/path.txt") == "plain/path.txt"


@pytest.mark.parametrize("overrides, message", [
    (["model.d_modl=64"], "unknown config key 'model.d_modl'"),
    (["train.nope=1"], "allowed keys in [train]"),
    (["optim.lr=1"], "unknown config section 'optim'"),
    (["lr=1"], "use section.key=value"),
    (["train.seed=18446744073709551616"], "train.seed=18446744073709551616 is not allowed"),
    (["data.split_seed=-3"], "data.split_seed=-3 is not allowed: an integer in 0..2**63-1"),
    (["train.lr=inf"], "train.lr=inf is not allowed: a finite positive float"),
    (["model.d_model=abc"], "model.d_model='abc' has the wrong type: expected int"),
    (["train.max_steps=1.5"], "train.max_steps=1.5 has the wrong type"),
    (["train.schedule=linear"], "train.schedule='linear' is not allowed: one of 'cosine'"),
    (["data.name=imagenet"], "data.name='imagenet' is not allowed"),
    (["train.device=tpu"], "train.device='tpu' is not allowed"),
    (["train.best_metric=loss"], "train.best_metric='loss' is not allowed"),
    (["data.label_names=[1, 2]"], "data.label_names=[1, 2] is not allowed"),
    (["train.parallel=zero3"], "train.parallel='zero3' is not allowed: one of 'ddp', 'fsdp'"),
    (["train.parallel=fsdp", "train.optimizer=muon"],
     "train.optimizer='muon' is not allowed: 'adamw' with parallel='fsdp'"),
    (["train.parallel=fsdp", "train.ema_decay=0.9"], "train.ema_decay=0.9 is not allowed"),
    (["train.parallel=fsdp", "train.keep_checkpoints=2"],
     "train.keep_checkpoints=2 is not allowed: 0 with parallel='fsdp'"),
])
def test_bad_keys_and_values_name_key_value_and_allowed(overrides, message):
    with pytest.raises(ConfigError) as e:
        load_config(None, overrides)
    assert message in str(e.value)


def test_unknown_key_in_toml_file(tmp_path):
    toml = write(tmp_path / "r.toml", "[train]\nlearning_rate = 0.1\n")
    with pytest.raises(ConfigError, match="unknown config key 'train.learning_rate'.*lr"):
        load_config(toml)
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(write(tmp_path / "bad.toml", "[train\n"))


TRICKY = 'a "quoted" \\back\\slash\nnew line\ttab \u00e9 \U0001F600 # not a comment'


def test_the_printed_toml_reads_back_the_same_config(tmp_path):
    """config_toml (train --print-config) writes every value type a run config holds:
    strings with quotes, backslashes and newlines, lists of tables, None (a comment: left at
    its default), small floats, bools; tomllib and load_config read back the same."""
    rc = load_config(None, [
        f"data.cache_dir={toml_value(TRICKY)}", f"train.init_from={toml_value(TRICKY)}",
        'data.mix=[{path = "a dir", weight = 0.7}, {path = "b.txt", weight = 3}]',
        'data.label_names=["neg", "pos \\"x\\""]', "train.lr=1e-4", "train.min_lr=1e-5",
        "train.eps=1e-8", "train.compile=true", "data.bucket=true", "train.weight_decay=0.0"])
    assert rc.data.cache_dir == TRICKY and rc.train.lr == 1e-4 and rc.data.split_seed is None
    text = config_toml(rc.to_dict())
    read = tomllib.loads(text)
    assert read == {name: {k: v for k, v in section.items() if v is not None}
                    for name, section in rc.to_dict().items()}
    assert read["train"]["lr"] == 1e-4 and read["train"]["compile"] is True
    assert read["data"]["mix"] == [{"path": "a dir", "weight": 0.7}, {"path": "b.txt", "weight": 3}]
    assert "# split_seed = (unset)" in text.splitlines()
    assert load_config(write(tmp_path / "printed.toml", text)) == rc


def test_the_toml_writer_leaves_out_none_inside_tables_and_writes_sub_tables():
    config = {"data": {"mix": [{"path": "a", "weight": None}], "t": {"x": 1, "y": None},
                       "f": float("inf"), "u": None}}
    text = config_toml(config)
    assert tomllib.loads(text) == {"data": {"mix": [{"path": "a"}], "t": {"x": 1},
                                            "f": float("inf")}}
    assert "# u = (unset)" in text.splitlines()
    assert parse_value(toml_value(TRICKY)) == TRICKY and parse_value(toml_value(1e-4)) == 1e-4


def test_overrides_do_not_mutate_the_base():
    before = {k: dict(v) for k, v in DEMO.items()}
    apply_overrides(DEMO, ["train.lr=5.0"])
    assert DEMO == before


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.toml")), ids=lambda p: p.stem)
def test_shipped_recipes_load(path):
    from attnlab.tasks import task_class

    rc = load_config(path)
    assert rc.model.family in (task_class(rc).family, "decoder")


def test_recipes_exist_and_demo_file_equals_builtin_demo():
    names = {p.stem for p in CONFIGS.glob("*.toml")}
    assert {"shakespeare_char", "shakespeare_char_cpu", "multi30k_de_en", "sst2", "copy",
            "reverse", "sort"} <= names
    assert load_config(CONFIGS / "demo.toml") == load_config(None)
    assert tomllib.loads((CONFIGS / "demo.toml").read_text()) == DEMO


def test_nanogpt_cpu_recipe_matches_the_documented_config():
    rc = load_config(CONFIGS / "shakespeare_char_cpu.toml")
    m, t = rc.model, rc.train
    assert (m.n_layers, m.n_heads, m.d_model, m.d_ff, m.max_len) == (4, 4, 128, 512, 64)
    assert (m.ffn, m.norm, m.pos, m.bias, m.tie_embeddings, m.dropout) == \
        ("gelu", "pre", "learned", False, True, 0.0)
    assert (t.batch_size, t.max_steps, t.lr, t.min_lr, t.warmup_steps) == (12, 2000, 1e-3, 1e-4,
                                                                          100)
    assert (t.beta1, t.beta2, t.weight_decay, t.grad_clip) == (0.9, 0.99, 0.1, 1.0)
    assert rc.data.train_frac == 0.9


def test_cosine_schedule_is_nanogpts():
    # nanoGPT get_lr with warmup 100, decay 2000, lr 1e-3, min 1e-4
    assert cosine_lr(0, 1e-3, 1e-4, 100, 2000) == pytest.approx(1e-3 / 101)
    assert cosine_lr(99, 1e-3, 1e-4, 100, 2000) == pytest.approx(1e-3 * 100 / 101)
    assert cosine_lr(100, 1e-3, 1e-4, 100, 2000) == pytest.approx(1e-3)
    assert cosine_lr(1050, 1e-3, 1e-4, 100, 2000) == pytest.approx(1e-4 + 0.5 * 9e-4)
    assert cosine_lr(2000, 1e-3, 1e-4, 100, 2000) == pytest.approx(1e-4)
    assert cosine_lr(5000, 1e-3, 1e-4, 100, 2000) == pytest.approx(1e-4)


def test_inverse_sqrt_is_the_papers_formula():
    d, warmup = 512, 4000
    peak = noam_peak(d, warmup)
    for step in (0, 10, 3998, 3999, 4000, 10_000, 100_000):
        s = step + 1
        paper = d ** -0.5 * min(s ** -0.5, s * warmup ** -1.5)  # Vaswani et al., eq. 3
        assert inverse_sqrt_lr(step, peak, warmup) == pytest.approx(paper, rel=1e-9)
    cfg = TrainConfig(schedule="inverse_sqrt", lr=peak, warmup_steps=warmup)
    lrs = [lr_at(s, cfg) for s in range(0, 20_000, 500)]
    top = lrs.index(max(lrs))
    assert all(a < b for a, b in zip(lrs[:top], lrs[1:top + 1]))  # warmup rises
    assert all(a > b for a, b in zip(lrs[top:], lrs[top + 1:]))  # then decays


def test_constant_schedule_with_warmup():
    cfg = TrainConfig(schedule="constant", lr=0.01, warmup_steps=3)
    assert [round(lr_at(s, cfg), 6) for s in range(5)] == [0.0025, 0.005, 0.0075, 0.01, 0.01]


def test_decay_groups_hold_matrices_only_and_every_parameter_once():
    model = build_model(ModelConfig(family="decoder", vocab_size=20, d_model=16, n_heads=2,
                                    n_layers=1, max_len=8, pos="learned", bias=True))
    decay, no_decay = param_groups(model, 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decay["params"])
    assert all(p.dim() < 2 for p in no_decay["params"]) and no_decay["params"]
    ids = [id(p) for p in decay["params"] + no_decay["params"]]
    assert len(ids) == len(set(ids)) == len(list(model.parameters()))
    assert id(model.head.weight) in ids  # tied with the embedding: listed once
    opt = build_optimizer(model, TrainConfig(weight_decay=0.1), "cpu")
    assert isinstance(opt, torch.optim.AdamW) and opt.defaults["betas"] == (0.9, 0.99)


def test_fp16_on_cpu_is_refused_and_auto_resolves():
    from attnlab.train import resolve_device, resolve_precision

    cpu = resolve_device("cpu")
    with pytest.raises(ValueError, match="fp16.*needs CUDA"):
        resolve_precision("fp16", cpu)
    assert resolve_precision("auto", cpu) in ("bf16", "fp32")
    assert resolve_precision("fp32", cpu) == "fp32"
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            resolve_device("cuda")
    assert math.isfinite(noam_peak(256, 4000))


def test_attention_kernel_choice():
    from torch.nn.attention import SDPBackend

    from attnlab.train.precision import sdpa_backends

    # torch's choice at every precision and length (short bf16 sequences on a CPU: see
    # attnlab.nn.fused_attention); a named kernel is the only one SDPA may use
    assert sdpa_backends("auto") is None
    assert sdpa_backends("flash") == [SDPBackend.FLASH_ATTENTION]
    assert sdpa_backends("math") == [SDPBackend.MATH]
    assert sdpa_backends("default") is None


def test_layer_decay_scales_each_depth_and_set_lr_applies_it():
    from attnlab.train.optim import layer_depth, set_lr

    model = build_model(ModelConfig(family="encoder", vocab_size=20, d_model=16, n_heads=2,
                                    n_layers=3, max_len=8, pos="learned"))
    groups = param_groups(model, 0.1, layer_decay=0.5)
    scale = {id(p): g["lr_scale"] for g in groups for p in g["params"]}
    assert len(scale) == len(list(model.parameters()))  # every parameter once
    named = dict(model.named_parameters())
    # head (depth 4) full rate, layer i at 0.5 ** (3 - i), embeddings 0.5 ** 4
    assert scale[id(named["head.weight"])] == 1.0
    for i in range(3):
        layer = [p for n, p in named.items() if n.startswith(f"encoder.layers.{i}.")]
        assert layer and {scale[id(p)] for p in layer} == {0.5 ** (3 - i)}
    assert scale[id(named["emb.tok.weight"])] == 0.5 ** 4
    assert [layer_depth(n, 3) for n in ("emb.pos.weight", "encoder.layers.2.ffn.w1.weight",
                                        "decoder.layers.10.x", "head.bias")] == [0, 3, 11, 4]
    # an encoder-decoder: both embeddings lowest, the deeper decoder sets the top
    seq2seq = build_model(ModelConfig(family="encoder_decoder", vocab_size=20, d_model=16,
                                      n_heads=2, n_layers=1, n_decoder_layers=3, max_len=8))
    named = dict(seq2seq.named_parameters())
    scale_of = {id(p): g["lr_scale"] for g in param_groups(seq2seq, 0.1, layer_decay=0.5)
                for p in g["params"]}
    assert scale_of[id(named["src_emb.tok.weight"])] == scale_of[id(named["tgt_emb.tok.weight"])]
    assert scale_of[id(named["src_emb.tok.weight"])] == 0.5 ** 4
    last = [p for n, p in named.items() if n.startswith("decoder.layers.2.")]
    assert {scale_of[id(p)] for p in last} == {0.5}  # never above the full rate
    for g in groups:  # decay on matrices only, as without layer decay
        assert g["weight_decay"] == (0.1 if all(p.dim() >= 2 for p in g["params"]) else 0.0)
    opt = build_optimizer(model, TrainConfig(layer_decay=0.5, lr=0.01), "cpu")
    set_lr(opt, 0.01)
    assert sorted({g["lr"] for g in opt.param_groups}) == [0.01 * 0.5 ** k for k in (4, 3, 2, 1, 0)]
    with pytest.raises(ConfigError, match="layer_decay"):
        TrainConfig(layer_decay=0.0)


def test_fine_tuning_keys_are_checked():
    rc = load_config(None, ["train.init_from=all-MiniLM-L6-v2", "data.holdout_unit=row",
                            "data.bucket=true"])
    assert rc.train.init_from == "all-MiniLM-L6-v2" and rc.data.holdout_unit == "row"
    assert load_config(None).data.holdout_unit == "sentence"  # honest by default
    with pytest.raises(ConfigError, match="holdout_unit.*'sentence'"):
        load_config(None, ["data.holdout_unit=phrase"])


def test_schedules_that_cannot_be_meant_are_refused_or_warned():
    """min_lr above lr made the cosine rise to 9x the peak (refused). A decay ending inside
    the warmup, a warmup or decay longer than the run, or a patience that cannot fire, is
    allowed (short trial runs) but said."""
    from attnlab.train.optim import schedule_warnings

    with pytest.raises(ConfigError, match=r"min_lr=0.01 is not allowed: a float <= lr=0.001"):
        TrainConfig(lr=1e-3, min_lr=1e-2)
    assert "the cosine ends before the warmup" in schedule_warnings(
        TrainConfig(max_steps=8, warmup_steps=4, decay_steps=4))[0]
    with pytest.raises(ConfigError, match=r"threads=2147483648 is not allowed"):
        TrainConfig(threads=2**31)
    TrainConfig(schedule="inverse_sqrt", lr=1e-3, min_lr=1e-2)  # min_lr is cosine's alone
    assert schedule_warnings(TrainConfig(max_steps=2000, decay_steps=2000)) == []
    said = schedule_warnings(TrainConfig(max_steps=50, warmup_steps=100, decay_steps=2000,
                                         eval_every=25, patience=2))
    assert [w.split(" ")[0] for w in said] == ["train.warmup_steps=100", "train.decay_steps=2000",
                                               "train.patience=2"]
    assert "evaluates 2 time(s)" in said[2]
    assert "evaluates 1 time(s)" in schedule_warnings(TrainConfig(max_steps=5, patience=1))[-1]


def test_a_fine_tuning_recipe_s_shape_key_alone_says_to_leave_it_to_the_source():
    """With train.init_from, a [model] key that does not fit the defaults on its own (n_heads
    12 without d_model) is refused with the advice to leave the source's shape keys out; the
    same key without init_from gets the plain message."""
    recipe = {"model": {"n_heads": 12}, "data": {"name": "sst2"},
              "train": {"init_from": "runs/minilm"}}
    with pytest.raises(ConfigError, match=r"divisor of d_model=128.*with "
                       r"train.init_from=runs/minilm, leave out the \[model\] keys"):
        RunConfig.from_dict(recipe)
    with pytest.raises(ConfigError, match="divisor of d_model=128") as plain:
        RunConfig.from_dict({**recipe, "train": {}})
    assert "init_from" not in str(plain.value)


def test_a_key_the_run_does_not_read_is_named_and_the_shipped_recipes_have_none():
    """A key that changes nothing for its run (a synthetic task's data.seq_max, a classifier's
    model.n_classes on a language model) is one warning with the keys that do apply; a key
    at its default that was not given, and every key of every shipped recipe, says nothing."""
    from attnlab.train.runner import unused_keys

    rc = load_config(None, ["data.path=corpus.txt", "data.seq_max=30", "model.n_classes=3",
                            "data.train_frac=0.8"])
    said = unused_keys(rc)
    assert [line.split(" ")[0] for line in said] == ["data.seq_max", "model.n_classes"], said
    assert "is ignored; its data keys: name, path," in said[0] and "train_frac" in said[0]
    assert "a decoder-only model" in said[1]
    assert unused_keys(load_config(None, ["data.name=reverse", "data.seq_max=30"])) == []
    assert unused_keys(load_config(None, ["data.tokenizer=char", "data.vocab_size=500",
                                          "data.path=c.txt"]))[0].startswith(
        "data.vocab_size does not apply")  # a BPE key with the char tokenizer
    for recipe in sorted(RECIPES.glob("*.toml")):
        assert unused_keys(load_config(recipe)) == [], recipe.stem

"""The one registry of tasks: a new task is one class in one file; every data set has one
entry; ``data.name`` left out lets the files decide; old own-files names still read."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from attnlab.cli import main
from attnlab.config import ConfigError
from attnlab.data.pairs import KIND
from attnlab.data.shards import FORMAT, MANIFEST
from attnlab.run_config import RunConfig
from attnlab.runs import RunDir, read_metrics
from attnlab.tasks import (
    ClassifyTask,
    LMTask,
    MaskedLMTask,
    SyntheticTask,
    TranslationTask,
    data_sets,
    downloads,
    registry,
    resolve_data,
    task_class,
)
from attnlab.train import load_config

SRC = Path(__file__).resolve().parents[2] / "src" / "attnlab"

# A new task, written as a user would: one class in one file, registered by the decorator.
COUNT_TASK = '''"""Counting: a language model of ids counting up from a random start (a toy)."""

import torch

from attnlab.nn import token_loss
from attnlab.tasks import DataSet, Task, register
from attnlab.tokenizers import IdTokenizer


@register
class CountTask(Task):
    """Predict the next number: x, x+1, x+2, ... (mod the vocabulary)."""

    family = "decoder"
    kind = "counting"
    datasets = (DataSet("count", "ids counting up from a random start, made on the fly"),)

    def __init__(self, rc, tokenizer=None):
        super().__init__(rc)
        self.vocab = rc.data.synth_vocab
        self.tokenizer = tokenizer or IdTokenizer(self.vocab, specials=())
        self.model_config = self.resolve_model(vocab_size=self.vocab, pad_id=None)
        self.block = self.model_config.max_len

    def _rows(self, n, generator):
        start = torch.randint(0, self.vocab, (n, 1), generator=generator)
        ids = (start + torch.arange(self.block + 1)) % self.vocab  # (B, T + 1)
        return ids[:, :-1], ids[:, 1:]

    def next_batch(self):
        return self._rows(self.rc.train.batch_size, self.generator)

    def loss_sum(self, model, batch, label_smoothing=0.0):
        x, y = batch
        logits, _ = model(x)  # (B, T, V)
        return token_loss(logits, y, None, label_smoothing, "sum")

    @torch.no_grad()
    def evaluate(self, model, split, device, amp, max_batches=0, progress=None):
        x, y = (t.to(device) for t in self._rows(32, torch.Generator().manual_seed(1)))
        with amp():
            loss = self.loss_sum(model, (x, y))
        return {"val_loss": float(loss) / y.numel()}
'''
TINY = ["--set", "model.d_model=32", "--set", "model.n_heads=2", "--set", "model.n_layers=1",
        "--set", "model.max_len=16"]
FAST = ["--set", "train.max_steps=4", "--set", "train.eval_every=2", "--set",
        "train.batch_size=8", "--set", "train.warmup_steps=1", "--set", "train.samples=0",
        "--set", "train.precision=fp32", "--set", "train.progress=false", "--set",
        "train.tensorboard=false"]


def _tree_digest() -> str:
    """A digest of every source file of the package: adding a task must change none."""
    digest = hashlib.sha256()
    for path in sorted(SRC.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(str(path.relative_to(SRC)).encode() + path.read_bytes())
    return digest.hexdigest()


@pytest.fixture
def count_task(tmp_path, monkeypatch):
    """The toy task's module, written to one file and imported (which registers it); the
    registry is put back afterwards."""
    monkeypatch.setattr(registry, "REGISTRY", list(registry.REGISTRY))
    path = tmp_path / "count_task.py"
    path.write_text(COUNT_TASK, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("count_task", path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "count_task", module)
    spec.loader.exec_module(module)
    return module


def test_a_new_task_is_one_class_in_one_file_and_trains_from_the_cli(count_task, tmp_path,
                                                                      capsys):
    before = _tree_digest()
    assert task_class(load_config(None, ["data.name=count"])) is count_task.CountTask
    out = tmp_path / "runs" / "count"
    assert main(["train", "--set", "data.name=count", *TINY, *FAST, "--out", str(out)]) == 0
    assert "val_loss" in capsys.readouterr().out
    run = RunDir(out)
    assert run.has_checkpoint("best") and run.has_checkpoint("last")
    rows = [r for r in read_metrics(out / "metrics.csv") if r.get("val_loss") is not None]
    assert [r["step"] for r in rows][-1] == 4
    config = json.loads((out / "config.json").read_text())
    assert config["data"]["name"] == "count" and config["model"]["family"] == "decoder"
    assert config["model"]["vocab_size"] == 16  # from the task (data.synth_vocab), no data read
    assert main(["eval", str(out), "--json"]) == 0  # the run is evaluated by the same task
    assert "val_loss" in json.loads(capsys.readouterr().out)
    assert main(["eval", str(out), "--beam", "2"]) == 2  # what it cannot do: one line
    assert "--beam is for translation runs" in capsys.readouterr().err
    # no other file needed editing: the package's sources are as they were, and the module
    # is the one file the task took
    assert _tree_digest() == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "__pycache__") == [
        "count_task.py", "runs"]


def test_the_new_task_s_name_is_in_every_list_and_a_taken_name_is_refused(count_task):
    with pytest.raises(ConfigError, match="data.name='nope' is not allowed: one of 'embedded',"
                                          " .*'count'"):
        load_config(None, ["data.name=nope"])
    assert data_sets()["count"][0] is count_task.CountTask
    assert "count" not in downloads()  # nothing to download
    with pytest.raises(ValueError, match="declares data set 'count', already CountTask's"):
        registry.register(type("Again", (count_task.CountTask,), {}))


def test_every_registered_data_set_has_one_entry():
    declared = [(cls, ds.name) for cls in registry.REGISTRY for ds in cls.datasets]
    names = [name for _, name in declared]
    assert len(names) == len(set(names))  # no name twice, in any two classes
    assert {name: cls for cls, name in declared} == {n: c for n, (c, _) in data_sets().items()}
    assert {"embedded", "shakespeare", "multi30k", "sst2", "copy", "reverse", "sort"} \
        <= set(names)
    assert [ds.name for _, ds in data_sets().values() if ds.default] == ["embedded"]
    for name, (cls, ds) in data_sets().items():
        assert ds.about and cls.family in ("decoder", "encoder", "encoder_decoder")
        # a data set's files name data keys, and come from its download
        assert set(ds.files) <= {f.name for f in RunConfig().data.__dataclass_fields__.values()}
        assert not ds.files or {f.name for f in ds.download.files} >= set(ds.files.values())
        rc = load_config(None, [f"data.name={name}"])
        assert task_class(rc) is cls and resolve_data(rc) == rc


def test_data_list_and_data_fetch_name_the_fetchable_data_sets(capsys):
    fetchable = [n for n, (_, ds) in data_sets().items() if ds.download is not None]
    assert fetchable == list(downloads()) and set(fetchable) == {"shakespeare", "multi30k",
                                                                  "sst2"}
    assert main(["data", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("\t")[0] for line in lines] == fetchable
    for name in ("copy", "embedded", "imagenet"):
        assert main(["data", "fetch", name]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.endswith(
            "allowed: " + ", ".join(fetchable)), err


def _pairs_dir(path: Path) -> str:
    path.mkdir()
    (path / MANIFEST).write_text(json.dumps({"format": FORMAT, "kind": KIND}))
    return str(path)


@pytest.mark.parametrize(("data", "model", "task", "name"), [
    ({}, {}, LMTask, "embedded"),  # no file: the default data set, recorded
    ({"path": "notes.txt"}, {}, LMTask, ""),
    ({"path": "corpus_dir"}, {}, LMTask, ""),
    ({"mix": [{"path": "a.txt", "weight": 1}]}, {}, LMTask, ""),
    ({"path": "train.tsv"}, {}, ClassifyTask, ""),
    ({"path": "TRAIN.TSV"}, {}, ClassifyTask, ""),
    ({"path": "train.tsv"}, {"head": "mlm", "family": "encoder"}, MaskedLMTask, ""),
    ({"src_path": "a.de", "tgt_path": "a.en"}, {}, TranslationTask, ""),
    ({"path": "PAIRS"}, {}, TranslationTask, ""),
    ({}, {"family": "encoder"}, ClassifyTask, ""),  # model.family picks the own-files task
    ({}, {"family": "encoder_decoder"}, TranslationTask, ""),
    ({"path": "corpus.tsv"}, {"family": "decoder"}, LMTask, ""),  # a .tsv corpus for an LM
    ({"name": "reverse"}, {}, SyntheticTask, "reverse"),
])
def test_without_a_name_the_files_decide_the_task(tmp_path, data, model, task, name):
    if data.get("path") == "PAIRS":
        data = {"path": _pairs_dir(tmp_path / "pairs")}
    rc = RunConfig.from_dict({"data": data, "model": model})
    assert task_class(rc) is task
    assert resolve_data(rc).data.name == name


def test_files_of_two_kinds_and_a_bad_name_are_one_config_error(capsys):
    with pytest.raises(ConfigError, match=r"name files of several kinds \((classification|"
                                          r"translation), (classification|translation)\)"):
        task_class(RunConfig.from_dict({"data": {"path": "a.tsv", "src_path": "a.de",
                                                 "tgt_path": "a.en"}}))
    assert main(["train", "--set", "data.name=nope", "--out", "never"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "data.name='nope' is not allowed: one of " in err
    assert not Path("never").exists()


@pytest.mark.parametrize(("old", "family"), [("text", "decoder"), ("tsv", "encoder"),
                                             ("parallel", "encoder_decoder")])
def test_the_old_own_files_names_read_as_today_s(old, family, capsys):
    rc = RunConfig.from_dict({"data": {"name": old}})
    assert rc.data.name == "" and rc.model.family == family and "model.family" in rc.explicit
    kept = RunConfig.from_dict({"data": {"name": old}, "model": {"family": "decoder"}})
    assert kept.model.family == "decoder"  # a family given stays
    assert main(["train", "--set", f"data.name={old}", "--print-config", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)  # the new spelling is what is recorded
    assert printed["data"]["name"] == "" and printed["model"]["family"] == family


def test_a_run_dir_with_an_old_name_samples_and_resumes(tmp_path, capsys):
    text = tmp_path / "story.txt"
    text.write_text("the quick brown fox jumps over the lazy dog.\n" * 30)
    out = tmp_path / "run"
    assert main(["train", "--set", f"data.path={text}", *TINY, *FAST, "--out", str(out)]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["data"]["name"] == ""  # your files: no data set named
    config["data"]["name"] = "text"  # as a run trained before data.name named data sets only
    (out / "config.json").write_text(json.dumps(config))
    capsys.readouterr()
    assert main(["sample", str(out), "--prompt", "the", "--max-new-tokens", "5"]) == 0
    assert capsys.readouterr().out.startswith("the")
    assert main(["train", "--out", str(out), "--resume", "--set", "train.max_steps=6"]) == 0
    assert "step 6" in capsys.readouterr().out
    assert json.loads((out / "config.json").read_text())["data"]["name"] == ""

"""What a new user meets first: the recipes that ship in the wheel (`attnlab recipes`,
`attnlab train NAME` where attnlab is installed), `--version`, `train --print-config` and
`--seed`, `-v` after any command, help for every command, Ctrl-C in training, eval's progress
bar, and the library's two front-door functions."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest

import attnlab
from _runs import TEXT, lm_run
from attnlab.cli import build_parser, main
from attnlab.recipes import RECIPES, describe, find_recipe, shipped
from attnlab.runs import RunDir
from attnlab.train import load_config

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--set", "model.d_model=16", "--set", "model.n_heads=2", "--set", "model.n_layers=1",
        "--set", "train.precision=fp32", "--set", "train.progress=false",
        "--set", "train.tensorboard=false", "--set", "train.batch_size=4",
        "--set", "data.val_size=8"]


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


# ---- recipes ------------------------------------------------------------------------------
def test_the_recipes_are_package_data_and_nothing_reads_a_configs_folder_of_the_repo():
    assert RECIPES == Path(attnlab.__file__).parent / "recipes"
    assert {"copy", "demo", "reverse", "shakespeare_char", "sst2"} <= set(shipped())
    tracked = subprocess.run(["git", "-C", str(ROOT), "ls-files", "configs"],
                             capture_output=True, text=True)
    assert tracked.returncode != 0 or tracked.stdout == ""  # the repo ships no configs/
    assert "recipes/*.toml" in (ROOT / "pyproject.toml").read_text()
    # a path built from the root of the checkout (its configs folder) is what
    # an installed wheel lacks
    pattern = re.compile(r'(ROOT|parents\[\d\]|parent) / "configs"')
    for folder in ("src", "benchmarks", "tests"):
        for path in (ROOT / folder).rglob("*.py"):
            if path != Path(__file__).resolve():  # (this file says it here)
                assert not pattern.search(path.read_text(encoding="utf-8")), path


def _entries(out: str) -> dict[str, str]:
    """`attnlab recipes`' output: name -> its description, the wrapped lines joined."""
    entries: dict[str, str] = {}
    for line in out.splitlines():
        if line.startswith(" "):
            name = list(entries)[-1]
            entries[name] += " " + line.strip()
        else:
            name, _, text = line.partition(" ")
            entries[name] = text.strip()
    return entries


def test_recipes_lists_each_recipe_with_its_whole_first_sentence_wrapped(capsys):
    code, out, err = run_cli(capsys, "recipes")
    assert code == 0 and err == ""
    by_name = _entries(out)
    assert list(by_name) == sorted(shipped())
    assert all(len(line) <= 100 for line in out.splitlines())
    assert "Synthetic seq2seq: copy sequences" in by_name["copy"]
    assert by_name["multi30k_de_en"].startswith("German -> English on Multi30k: the "
                                                "encoder-decoder of the paper")
    for name, text in by_name.items():  # whole sentences, never cut
        assert text.endswith(".") and "..." not in text, (name, text)
        assert text == describe(shipped()[name]), name
    assert "character-level language model" in by_name["demo"]  # what the demo trains
    assert "pydoc_data" in by_name["demo"]


def test_recipes_name_prints_the_recipe_as_shipped(capsys):
    code, out, err = run_cli(capsys, "recipes", "sst2")
    assert code == 0 and err == ""
    assert out == (RECIPES / "sst2.toml").read_text(encoding="utf-8")
    assert out.startswith("# SST-2 sentiment") and tomllib.loads(out)["model"]["family"] == \
        "encoder"
    code, out, err = run_cli(capsys, "recipes", "nosuch")
    assert code == 2 and out == "" and len(err.splitlines()) == 1 and "recipes: copy" in err


def test_a_recipe_of_the_working_directory_comes_first(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert find_recipe("copy") == RECIPES / "copy.toml"
    assert find_recipe("configs/reverse.toml") == RECIPES / "reverse.toml"  # the README's form
    (tmp_path / "configs").mkdir()
    mine = tmp_path / "configs" / "copy.toml"
    mine.write_text("# My own copy task.\n" + (RECIPES / "copy.toml").read_text())
    (tmp_path / "configs" / "extra.toml").write_text("# A recipe of my own.\n[model]\n")
    assert find_recipe("copy") == Path("configs/copy.toml")
    assert find_recipe("configs/copy.toml") == Path("configs/copy.toml")
    assert find_recipe(str(mine)) == mine  # a path as given
    code, out, _ = run_cli(capsys, "recipes")
    lines = {line.split()[0]: line for line in out.splitlines()}
    assert "My own copy task." in lines["copy"] and "[configs/copy.toml]" in lines["copy"]
    assert "A recipe of my own." in lines["extra"] and "reverse" in lines
    with pytest.raises(FileNotFoundError, match="recipes: copy, demo, extra, .*`attnlab recipes`"):
        find_recipe("nosuch")
    # a folder named like a recipe is none; a recipe that is not UTF-8 text is one line, in
    # the list and as a name, file or training config alike
    (tmp_path / "configs" / "dir.toml").mkdir()
    assert "dir" not in {line.split()[0] for line in run_cli(capsys, "recipes")[1].splitlines()}
    (tmp_path / "configs" / "latin.toml").write_bytes(b"# Caf\xe9 au lait.\n[model]\n")
    for argv in (["recipes"], ["recipes", "latin"], ["recipes", "configs/latin.toml"],
                 ["train", "latin"], ["info", "latin"]):
        code, out, err = run_cli(capsys, *argv)
        assert code == 2 and out == "" and err.count("\n") == 1, (argv, err)
        assert "config file configs/latin.toml is not UTF-8 text (invalid continuation byte " \
               "at byte 5)" in err, (argv, err)


def test_describe_takes_the_first_sentence_of_the_leading_comments(tmp_path):
    recipe = tmp_path / "r.toml"
    recipe.write_text("# Short one (v1.5 of it).\n# More.\n[model]\n")
    assert describe(recipe) == "Short one (v1.5 of it)."
    recipe.write_text("# Headline: then a long explanation " + "word " * 40 + "\n[model]\n")
    assert describe(recipe) == "Headline: then a long explanation" + " word" * 40  # whole
    recipe.write_text("[model]\n# not a description\n")
    assert describe(recipe) == ""


@pytest.mark.slow
def test_the_wheel_ships_the_recipes_and_trains_one_outside_the_repo(tmp_path):
    """The wheel, built from the package's files, installed into a fresh venv (no downloads:
    the venv sees this one's packages through a .pth line), trains a shipped recipe in a
    folder that has no configs/."""
    src = tmp_path / "src"  # a copy: the build writes build/ and egg-info beside its input
    shutil.copytree(ROOT / "src", src / "src",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    pip = [sys.executable, "-m", "pip"]
    quiet = dict(capture_output=True, text=True, timeout=600)
    built = subprocess.run([*pip, "wheel", str(src), "--no-deps", "--no-build-isolation",
                            "-w", str(tmp_path / "dist")], **quiet)
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("attnlab-*.whl")
    venv = tmp_path / "venv"
    made = subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], **quiet)
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()"
                           "['purelib'])"], **quiet).stdout.strip()
    here = subprocess.run([sys.executable, "-c", "import sysconfig; print(sysconfig.get_paths()"
                           "['purelib'])"], **quiet).stdout.strip()
    Path(site, "_outer_site.pth").write_text(here + "\n")  # torch & co.; not the editable
    installed = subprocess.run([*pip, "--python", str(python), "install", "--no-deps",
                                "--no-index", str(wheel)], **quiet)
    assert installed.returncode == 0, installed.stderr[-2000:]
    away = tmp_path / "elsewhere"
    away.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    cli = str(venv / "bin" / "attnlab")

    def attnlab_cmd(*argv):
        return subprocess.run([cli, *argv], cwd=away, env=env, **quiet)

    where = subprocess.run([str(python), "-c", "import attnlab; print(attnlab.__file__)"],
                           cwd=away, env=env, **quiet).stdout.strip()
    assert where.startswith(site) and str(ROOT) not in where  # the wheel's, not the checkout's
    p = attnlab_cmd("--version")
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert p.stdout.strip() == f"attnlab {declared}"
    p = attnlab_cmd("recipes")
    assert p.returncode == 0 and list(_entries(p.stdout)) == sorted(shipped()), p.stderr
    assert "copy" in p.stdout and "shakespeare_char" in p.stdout
    p = attnlab_cmd("train", "copy", "--set", "train.max_steps=2", "--set", "train.eval_every=2",
                    *TINY, "--out", "run")
    assert p.returncode == 0, p.stderr[-2000:]
    assert "step 2" in p.stdout and RunDir(away / "run").has_checkpoint("last")


# ---- recipe cards -----------------------------------------------------------------------------
CARD_COLUMNS = ("machine", "reaches", "time", "date", "commit", "command")


def card_problems(page: str, names: set[str], known_commit=lambda sha: True) -> list[str]:
    """What is wrong with the recipe cards of ``page`` (docs/recipes.md): each recipe of
    ``names`` has a ``## `NAME` `` section whose first table has the columns CARD_COLUMNS and at
    least one row, each row with every column filled, a YYYY-MM-DD date, a commit that
    ``known_commit`` knows, and a command that names the recipe; no card without a recipe."""
    problems = []
    cards = dict(re.findall(r"^## `([\w-]+)`\n(.*?)(?=^## |\Z)", page, re.M | re.S))
    problems += [f"no card for recipe {n}" for n in sorted(names - set(cards))]
    problems += [f"card for {n}, which is no shipped recipe" for n in sorted(set(cards) - names)]
    for name, body in cards.items():
        table = re.search(r"(?:^\|.*\n?)+", body, re.M)  # the card's first table
        rows = [[c.strip() for c in line.strip().strip("|").split("|")]
                for line in (table.group(0).splitlines() if table else [])]
        if not rows or tuple(c.lower() for c in rows[0]) != CARD_COLUMNS:
            problems.append(f"{name}: the table's columns are not {', '.join(CARD_COLUMNS)}")
            continue
        measured = rows[2:]
        if not measured:
            problems.append(f"{name}: no measurement")
        for row in measured:
            cell = dict(zip(CARD_COLUMNS, row))
            if len(row) != len(CARD_COLUMNS) or not all(row):
                problems.append(f"{name}: a row with an empty cell: {row}")
            elif not re.fullmatch(r"\d{4}-\d{2}-\d{2}", cell["date"]):
                problems.append(f"{name}: date {cell['date']!r} is not YYYY-MM-DD")
            elif not (re.fullmatch(r"[0-9a-f]{7,40}", cell["commit"])
                      and known_commit(cell["commit"])):
                problems.append(f"{name}: commit {cell['commit']!r} is not one of this repo")
            elif name not in cell["command"]:
                problems.append(f"{name}: the command does not name the recipe")
    return problems


def _in_history(sha: str) -> bool:
    res = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{sha}^{{commit}}"],
                         capture_output=True)
    return res.returncode == 0


def test_every_shipped_recipe_has_a_measured_card_in_the_docs():
    page = (ROOT / "docs" / "recipes.md").read_text(encoding="utf-8")
    in_git = (ROOT / ".git").exists()
    assert card_problems(page, set(shipped()), _in_history if in_git else lambda sha: True) == []


def test_the_card_check_fails_on_a_missing_card_field_date_or_commit():
    head = "| " + " | ".join(CARD_COLUMNS) + " |\n" + "| --- " * len(CARD_COLUMNS) + "|\n"
    good = "| Xeon | 99% | 60 s | 2026-11-26 | abcdef1 | `attnlab train copy` |\n"
    assert card_problems("## `copy`\n\nCopies.\n\n" + head + good, {"copy"}) == []
    assert card_problems("## `copy`\n" + head + good, {"copy", "sort"}) == [
        "no card for recipe sort"]
    assert "no measurement" in card_problems("## `copy`\n" + head, {"copy"})[0]
    assert "empty cell" in card_problems("## `copy`\n" + head + good.replace("60 s", " "),
                                         {"copy"})[0]
    assert "YYYY-MM-DD" in card_problems("## `copy`\n" + head + good.replace(
        "2026-11-26", "today"), {"copy"})[0]
    assert "not one of this repo" in card_problems("## `copy`\n" + head + good, {"copy"},
                                                   lambda sha: False)[0]
    assert "name the recipe" in card_problems("## `copy`\n" + head + good.replace(
        "train copy", "train sort"), {"copy"})[0]
    assert "columns" in card_problems("## `copy`\n| a | b |\n| - | - |\n", {"copy"})[0]


# ---- version, changelog ---------------------------------------------------------------------
def test_version_prints_the_installed_version(capsys):
    code, out, err = run_cli(capsys, "--version")
    assert code == 0 and out == f"attnlab {version('attnlab')}\n" and err == ""


def test_the_version_is_one_number_everywhere_and_the_changelog_has_it():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert declared == attnlab.__version__ == "0.2.0"
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    releases = re.findall(r"^## \[(\d+\.\d+\.\d+)\]", changelog, flags=re.M)
    assert releases == ["0.2.0", "0.1.0"]  # newest first
    newest = changelog.split("## [0.2.0]")[1].split("## [0.1.0]")[0]
    for what in ("attnlab data prepare", "tiktoken", "documentation site", "wheel"):
        assert what in newest, what


# ---- train --print-config, --seed; config errors -------------------------------------------
def test_print_config_prints_the_resolved_config_and_writes_nothing(tmp_path, monkeypatch,
                                                                    capsys):
    monkeypatch.chdir(tmp_path)
    argv = ["train", "copy", "--set", "train.lr=0.001", "--seed", "7", "--print-config"]
    code, out, err = run_cli(capsys, *argv)
    assert code == 0 and err == ""
    assert os.listdir(tmp_path) == []  # no runs/, nothing else
    want = load_config(RECIPES / "copy.toml", ["train.lr=0.001", "train.seed=7"])
    (tmp_path / "printed.toml").write_text(out)
    assert load_config(tmp_path / "printed.toml") == want  # a recipe that reads back the same
    assert tomllib.loads(out)["train"]["seed"] == 7
    code, out, _ = run_cli(capsys, *argv, "--json")
    assert code == 0 and json.loads(out) == want.to_dict()
    (tmp_path / "printed.toml").unlink()
    code, _, err = run_cli(capsys, "train", "copy", "--json")
    assert code == 2 and "--json is for --print-config" in err and os.listdir(tmp_path) == []


@pytest.mark.parametrize(("recipe", "absent", "present"), [
    ("demo", {"model.head", "model.n_classes", "model.pooling", "model.n_decoder_layers",
              "data.src_path", "data.holdout", "data.synth_vocab", "data.pre_tokenizer",
              "train.max_tokens"}, {"model.tie_embeddings", "data.path", "train.samples"}),
    ("sst2", {"model.n_decoder_layers", "data.src_path", "data.mix", "train.samples",
              "train.max_tokens"}, {"data.holdout_unit", "data.pre_tokenizer"}),
    ("multi30k_de_en", {"model.head", "model.pooling", "data.holdout", "train.samples",
                        "train.batch_size"}, {"data.src_add_special", "train.max_tokens"}),
])
def test_print_config_shows_the_keys_of_the_run_with_the_recipe_s_comments(
        recipe, absent, present, tmp_path, capsys):
    """Only the keys the run's family and task read (and those the recipe gives), with the
    recipe's comments beside their keys; it reads back to the same config, and a model size
    taken from the data stays a comment (left for training to fill in)."""
    code, out, err = run_cli(capsys, "train", recipe, "--set", "train.lr=0.0005",
                             "--print-config")
    assert code == 0 and err == ""
    read = tomllib.loads(out)
    keys = {f"{s}.{k}" for s, table in read.items() for k in table}
    assert not keys & absent, keys & absent
    assert present <= keys, present - keys
    assert "model.vocab_size" not in keys and "# vocab_size = (filled in from the data)" in out
    text = shipped()[recipe].read_text(encoding="utf-8")
    comments = [line.strip() for line in text.splitlines() if line.strip().startswith("#")]
    printed = [line.strip() for line in out.splitlines()]
    assert comments and all(c in printed or any(p.endswith(c) for p in printed)
                            for c in comments)
    (tmp_path / "printed.toml").write_text(out)
    want = load_config(shipped()[recipe], ["train.lr=0.0005"])
    assert load_config(tmp_path / "printed.toml") == want
    code, again, _ = run_cli(capsys, "train", str(tmp_path / "printed.toml"), "--print-config")
    assert code == 0 and tomllib.loads(again) == read


def test_seed_sets_train_seed_and_wins_over_set(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "reverse", *TINY, "--set", "train.max_steps=1", "--set",
                 "train.seed=3", "--seed", "11", "--out", str(out)]) == 0
    capsys.readouterr()
    assert RunDir(out).read_config()["train"]["seed"] == 11
    code, _, err = run_cli(capsys, "train", "reverse", "--seed", "-1", "--print-config")
    assert code == 2 and "train.seed" in err and len(err.splitlines()) == 1


# ---- -v everywhere, help for every command --------------------------------------------------
def _parsers(parser, prefix=("attnlab",)):
    for action in parser._actions:
        if hasattr(action, "choices") and isinstance(action.choices, dict):
            for name, sub in action.choices.items():
                yield (*prefix, name), sub
                yield from _parsers(sub, (*prefix, name))


def test_every_command_takes_v_after_it_and_has_a_description():
    parser = build_parser()
    commands = list(_parsers(parser))
    assert ("attnlab", "viz", "attention") in [c for c, _ in commands]
    for words, sub in commands:
        assert sub.description, " ".join(words)
        assert "-v" in sub._option_string_actions, " ".join(words)
    args, extra = parser.parse_known_args(["sample", "run", "-v", "--prompt", "x"])
    assert args.verbose and not extra
    args, _ = parser.parse_known_args(["-v", "sample", "run", "--prompt", "x"])
    assert args.verbose  # before the command: not undone by the command's own -v default
    args, _ = parser.parse_known_args(["sample", "run", "--prompt", "x"])
    assert not args.verbose


def test_sample_accepts_v(tmp_path, capsys):
    run = lm_run(tmp_path / "lm")
    code, out, err = run_cli(capsys, "sample", run, "-v", "--prompt", "the", "--max-new-tokens",
                             3, "--seed", 0)
    assert code == 0 and out.startswith("the"), err


def test_viz_attention_help_says_what_it_draws(capsys):
    code, out, _ = run_cli(capsys, "viz", "attention", "--help")
    assert code == 0 and "heatmaps" in out and "HTML" in out


# ---- Ctrl-C in training ---------------------------------------------------------------------
def test_an_interrupted_training_says_what_the_checkpoint_holds_and_how_to_resume(
        tmp_path, monkeypatch, capsys):
    from attnlab.train.loop import Trainer

    step = Trainer.train_step

    def interrupted(self):
        if self.step == 3:  # steps 1-3 done, each evaluated and checkpointed
            raise KeyboardInterrupt
        return step(self)

    monkeypatch.setattr(Trainer, "train_step", interrupted)
    out = tmp_path / "my run"
    code, _, err = run_cli(capsys, "train", "reverse", *TINY, "--set", "train.max_steps=5",
                           "--set", "train.eval_every=1", "--out", out)
    assert code == 130
    assert err.strip() == (f"attnlab train: interrupted; the last checkpoint ({out}/last) "
                           f"holds step 3; resume with: attnlab train --out '{out}' --resume")
    monkeypatch.setattr(Trainer, "train_step", step)
    command = shlex.split(err.split("resume with: ")[1])
    assert command[:2] == ["attnlab", "train"]
    code, printed, err = run_cli(capsys, *command[1:])  # the command as printed goes on
    assert code == 0 and "step 5" in printed, err


def test_an_interrupt_before_any_checkpoint_says_so(tmp_path, monkeypatch, capsys):
    from attnlab.train.loop import Trainer

    def interrupted(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(Trainer, "train_step", interrupted)
    code, _, err = run_cli(capsys, "train", "reverse", *TINY, "--out", tmp_path / "run")
    assert code == 130 and "before the first checkpoint" in err and "nothing to resume" in err
    assert len(err.strip().splitlines()) == 1


# what gloo raises in a process whose peer ended in the middle of a collective (torch 2.13)
GLOO_PEER_GONE = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] "
                  "Connection closed by peer [127.0.0.1]:27306. This is typically caused by a "
                  "remote worker crashing. Check the logs of the remote worker before reporting "
                  "an error.")


def test_a_process_that_loses_another_under_torchrun_says_so_and_how_to_resume(
        tmp_path, monkeypatch, capsys):
    """Under torchrun, a process whose partner ended (killed, out of memory) mid-collective is
    not a bug here: one line naming the backend's words, the checkpoint and the resume
    command; any other RuntimeError stays a bug (its traceback, exit 1)."""
    import attnlab.train
    from attnlab.train import distributed

    out = tmp_path / "my run"
    code, _, err = run_cli(capsys, "train", "reverse", *TINY, "--set", "train.max_steps=3",
                           "--set", "train.eval_every=3", "--out", out)
    assert code == 0, err

    def lost(*args, **kwargs):
        raise RuntimeError(GLOO_PEER_GONE)

    monkeypatch.setattr(attnlab.train, "train_run", lost)
    monkeypatch.setattr(distributed, "env_info", lambda: distributed.DistInfo(1, 4, 1, True))
    code, _, err = run_cli(capsys, "train", "--out", out, "--resume")
    assert code == 2
    assert err.strip() == (
        "attnlab train: error: process 1 of 4 lost another process of the run (Connection "
        "closed by peer [127.0.0.1]:27306): that process's output says why it ended; the last "
        f"checkpoint ({out}/last) holds step 3; resume with: attnlab train --out '{out}' "
        "--resume")
    code, _, err = run_cli(capsys, "train", "reverse", *TINY, "--out", tmp_path / "new")
    assert code == 2 and err.strip().endswith(
        "no checkpoint was written: run the same command again to start over"), err

    def bug(*args, **kwargs):
        raise RuntimeError("shape mismatch")

    monkeypatch.setattr(attnlab.train, "train_run", bug)
    code, _, err = run_cli(capsys, "train", "--out", out, "--resume")
    assert code == 1 and "Traceback" in err and "internal error" in err


# ---- eval progress --------------------------------------------------------------------------
def test_eval_shows_a_progress_bar_on_request_and_nothing_otherwise(tmp_path, capsys):
    run = lm_run(tmp_path / "lm")
    text = tmp_path / "held_out.txt"
    text.write_text(TEXT * 30)
    code, out, err = run_cli(capsys, "eval", run, "--data", text, "--json")
    assert code == 0 and err == ""  # not a terminal: no bar
    plain = json.loads(out)
    code, out, err = run_cli(capsys, "eval", run, "--data", text, "--json", "--progress")
    assert code == 0 and json.loads(out) == plain
    assert re.search(r"eval data: .*\d+ ?batch", err), err


# ---- the library's front door ---------------------------------------------------------------
def test_load_run_and_generate_text_at_the_top_level_as_the_docstring_shows(tmp_path, capsys):
    from attnlab.decoding import generate_text
    from attnlab.runs import load_run

    assert attnlab.load_run is load_run and attnlab.generate_text is generate_text
    assert {"load_run", "generate_text"} <= set(attnlab.__all__) & set(dir(attnlab))
    run = lm_run(tmp_path / "lm")
    example = attnlab.__doc__.split("::\n", 1)[1].split("\n\n", 2)
    code = "\n".join(line[4:] for part in example[:2] for line in part.splitlines())
    assert "attnlab.load_run(" in code and "attnlab.generate_text(" in code
    exec(code.replace("runs/shakespeare_char", str(run)).replace('"ROMEO:"', '"the "'), {})
    assert capsys.readouterr().out.strip()  # the continuation

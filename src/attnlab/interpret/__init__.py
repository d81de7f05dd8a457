"""Looking inside a model: hook sites read and changed through one small API
(:mod:`~attnlab.interpret.hooks`), and the analyses built on them."""

from __future__ import annotations

from .ablation import Ablation, Batch, ablate, lm_batch, row_loss, seq2seq_batch, text_batch
from .heads import HeadScores, head_scores
from .hooks import (
    ActivationCache,
    AttentionMaps,
    Edit,
    attention_maps,
    hooks,
    run_with_cache,
    select,
    sites_of,
    zero_heads,
)
from .lens import Attribution, LogitLens, direct_logit_attribution, logit_lens
from .patching import Patching, patch
from .rollout import attention_rollout

__all__ = ["ActivationCache", "AttentionMaps", "Edit", "attention_maps", "hooks",
           "run_with_cache", "select", "sites_of", "zero_heads"]
__all__ += ["Attribution", "LogitLens", "direct_logit_attribution", "logit_lens"]
__all__ += ["Ablation", "Batch", "Patching", "ablate", "lm_batch", "patch", "row_loss",
            "seq2seq_batch", "text_batch"]
__all__ += ["HeadScores", "attention_rollout", "head_scores"]

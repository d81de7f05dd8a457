"""Looking inside a model: hook sites read and changed through one small API
(:mod:`~attnlab.interpret.hooks`), and the analyses built on them."""

from __future__ import annotations

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

__all__ = ["ActivationCache", "AttentionMaps", "Edit", "attention_maps", "hooks",
           "run_with_cache", "select", "sites_of", "zero_heads"]

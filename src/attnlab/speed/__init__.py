"""The speed layer: every choice made for speed alone, none of which changes a result beyond
float rounding (the CPU dropout draws other masks than ``F.dropout``, by the same law). The
core (:mod:`attnlab.nn`, :mod:`attnlab.models`) imports nothing from here; the trainer and
the decoding loops apply these around a model.

* :mod:`~attnlab.speed.probe`: which of a few ways is fastest, measured once per machine and
  cached (:func:`fastest`, :func:`machine_key`); training's ``precision = "auto"`` uses it too.
* :mod:`~attnlab.speed.attention`: attention kernels for bf16/fp16 on a CPU, put into each
  :class:`~attnlab.nn.MultiHeadAttention`'s ``sdpa`` slot (:func:`use_cpu_sdpa`,
  :func:`cpu_sdpa_in`).
* :mod:`~attnlab.speed.dropout`: dropout for CPUs from a quarter of the random draws, put
  into the ``drop`` slot of each module that drops (:func:`use_cpu_dropout`, :func:`cpu_dropout`).
* :mod:`~attnlab.speed.loss`: the output projection fused with its loss, put into a
  model's ``head_loss`` slot (:func:`use_fused_loss`, :func:`linear_cross_entropy`).
* :mod:`~attnlab.speed.memory`: freed memory kept in the process for the next training step
  or evaluation batch on a CPU, not handed back to the system and faulted in again
  (:func:`keep_freed_memory`).
* :mod:`~attnlab.speed.decoding`: what decoding steps run in (:func:`decoding_kernels`,
  :func:`direct_attributes`) and the weights' memory order (:func:`inference_layout`,
  :func:`layout_pays`).
"""

from .attention import cpu_sdpa, cpu_sdpa_in, use_cpu_sdpa
from .decoding import decoding_kernels, direct_attributes, inference_layout, layout_pays
from .dropout import cpu_dropout, use_cpu_dropout
from .loss import linear_cross_entropy, use_fused_loss
from .memory import keep_freed_memory
from .probe import fastest, machine_key

__all__ = ["cpu_dropout", "cpu_sdpa", "cpu_sdpa_in", "decoding_kernels", "direct_attributes",
           "fastest", "inference_layout", "keep_freed_memory", "layout_pays",
           "linear_cross_entropy", "machine_key", "use_cpu_dropout", "use_cpu_sdpa",
           "use_fused_loss"]

"""Data-parallel training under ``torchrun``: process group set-up, batch sharding, reductions.

The same ``attnlab train`` command runs as one process or as K under ``torchrun``; every
process draws the same global micro-batch and keeps its own rows (:func:`shard`), so K
processes train exactly the model one process would train on the whole batch. Only rank 0
writes files, except the shards of a sharded checkpoint.

How the model is spread (:func:`wrap`): ``train.parallel = "ddp"`` copies it to every process,
``"fsdp"`` shards it (FSDP2); :func:`checkpoint_blocks` recomputes each block's activations in
the backward pass (``train.activation_checkpointing``).
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from ..errors import ConfigError, UsageError


@dataclass(frozen=True)
class DistInfo:
    """Where this process stands in the group (rank 0 of 1 without torchrun)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    launched: bool = False  # started by torchrun (one process included)

    @property
    def enabled(self) -> bool:
        return self.world_size > 1 or self.launched

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def env_info() -> DistInfo:
    """Rank and world size from torchrun's environment variables."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return DistInfo(int(os.environ.get("RANK", "0")), world, int(os.environ.get("LOCAL_RANK", "0")),
                    launched="RANK" in os.environ and "WORLD_SIZE" in os.environ)


def init_distributed(device_type: str, timeout_s: float = 1800) -> DistInfo:
    """Join the process group when launched by torchrun (idempotent); the info otherwise.

    torchrun's ``RANK`` and ``WORLD_SIZE`` switch DDP on (gloo on CPU, nccl on CUDA), for one
    process too, as in nanoGPT: one process under torchrun takes the path K processes take.
    ``timeout_s`` (``train.dist_timeout_s``) bounds the wait for the other processes, here and
    at each collective operation.

    Raises:
        UsageError: the group did not form within ``timeout_s`` (a process, or a machine,
            that never joined): one line naming the address the processes meet at.
    """
    info = env_info()
    if info.enabled and not dist.is_initialized():
        _release_left()
        backend = "nccl" if device_type == "cuda" else "gloo"
        if device_type == "cuda":
            torch.cuda.set_device(info.local_rank)
        try:
            dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_s))
        except dist.DistError as e:
            where = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
            said = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise UsageError(
                f"process {info.rank} of {info.world_size} waited train.dist_timeout_s="
                f"{timeout_s:g} s for the others at {where} ({said}): check that every machine "
                "runs the same command (torchrun --nnodes, --rdzv-endpoint) and can reach that "
                "address (firewall; GLOO_SOCKET_IFNAME or NCCL_SOCKET_IFNAME), or raise "
                "train.dist_timeout_s") from None
    return info


# what gloo says when the process at the other end of a connection has ended
_PROCESS_GONE = ("Connection closed by peer", "Connection reset by peer", "remote worker crashing")


def lost_process(e: BaseException) -> str | None:
    """The backend's own words when ``e`` says another process of the group ended in the middle
    of a collective ("Connection closed by peer [127.0.0.1]:27306"), else None. Not a bug of
    this process: the other one's output says why it ended."""
    text = " ".join(str(e).split())
    if not isinstance(e, RuntimeError) or not any(p in text for p in _PROCESS_GONE):
        return None
    return text.split("] ", 1)[-1].split(". ")[0]  # (after the source file's "[pair.cc:553] ")


def describe(info: DistInfo, parallel: str = "ddp") -> str:
    """", K processes (DDP, backend)" (or FSDP) for the start-of-run line; "" without
    torchrun."""
    if not info.enabled:
        return ""
    backend = dist.get_backend() if dist.is_initialized() else "no process group"
    return (f", {info.world_size} process{'es' * (info.world_size > 1)} "
            f"({parallel.upper()}, {backend})")


# The groups cleanup() left, held until the models that used them are gone. DDP's reducer (C++)
# holds its group too; were it the last holder, the group would be destroyed when the model is,
# joining gloo's worker threads while holding Python's lock, which a worker may be waiting for to
# free the tensors of a collective that has just finished: a hang at exit, now and then.
# Released by _release_left, where the group's destructor lets go of that lock first.
_LEFT: list[Any] = []


def cleanup() -> None:
    """Leave the process group, if this process joined one."""
    global _HOST_GROUP
    if dist.is_available() and dist.is_initialized():
        _LEFT.extend(g for g in (dist.group.WORLD, _HOST_GROUP) if g is not None)
        dist.destroy_process_group()  # every group, the host one too
    _HOST_GROUP = None


@atexit.register
def _release_left() -> None:
    """Let go of the groups left (at exit, and before joining a new group): the models that
    used them are collected first."""
    if _LEFT:
        gc.collect()
        _LEFT.clear()


def shard(batch: tuple[Tensor, ...], info: DistInfo) -> tuple[Tensor, ...]:
    """This process's rows (rank, rank + K, ...) of every tensor of a global batch."""
    if not info.enabled:
        return batch
    rows = batch[0].size(0)
    if rows < info.world_size:
        raise ConfigError(f"a batch of {rows} rows cannot be split over {info.world_size} "
                         "processes: raise train.batch_size (or train.max_tokens)")
    return tuple(t[info.rank::info.world_size] for t in batch)


def all_reduce_sum(t: Tensor, info: DistInfo) -> Tensor:
    """Sum of ``t`` over processes (in place; returns ``t``)."""
    if info.enabled:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


_HOST_GROUP: Any = None  # a gloo group of every process, for host tensors beside NCCL


def _host_group() -> Any:
    """The process group that reduces host (CPU) tensors: the default one under gloo, one
    gloo group made at the first call otherwise (every process calls it at the same point)."""
    global _HOST_GROUP
    if dist.get_backend() == "gloo":
        return None
    if _HOST_GROUP is None:
        _HOST_GROUP = dist.new_group(backend="gloo")
    return _HOST_GROUP


def any_process(flag: bool, info: DistInfo) -> bool:
    """Whether ``flag`` holds in any process (``flag`` itself without processes): one number
    all-reduced on the host, over gloo (beside NCCL, gloo's own group), so no process waits
    for its GPU's queue."""
    if not info.enabled:
        return flag
    t = torch.tensor([int(flag)])
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=_host_group())
    return bool(t.item())


def all_gather_objects(obj: Any, info: DistInfo) -> list[Any]:
    """Every process's ``obj`` (picklable), in rank order; ``[obj]`` without processes."""
    if not info.enabled:
        return [obj]
    out: list[Any] = [None] * info.world_size
    dist.all_gather_object(out, obj)
    return out


def blocks(model: nn.Module) -> list[nn.Module]:
    """The residual blocks of ``model``, in order: every encoder and decoder layer of any
    family (what fsdp shards one by one and activation checkpointing recomputes)."""
    from ..nn import ResidualBlock

    return [m for m in model.modules() if isinstance(m, ResidualBlock)]


def checkpoint_blocks(model: nn.Module) -> nn.Module:
    """``train.activation_checkpointing``: each block's forward keeps only its input and runs
    again in the backward pass (``torch.utils.checkpoint``, non-reentrant, the RNG state kept:
    the same dropout masks), in place; returns ``model``. Memory of one block's activations
    instead of all of them, for about one more forward pass of compute."""
    from functools import partial

    from torch.utils.checkpoint import checkpoint

    for block in blocks(model):  # (an instance's forward: the hooks of DDP and fsdp stay outside)
        block.forward = partial(checkpoint, block.forward, use_reentrant=False)
    return model


def wrap(model: nn.Module, info: DistInfo, device: torch.device, parallel: str = "ddp",
         precision: str = "fp32") -> nn.Module:
    """``model`` ready to train over the processes, as it is without them.

    ``ddp``: in ``DistributedDataParallel`` (gradients averaged over the processes).
    ``fsdp``: sharded in place by FSDP2's ``fully_shard``, each block, then the root (the
    embeddings, the head, the final norm); each process keeps 1/K of every parameter, its
    gradient and optimizer moments, and gathers a block's weights just before it runs. Under
    bf16 the gathered weights are bf16 and the gradients are averaged in float32 (the master
    weights and the optimizer stay float32, as under DDP's autocast)."""
    if not info.enabled:
        return model
    if parallel == "fsdp":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        low = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
        policy = MixedPrecisionPolicy(param_dtype=low, reduce_dtype=torch.float32 if low else None)
        for block in blocks(model):
            fully_shard(block, mp_policy=policy)
        return fully_shard(model, mp_policy=policy)
    from torch.nn.parallel import DistributedDataParallel

    ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids)


def load_whole(model: nn.Module, optimizer: torch.optim.Optimizer, whole: nn.Module,
               whole_optimizer: torch.optim.Optimizer) -> None:
    """Copy the weights and optimizer state of an unsharded model (``whole``, a one-process
    run's checkpoint loaded into it) into their fsdp-sharded twins: each process keeps its
    shards of every tensor."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    full = StateDictOptions(full_state_dict=True)
    set_model_state_dict(model, get_model_state_dict(whole), options=full)
    set_optimizer_state_dict(model, optimizer, get_optimizer_state_dict(whole, whole_optimizer),
                             options=full)


@contextlib.contextmanager
def gathered(model: nn.Module) -> Iterator[nn.Module]:
    """fsdp: ``model`` with its whole weights on every process inside (each calls this; one
    copy of the weights, no second model), run by any method any number of times without a
    collective: evaluations, an encoder-decoder's decoding (whose processes decode different
    numbers of steps); sharded again after. Any other model: itself."""
    from torch.distributed.fsdp import FSDPModule

    sharded = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for m in sharded:
        m.unshard()
        m.set_reshard_after_forward(False, recurse=False)  # (a forward then gathers nothing)
    try:
        yield model
    finally:
        for m in sharded:
            m.reshard()
            if m is not model:  # (the root keeps its weights between forward and backward)
                m.set_reshard_after_forward(True, recurse=False)


def whole_state(model: nn.Module) -> dict[str, Tensor]:
    """The weights of fsdp-sharded ``model``, whole, in CPU memory on the first process; an
    empty dict on the others (a collective: every process calls it)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                                cpu_offload=True))


@contextlib.contextmanager
def held_gradients(model: nn.Module, hold: bool) -> Iterator[None]:
    """With ``hold``, the backward passes inside keep their gradients on each process (summed
    there) instead of averaging them over the processes: every micro-batch of a step but the
    last (DDP's ``no_sync``; fsdp's gradient sync off)."""
    if not hold:
        yield
    elif hasattr(model, "no_sync"):  # DistributedDataParallel
        with model.no_sync():
            yield
    else:  # fully_shard
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)


def barrier(info: DistInfo) -> None:
    """Wait until every process gets here (nothing to wait for in one process)."""
    if info.enabled:
        dist.barrier()


# ---- attnlab launch: torchrun, with its failures said in one line ------------------------------
def _option(args: list[str], *names: str) -> str | None:
    """The value of a ``--name VALUE`` / ``--name=VALUE`` option in ``args`` (the last one)."""
    found = None
    for k, arg in enumerate(args):
        for name in names:
            if arg == name and k + 1 < len(args):
                found = args[k + 1]
            elif arg.startswith(name + "="):
                found = arg.split("=", 1)[1]
    return found


def _check_torchrun_args(args: list[str], command: list[str]) -> None:
    """torchrun's options as torchrun parses them, refused in one line (torchrun prints its
    usage, fails an assertion on --nproc-per-node 0 or --nnodes 0, raises on --nproc-per-node
    abc or gpu without a GPU)."""
    import contextlib
    import io

    from torch.distributed.run import (
        determine_local_world_size,
        get_args_parser,
        parse_min_max_nnodes,
    )

    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            parsed = get_args_parser().parse_args([*args, "-m", "attnlab", *command])
    except SystemExit as e:
        if e.code == 0:  # --help: torchrun's help is printed
            raise
        why = said.getvalue().strip().splitlines()[-1:] or ["not torchrun's"]
        raise UsageError(f"torchrun's options {' '.join(args)!r}: "
                         f"{why[0].split('error: ', 1)[-1]} (`torchrun --help` lists them)"
                         ) from None
    nproc, nodes = str(parsed.nproc_per_node), str(parsed.nnodes)
    try:
        low, high = parse_min_max_nnodes(nodes)
    except ValueError:
        low, high = 0, 0
    if not 0 < low <= high:
        raise UsageError(f"--nnodes {nodes} is not allowed: a number of machines >= 1, or "
                         "MIN:MAX (elastic)")
    try:
        count = determine_local_world_size(nproc)
    except ValueError as e:  # abc, 1.5; gpu without a GPU ("Cuda is not available.")
        count, why = 0, f" ({e})" if not str(e).startswith("Unsupported") else ""
    else:
        why = ""
    if count < 1:
        raise UsageError(f"--nproc-per-node {nproc} is not allowed{why}: a number of processes "
                         ">= 1 (or auto, cpu, gpu)")


def launch(torchrun_args: list[str], command: list[str], join_timeout_s: float | None = None
           ) -> int:
    """Run ``attnlab COMMAND ...`` under torchrun (``torch.distributed.run``) with
    ``torchrun_args``; the exit code of the processes.

    What torchrun would print as a traceback is one line (raised as :class:`UsageError`): a
    rendezvous that does not complete in ``join_timeout_s`` (torchrun's ``join_timeout``,
    600 s unless given here or in ``--rdzv-conf``) because not every machine joined, or an
    endpoint that cannot be reached. A process that fails has already said why (attnlab's
    one line, or a traceback): its exit code is returned.
    """
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousError, RendezvousTimeoutError
    from torch.distributed.run import main as torchrun

    args = list(torchrun_args)
    _check_torchrun_args(args, command)
    conf = _option(args, "--rdzv-conf", "--rdzv_conf")
    if join_timeout_s is not None:
        args += ["--rdzv-conf", f"join_timeout={join_timeout_s:g}" + (f",{conf}" if conf else "")]
    else:  # torchrun's own: its --rdzv-conf, else 600 s
        given = re.search(r"(?:^|,)join_timeout=([^,]+)", conf or "")
        join_timeout_s = float(given.group(1)) if given else 600.0
    nodes = _option(args, "--nnodes") or "1"
    endpoint = _option(args, "--rdzv-endpoint", "--rdzv_endpoint") or \
        f"{_option(args, '--master-addr', '--master_addr') or '127.0.0.1'}:" \
        f"{_option(args, '--master-port', '--master_port') or 29500}"
    try:
        torchrun([*args, "-m", "attnlab", *command])
    except RendezvousTimeoutError as e:
        raise UsageError(
            f"the rendezvous at {endpoint} did not complete in {join_timeout_s:g} s: not every "
            f"machine of "
            f"--nnodes {nodes} joined. Start the same `attnlab launch` (same --nnodes, "
            "--rdzv-endpoint and --rdzv-id) on every machine, and check that the endpoint's "
            "host and port can be reached from each") from e
    except RendezvousError as e:
        raise UsageError(f"the rendezvous at {endpoint} failed: "
                         f"{' '.join(str(e).split()) or type(e).__name__} (check --rdzv-endpoint "
                         "and that every machine can reach it)") from e
    except ChildFailedError as e:
        codes = [f.exitcode for f in e.failures.values()]
        return next((c for c in codes if c > 0), 1)
    return 0

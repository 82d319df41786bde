"""Data parallel corpus runs over ``torch.distributed``: shards, one agreed N grid, one reduction at the end.

Started by the launchers people already use (``torchrun``, ``accelerate
launch``, SLURM with ``torchrun``): they set ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``, and `init_from_env`
joins the process group (gloo on CPU, nccl on CUDA). Each rank analyses the
windows whose index i has ``i % world_size == rank`` (a deterministic
round-robin shard, so a shard's documents are the same however the corpus is
batched) into its own `Accumulator`; at the end the accumulators are reduced
once (`Accumulator.reduced`: four collectives over the exact statistics and
bootstrap replicate sums, plus a gather of per-query rows where kept). Every
rank then holds the whole result; only rank 0 writes it.

Without a process group (or with one process) every function here is a no-op.
"""

import logging
import os
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from tl_geometry.errors import GeometryError
from tl_geometry.results.accumulators import Accumulator

logger = logging.getLogger(__name__)

_LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class Ranks:
    """This process's place in the run: ``rank`` of ``world_size`` (0 of 1 without a process group)."""

    rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        """True on the process that writes results and shows progress."""
        return self.rank == 0

    def owns(self, window_index: int) -> bool:
        """Whether this rank analyses the window at this index of the corpus (round-robin)."""
        return window_index % self.world_size == self.rank

    def checkpoint_suffix(self) -> str:
        """``""`` alone, ``".rank1-of-4"`` in a run of four: each rank checkpoints its own shard."""
        return "" if self.world_size == 1 else f".rank{self.rank}-of-{self.world_size}"


def current_ranks() -> Ranks:
    """The ranks of the initialised default process group, or ``Ranks()`` (0 of 1) without one."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return Ranks(torch.distributed.get_rank(), torch.distributed.get_world_size())
    return Ranks()


def launched_by_torchrun() -> bool:
    """True when a launcher asked for more than one process (``WORLD_SIZE`` > 1 with the rendezvous variables)."""
    return int(os.environ.get("WORLD_SIZE", "1") or 1) > 1


def init_from_env(device: str | torch.device = "cpu") -> Ranks:
    """Join the process group a launcher describes in the environment (a no-op for one process).

    Args:
        device: the device the model runs on: ``cuda`` uses nccl (each rank
            on ``cuda:LOCAL_RANK``), anything else gloo.

    Returns:
        This process's `Ranks`.

    Raises:
        GeometryError: ``WORLD_SIZE`` > 1 but a rendezvous variable is missing,
            or torch was built without ``torch.distributed``.
    """
    if not launched_by_torchrun():
        return current_ranks()
    missing = [name for name in _LAUNCHER_VARIABLES if not os.environ.get(name)]
    if missing:
        raise GeometryError(
            f"WORLD_SIZE={os.environ['WORLD_SIZE']} asks for several processes but {missing} are not set; start "
            "the run with torchrun --nproc-per-node K (or accelerate launch), which sets them all"
        )
    if not torch.distributed.is_available():
        raise GeometryError("this torch build has no torch.distributed; run with one process (no torchrun)")
    if not torch.distributed.is_initialized():
        backend = "nccl" if torch.device(device).type == "cuda" else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        torch.distributed.init_process_group(backend=backend)
    return current_ranks()


def rank_device(device: str, ranks: Ranks) -> str:
    """The device of this rank: ``cuda`` becomes ``cuda:LOCAL_RANK`` when several processes share a node."""
    if ranks.world_size > 1 and device == "cuda":
        return f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    return device


def _collective_device() -> torch.device:
    """Where collective tensors must live: the current CUDA device under nccl, else the CPU."""
    if torch.distributed.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


_OPS = {"sum": "SUM", "min": "MIN", "max": "MAX"}


def all_reduce(tensor: Tensor, op: str) -> Tensor:
    """The elementwise ``op`` (sum, min, max) of ``tensor`` over every rank, as a new CPU tensor."""
    if not current_ranks().world_size > 1:
        return tensor.clone()
    out = tensor.to(_collective_device(), copy=True)
    torch.distributed.all_reduce(out, op=getattr(torch.distributed.ReduceOp, _OPS[op]))
    return out.cpu()


def gather_objects(obj: Any) -> list[Any]:
    """Every rank's ``obj`` (picklable), in rank order."""
    ranks = current_ranks()
    if ranks.world_size == 1:
        return [obj]
    out: list[Any] = [None] * ranks.world_size
    torch.distributed.all_gather_object(out, obj)
    return out


def agree(what: str, value: Any) -> None:
    """GeometryError on every rank unless every rank passes an equal ``value`` (the config, the corpus size...)."""
    values = gather_objects(value)
    for rank, other in enumerate(values):
        if other != values[0]:
            raise GeometryError(
                f"distributed run: rank {rank} has {what} {other!r} but rank 0 has {values[0]!r}; start every "
                "rank with the same arguments and corpus"
            )


def agree_on_max(value: int) -> int:
    """The largest ``value`` over the ranks (for example the most keys any query of any shard sees)."""
    return int(all_reduce(torch.tensor([value], dtype=torch.int64), "max")[0])


def reduce_accumulator(accumulator: Accumulator) -> Accumulator:
    """The accumulator of every rank's documents, on every rank (one reduction, timed in the log)."""
    ranks = current_ranks()
    if ranks.world_size == 1:
        return accumulator
    barrier()  # time the reduction itself, not the wait for the slowest rank's last batch
    start = time.perf_counter()
    reduced = accumulator.reduced(all_reduce, gather_objects)
    seconds = time.perf_counter() - start
    logger.info(
        "reduced %d bytes of statistics over %d ranks in %.4f s",
        accumulator.nbytes,
        ranks.world_size,
        seconds,
        extra={"reduction_seconds": seconds},
    )
    return reduced


def barrier() -> None:
    """Wait for every rank (a no-op alone)."""
    if current_ranks().world_size > 1:
        torch.distributed.barrier()

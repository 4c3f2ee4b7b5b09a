"""torch.distributed for the training loop: process-group setup under torchrun, data sharding, collectives.

A run is distributed when torchrun (or any launcher) sets RANK / WORLD_SIZE / LOCAL_RANK. Then each
process joins a process group (nccl on GPU, gloo on CPU), takes its shard of every epoch's permutation,
and rank 0 alone writes checkpoints and logs. Without those variables everything here is a no-op, so
the loop has one code path for one process and for many.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DistContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    initialized_here: bool = False  # this module created the process group, so it also destroys it

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def resolve_device(preference: str, local_rank: int = 0) -> torch.device:
    """"auto": the local rank's GPU when CUDA is there, else the CPU; otherwise the named device."""
    if preference == "auto":
        return torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    device = torch.device(preference)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", local_rank)
    return device


def setup_distributed(device_preference: str = "auto", timeout_minutes: float | None = None) -> DistContext:
    """Join the process group described by torchrun's environment (or none: one process, rank 0).

    `timeout_minutes`: how long a collective (a barrier, a gradient all-reduce) waits for a missing process
    before it fails instead of hanging (unset: torch's default, 10 minutes for NCCL, 30 for gloo)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = resolve_device(device_preference, local_rank)
    if world_size <= 1:
        return DistContext(device=device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    initialized_here = False
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        timeout = {"timeout": timedelta(minutes=timeout_minutes)} if timeout_minutes else {}
        dist.init_process_group(backend=backend, rank=rank, world_size=world_size, **timeout)
        initialized_here = True
        if rank == 0:
            log.info("distributed: %s backend, world size %d", backend, world_size)
    return DistContext(rank, world_size, local_rank, device, initialized_here)


def teardown_distributed(ctx: DistContext) -> None:
    if ctx.initialized_here and dist.is_initialized():
        dist.destroy_process_group()


def barrier(ctx: DistContext) -> None:
    if ctx.enabled:
        dist.barrier()


def shard(indices: list[int], rank: int, world_size: int) -> list[int]:
    """This rank's share of `indices`, as torch's DistributedSampler(drop_last=False) deals it.

    The list is padded by wrapping around to a multiple of world_size, so every rank sees the same
    number of examples (and runs the same number of steps: DDP needs that to not hang).
    """
    if world_size <= 1:
        return list(indices)
    total = -(-len(indices) // world_size) * world_size
    padded = list(indices)
    while len(padded) < total:
        padded += indices[: total - len(padded)]
    return padded[rank:total:world_size]


def gather_objects(ctx: DistContext, obj: Any) -> list[Any]:
    """Every rank's `obj`, in rank order (a list of one without distribution)."""
    if not ctx.enabled:
        return [obj]
    gathered: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(gathered, obj)
    return gathered


def any_rank(ctx: DistContext, flag: bool) -> bool:
    """True when `flag` is true on at least one rank, so that all ranks take the same branch."""
    if not ctx.enabled:
        return flag
    value = torch.tensor([1.0 if flag else 0.0], device=ctx.device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def broadcast_object(ctx: DistContext, obj: Any) -> Any:
    """Rank 0's `obj` on every rank."""
    if not ctx.enabled:
        return obj
    holder = [obj]
    dist.broadcast_object_list(holder, src=0)
    return holder[0]


def check_shared_folder(ctx: DistContext, folder: Path) -> None:
    """Every rank must see what rank 0 writes into `folder` (the prepared data, the checkpoints to resume): rank 0
    writes a token there and every rank reads it back. On a folder that is not shared between machines, every
    rank fails with one line naming the hosts that did not see it, instead of training apart or hanging later."""
    if not ctx.enabled:
        return
    from training.errors import UserFacingError

    marker = folder / ".berth-shared-check"
    token = f"{socket.gethostname()}:{os.getpid()}:{time.time_ns()}"
    if ctx.is_main:
        folder.mkdir(parents=True, exist_ok=True)
        marker.write_text(token, encoding="utf-8")
    token = broadcast_object(ctx, token)
    try:
        seen = marker.read_text(encoding="utf-8") == token
    except OSError:
        seen = False
    views = gather_objects(ctx, (seen, socket.gethostname(), ctx.rank))
    barrier(ctx)
    if ctx.is_main:
        marker.unlink(missing_ok=True)
    blind = [f"rank {rank} on {host}" for ok, host, rank in views if not ok]
    if blind:
        raise UserFacingError(f"{folder} is not shared between the machines: {', '.join(blind)} cannot see what "
                              "rank 0 wrote there; give every node the same --out on a shared filesystem")

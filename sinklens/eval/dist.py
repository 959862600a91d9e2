"""Data parallel as users launch it: `torchrun`, `accelerate launch --multi_gpu`, or
`accelerate launch --num_processes N` (docs/evaluation.md lists the tested lines).

The launcher sets RANK / WORLD_SIZE / MASTER_ADDR; accelerate's `PartialState` joins the
process group (gloo on CPU, nccl on GPU), says which process is the main one and which device
a rank uses, and provides the barrier. On a CPU-only machine accelerate would take a GPU
launch (`--multi_gpu`) for one process: `cpu=True` makes it the MULTI_CPU group it is.
Without a launcher (WORLD_SIZE unset or 1) nothing is initialised.
"""
from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass
class DistState:
    rank: int = 0
    world: int = 1
    device: str | None = None  # the rank's device under a GPU launcher (cuda:LOCAL_RANK), else None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.world > 1:
            from accelerate import PartialState

            PartialState().wait_for_everyone()


def env_world() -> tuple[int, int]:
    """(RANK, WORLD_SIZE) as the launcher set them (1 process when unset)."""
    try:
        rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    except ValueError:
        raise ValueError(f"RANK / WORLD_SIZE must be integers, got {os.environ.get('RANK')!r} / "
                         f"{os.environ.get('WORLD_SIZE')!r}") from None
    if not 0 <= rank < world:
        raise ValueError(f"RANK={rank} must lie in [0, WORLD_SIZE={world})")
    return rank, world


def dist_state(device: str | None = None) -> DistState:
    """This process's place in the launch (accelerate's state when launched with several processes)."""
    rank, world = env_world()
    if world == 1:
        return DistState()
    if "MASTER_ADDR" not in os.environ:  # RANK / WORLD_SIZE set by hand: shards without a process group
        return DistState(rank, world)
    import torch
    from accelerate import PartialState

    cpu = (device is not None and str(device).startswith("cpu")) or not torch.cuda.is_available()
    state = PartialState(cpu=cpu)
    if state.num_processes != world:
        raise RuntimeError(f"WORLD_SIZE={world} but accelerate joined {state.num_processes} process(es)")
    return DistState(state.process_index, state.num_processes, None if cpu else str(state.device))

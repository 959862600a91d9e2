"""Launchers: make `accelerate launch --num_processes N` give N processes where accelerate
itself starts one.

On a machine without GPUs and without a multi-process `accelerate config`, `accelerate launch
--num_processes 2 -m sinklens.cli eval ...` runs ONE process (accelerate's simple launcher)
and sets no RANK / WORLD_SIZE. A data-parallel command (eval, trace --prompts) then relaunches itself as N
processes with `torch.distributed.run` (what torchrun runs) and says so; any other command
warns that one process runs. The request is read from the parent process's command line
(Linux /proc); elsewhere nothing is detected.
"""
from __future__ import annotations

import os
import subprocess
import sys

# Commands that split their work over processes, and the flag that makes them do so (None: always):
# `trace` splits a corpus (--prompts FILE.jsonl), never a single prompt.
PARALLEL = {"eval": None, "trace": "--prompts"}


def splits_work(command: str, argv: list[str]) -> bool:
    if command not in PARALLEL:
        return False
    flag = PARALLEL[command]
    return flag is None or any(a == flag or a.startswith(flag + "=") for a in argv)


def requested_processes() -> int | None:
    """N of `accelerate launch ... --num_processes N` when that started this process, else None."""
    try:
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
            words = [w.decode(errors="replace") for w in f.read().split(b"\0") if w]
    except OSError:
        return None
    head = " ".join(words[:3])
    if "accelerate" not in head or not ("launch" in words or "accelerate.commands.launch" in head):
        return None
    for i, w in enumerate(words):
        value = None
        if w in ("--num_processes", "--num-processes") and i + 1 < len(words):
            value = words[i + 1]
        elif w.startswith(("--num_processes=", "--num-processes=")):
            value = w.split("=", 1)[1]
        if value is not None:
            try:
                return int(value)
            except ValueError:
                return None
    return None


def maybe_relaunch(command: str, argv: list[str]) -> int | None:
    """The exit status of a relaunch as N processes, or None to run here."""
    from sinklens.cli.logs import note

    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    parallel = splits_work(command, argv)
    if world > 1 and not parallel:
        note(f"sinklens {command}: warning: {world} processes each run the whole command "
             f"(`{command}` does not split its work over processes{_how(command)})")
    if world > 1 or os.environ.get("SINKLENS_RELAUNCHED"):
        return None
    n = requested_processes()
    if n is None or n <= 1:
        return None
    if not parallel:
        note(f"sinklens {command}: warning: the launcher asked for {n} processes but 1 runs "
             f"(`{command}` does not split its work over processes{_how(command)})")
        return None
    note(f"sinklens {command}: warning: accelerate launch asked for {n} processes but started 1 (no GPUs and no "
         f"multi-process accelerate config); relaunching as {n} processes with torch.distributed.run")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(n),
           "-m", "sinklens.cli", *argv]
    return subprocess.call(cmd, env={**os.environ, "SINKLENS_RELAUNCHED": "1"})


def _how(command: str) -> str:
    flag = PARALLEL.get(command)
    return f" without {flag}" if flag else ""

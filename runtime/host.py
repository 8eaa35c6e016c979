"""This machine: where pipe keeps its local state, and whether a process lives. Standard library
only and cheap to import: `pipe` itself (pipe/launch.py) uses it before it imports anything else."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """Where pipe keeps what it builds for clusters and what it knows of its local servers:
    $PIPE_CACHE_DIR, else $XDG_CACHE_HOME/pipe, else ~/.cache/pipe."""
    if os.environ.get("PIPE_CACHE_DIR"):
        return Path(os.environ["PIPE_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "pipe"


def alive(pid: int) -> bool:
    """Whether the process `pid` exists (one of another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

"""The run lock: one `pipe run` of a project's lake at a time. A second run is refused at once,
before Spark starts, with who holds the lock (pid, host, since when).

The lock is `<lake>/.pipe-run.lock`, created exclusively (O_EXCL locally, If-None-Match on S3)
and holding its owner (host, pid), the start time and an expiry that a heartbeat pushes
forward while the run lasts. A lock is stale, and taken over, when its expiry has passed (a
holder that crashed on another host) or its pid no longer runs on this host. Each table's
writer lock (Table.lock) still guards every single write; this one keeps two runs from
reading the same input and doing the same work twice."""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

from compiler.errors import PipeError
from runtime.storage import StorageSpec, open_storage

LOCK_PATH = ".pipe-run.lock"  # beside the tables (whose names never start with a dot)
TTL_S = 120.0  # a holder's heartbeat renews the lock every TTL_S / 6


class RunLocked(PipeError):
    """Another run holds the lock; `hint` says what to do."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.hint = hint


@dataclass(frozen=True)
class Holder:
    pid: int
    host: str
    started_at: str  # ISO 8601, UTC
    expires_ms: int
    token: str
    command: str = ""

    @classmethod
    def parse(cls, data: bytes) -> "Holder | None":
        try:
            d = json.loads(data)
            return cls(int(d["pid"]), str(d["host"]), str(d["started_at"]), int(d["expires_ms"]), str(d["token"]), str(d.get("command", "")))
        except (ValueError, KeyError, TypeError):
            return None

    def to_bytes(self) -> bytes:
        return json.dumps(self.__dict__, sort_keys=True).encode("utf-8")

    def is_stale(self, now_ms: float | None = None) -> bool:
        """Expired, or its process is gone from this host."""
        if self.expires_ms < (time.time() * 1000 if now_ms is None else now_ms):
            return True
        if self.host != socket.gethostname():
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:  # alive, another user's
            return False
        return False

    def describe(self) -> str:
        since = dt.datetime.fromisoformat(self.started_at).strftime("%Y-%m-%d %H:%M:%S UTC")
        return f"pid {self.pid}, host {self.host}, since {since}"


def _take(storage, me: Holder) -> Holder | None:
    """Creates the lock for `me`; returns None when taken, or the live holder of the lock."""
    for _ in range(3):  # a stale lock is removed, then taken
        if storage.create_exclusive(LOCK_PATH, me.to_bytes()):
            return None
        try:
            held = Holder.parse(storage.read_bytes(LOCK_PATH))
        except FileNotFoundError:
            continue  # released meanwhile
        if held is None or held.is_stale():
            storage.delete(LOCK_PATH)
            continue
        return held
    raise RunLocked("the run lock keeps changing hands: another run is starting; nothing was run", "run again")


def _now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def still_holds(lake_uri: str, storage_options: tuple, me: Holder) -> bool:
    """Whether `me` still holds the lake's run lock (it was not taken over as stale meanwhile)."""
    try:
        held = Holder.parse(open_storage(StorageSpec(lake_uri, storage_options)).read_bytes(LOCK_PATH))
    except FileNotFoundError:
        return False
    return held is not None and held.token == me.token


@contextmanager
def hold(lake_uri: str, storage_options: tuple = (), command: str = "pipe run", ttl_s: float = TTL_S) -> Iterator[Holder]:
    """Holds the run lock of the lake for the body, or raises RunLocked at once."""
    storage = open_storage(StorageSpec(lake_uri, storage_options))
    me = Holder(os.getpid(), socket.gethostname(), _now_iso(), int((time.time() + ttl_s) * 1000), uuid.uuid4().hex, command)
    where = f"{lake_uri.rstrip('/')}/{LOCK_PATH}"
    try:
        held = _take(storage, me)
    except RunLocked:
        raise
    except Exception as exc:  # noqa: BLE001 - the lake cannot be reached: say where, before Spark starts
        raise RunLocked(f"cannot take the run lock {where}: {type(exc).__name__}: {exc}; nothing was run",
                        "check the target's lake (its location, and the credentials to write there)") from exc
    if held is not None:
        until = dt.datetime.fromtimestamp(held.expires_ms / 1000, dt.timezone.utc).strftime("%H:%M:%S UTC")
        raise RunLocked(f"another run is in progress ({held.describe()}); nothing was run",
                        f"wait for it to finish. If that process is gone (on another machine), its lock expires at {until}; "
                        f"or delete {where} once you are sure no run is going on")
    stop = threading.Event()

    def heartbeat() -> None:
        while not stop.wait(ttl_s / 6):
            try:
                held = Holder.parse(storage.read_bytes(LOCK_PATH))
                if held is None or held.token != me.token:
                    return  # taken over (we looked dead): the tables' own locks still guard each write
                storage.write_atomic(LOCK_PATH, Holder(**{**me.__dict__, "expires_ms": int((time.time() + ttl_s) * 1000)}).to_bytes())
            except Exception:  # noqa: BLE001 - a failed beat is retried at the next one
                continue

    beat = threading.Thread(target=heartbeat, daemon=True, name="pipe-run-lock")
    beat.start()
    try:
        yield me
    finally:
        stop.set()
        beat.join()
        try:
            held = Holder.parse(storage.read_bytes(LOCK_PATH))
            if held is not None and held.token == me.token:  # never delete a lock someone else took over
                storage.delete(LOCK_PATH)
        except FileNotFoundError:
            pass

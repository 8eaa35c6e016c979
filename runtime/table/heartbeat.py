"""Heartbeats of in-flight writes: `.hoodie/.heartbeat/<instant>`, a file its writer rewrites while
the instant runs and deletes when it completes (Hudi's HoodieHeartbeatClient). Another writer
takes an instant whose heartbeat file is missing or older than the tolerated interval for a
dead write, and only then rolls it back (Java's LAZY failed-writes policy; its defaults:
hoodie.client.heartbeat.interval_in_ms=60000, hoodie.client.heartbeat.tolerable.misses=2, so
120 s). Java writes empty files and reads only their modification time; pipe's name their
owner, so that pipe knows a heartbeat left by a pipe writer that is gone (pipe writers hold the
table's lock: a pipe heartbeat seen by the lock's holder belongs to a dead writer)."""

from __future__ import annotations

import json
import time

from runtime.table.timeline import HOODIE

FOLDER = f"{HOODIE}/.heartbeat"
INTERVAL_MS = 60_000  # Java's default hoodie.client.heartbeat.interval_in_ms
TOLERABLE_MISSES = 2  # Java's default hoodie.client.heartbeat.tolerable.misses
EXPIRY_MS = INTERVAL_MS * TOLERABLE_MISSES  # as HoodieHeartbeatClient computes it
# A heartbeat dated later than now by more than this (clock skew between hosts sharing the
# table) is not trusted: Java's expiry test (now - last beat > expiry) never expires a beat from
# the future, so a file touched with a date in 2099 would block every rollback forever. Such a
# heartbeat counts as expired, its writer as dead.
FUTURE_TOLERANCE_MS = INTERVAL_MS


def path(instant: str) -> str:
    return f"{FOLDER}/{instant}"


def beat(storage, instant: str, owner: str) -> None:
    """Writes (or refreshes) the heartbeat of `instant`, naming its pipe owner."""
    storage.write_atomic(path(instant), json.dumps({"writer": "pipe", "owner": owner}).encode("utf-8"))


def stop(storage, instant: str) -> None:
    storage.delete(path(instant))


def live_foreign(storage, instants: list[str], now_ms: int | None = None) -> dict[str, int]:
    """Of `instants`, those with a fresh heartbeat of a writer that is not pipe (Java):
    instant -> milliseconds since its last beat. One listing of the heartbeat folder."""
    if not instants:
        return {}
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    found = {i.path.rsplit("/", 1)[-1]: i for i in storage.list_files(FOLDER, recursive=False)}
    out = {}
    for t in instants:
        info = found.get(t)
        if info is None or now_ms - info.mtime_ms > EXPIRY_MS or info.mtime_ms - now_ms > FUTURE_TOLERANCE_MS:
            continue  # missing, expired or dated in the future: the writer is dead
        if info.size and _is_pipes(storage, path(t)):
            continue  # a pipe writer's, and pipe's lock is ours: that writer is gone
        out[t] = max(0, now_ms - info.mtime_ms)
    return out


def _is_pipes(storage, rel: str) -> bool:
    try:
        return json.loads(storage.read_bytes(rel)).get("writer") == "pipe"
    except (FileNotFoundError, ValueError, AttributeError):
        return False

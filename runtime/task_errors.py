"""Failures inside Spark tasks (Python workers on the executors, or the executors themselves),
read back on the driver as one line a user can act on: what was raised and, where the task
said so, which file; with a hint for the failures that are not pipe's or the data's (a package
missing on the executors, memory, a lost executor). The whole traceback stays for --debug."""

from __future__ import annotations

import re
from dataclasses import dataclass

# pipe's error types whose message is written for the user (raised in tasks, e.g. a damaged log file)
PIPE_ERRORS = ("TableError", "WriteError", "SourceError")

_TRACEBACK = "Traceback (most recent call last):"
# the line that ends a Python traceback: "pkg.module.SomeError: message" (or the name alone)
_RAISED = re.compile(r"^((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|error|Exception|Exit|Interrupt|Warning|BadGzipFile))(?:: ?(.*))?$")


@dataclass(frozen=True)
class TaskFailure:
    """The last exception of a failed task: its type (without module) and its message."""

    kind: str
    message: str

    def line(self) -> str:
        """pipe's own errors (raised in a task with a message for the user) by their message alone."""
        if self.kind in PIPE_ERRORS and self.message:
            return self.message
        return f"{self.kind}: {self.message}" if self.message else self.kind

    def hint(self) -> str | None:
        return _hint(self)


def worker_error(exc_or_text) -> TaskFailure | None:
    """The exception a Python worker raised, from a Spark error (or its text) that carries the
    worker's traceback; None when there is none in it."""
    text = exc_or_text if isinstance(exc_or_text, str) else _text(exc_or_text)
    if _TRACEBACK not in text:
        return _executor_lost(text)
    found = None
    in_traceback = False
    for line in text.splitlines():
        if line.startswith(_TRACEBACK) or _TRACEBACK in line:
            in_traceback = True
            continue
        if line.startswith("JVM stacktrace"):
            break
        if in_traceback and line and not line[0].isspace():
            match = _RAISED.match(line.strip())
            if match:
                found = TaskFailure(match.group(1).rsplit(".", 1)[-1], (match.group(2) or "").strip()[:500])
                in_traceback = False
    return found or _executor_lost(text)


def _text(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:  # noqa: BLE001 - a Java exception whose message cannot be fetched any more
        return type(exc).__name__


_LOST = re.compile(r"(ExecutorLostFailure[^\n]*|Python worker exited unexpectedly \(crashed\)[^\n]*|"
                   r"java\.lang\.OutOfMemoryError[^\n]*)")


def _executor_lost(text: str) -> TaskFailure | None:
    match = _LOST.search(text)
    if not match:
        return None
    said = match.group(1).strip()
    kind = "OutOfMemoryError" if "OutOfMemoryError" in said else "ExecutorLost" if said.startswith("ExecutorLost") else "PythonWorkerCrashed"
    return TaskFailure(kind, said[:500])


_MEMORY = ("the executors ran out of memory: give them more in the target's spark conf (spark.executor.memory for the "
           "JVM, spark.executor.pyspark.memory or spark.executor.memoryOverhead for the Python workers), or fewer "
           "cores per executor")


def _hint(f: TaskFailure) -> str | None:
    if f.kind in ("ModuleNotFoundError", "ImportError"):
        return ("the executors' Python lacks a package pipe's tasks import: point spark.pyspark.python at a Python that "
                "has pipe's dependencies, or ship one with `pipe pack-env` (docs/deploy.md)")
    if f.kind in ("MemoryError", "OutOfMemoryError"):
        return _MEMORY
    if f.kind in ("ExecutorLost", "PythonWorkerCrashed"):
        return _MEMORY + "; the executors' logs (Spark UI) say why the process ended"
    return None

"""The errors a run raises that a user can act on, and how Spark's errors read: at the bottom of
runtime/, so that every layer (the Spark plumbing of runtime/spark, sources, catalogs, steps)
raises and reads them without importing the layers above it. The table engine's own errors are
in runtime/table/errors.py, a source's in runtime/sources; runtime/steps/errors.py says how any
of them reads in a failed step."""

from __future__ import annotations

import re
from typing import Any

from compiler.errors import PipeError
from runtime.task_errors import PIPE_ERRORS, worker_error


class RunError(PipeError):
    """A step that cannot go ahead; `hint` says what to do."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.hint = hint


class Cancelled(RunError):
    """The run was interrupted or stopped at a failure (--fail-fast) before this step wrote."""


class Terminated(KeyboardInterrupt):
    """SIGTERM asked the command to stop: a cancellation like Ctrl-C's, which exits 143."""

    signal_name = "SIGTERM"
    exit_code = 143


_TASK_ERROR = re.compile(r"^(?:[\w.]+\.)?(?:TableError|WriteError|SourceError): (.+)$", re.M)
_SPARK_POSITION = re.compile(r"(line \d+),? (pos(?:ition)? \d+)")


def spark_message(exc: BaseException) -> str:
    text = str(getattr(exc, "getMessage", lambda: None)() or exc).strip()
    raised = _TASK_ERROR.findall(text) if "Traceback (most recent call last)" in text else []
    if raised:  # pipe's own error raised in a Spark task (e.g. a damaged log file): its message, not the traceback
        return raised[-1][:600]
    failure = worker_error(text)
    if failure is not None:  # another failure inside a task: what was raised, not the worker's traceback
        return failure.line()[:600]
    lines = [l for l in text.splitlines() if l.strip() and not l.lstrip().startswith(("at ", "JVM stacktrace"))]
    message = " ".join(lines[:3])[:600] if lines else type(exc).__name__
    # getMessage() leaves out where in the query Spark stopped; str(exc) has it
    where = _SPARK_POSITION.search(str(exc))
    if where and where.group(0) not in message:
        message += f" (Spark's position: {where.group(1)}, {where.group(2)})"
    return message


def sample(row: dict[str, Any], width: int = 120) -> dict[str, Any]:
    """A row of data as a user is shown it (and as JSON holds it): numbers, text and booleans
    as they are, anything else as text; long text cut at `width`."""
    out = {}
    for k, v in row.items():
        if not (isinstance(v, (int, float, bool, str)) or v is None):
            v = str(v)
        if isinstance(v, str) and len(v) > width:
            v = v[:width] + "..."
        out[k] = v
    return out


def is_user_error(exc: BaseException) -> bool:
    """Errors that come from the project or its data, not from a bug in pipe."""
    from runtime.table.errors import TableError, WriteError

    if isinstance(exc, (TableError, WriteError)):
        return True
    failure = worker_error(exc)
    if failure is not None and failure.kind not in PIPE_ERRORS:
        return False  # a Python exception in one of pipe's tasks (describe_error)
    try:  # Spark's own errors with an error condition: a query that fails on the data or the SQL
        from pyspark.errors.exceptions.captured import CapturedException
    except ImportError:  # pragma: no cover
        return False
    return isinstance(exc, CapturedException) and bool(exc.getCondition())


_CANCELLED = ("SPARK_JOB_CANCELLED", "cancelled part of cancelled job group", "cancelled because SparkContext was shut down",
              "SPARK_JOB_GROUP_CANCELLED", "JOB_CANCELLED", "OPERATION_CANCELED", "cancelled as part of cancellation")


def is_cancellation(exc: BaseException) -> bool:
    """A step ended by a cancellation (pipe's own, or of its Spark jobs), not by an error."""
    if isinstance(exc, (Cancelled, KeyboardInterrupt)):
        return True
    if isinstance(exc, PipeError):
        # pipe's own error around a cancelled Spark job (a source read cut short by Ctrl-C) is
        # the cancellation, not a file that cannot be read
        cause = exc.__cause__
        return cause is not None and not isinstance(cause, PipeError) and is_cancellation(cause)
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - a Java exception whose message cannot be fetched any more
        return False
    return any(marker in text for marker in _CANCELLED)

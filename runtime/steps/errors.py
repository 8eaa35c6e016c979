"""How a failed step reads: pipe's own errors as they are, Spark's and the executors' as one
line saying what failed (the worker's traceback only with --debug), cancellations apart."""

from __future__ import annotations

import re
import sys
from typing import Any

from compiler.errors import PipeError
from compiler.plan import Step
from runtime.sources import SourceError
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
    from runtime.table.table import TableError
    from runtime.table.writer import WriteError

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


def describe_error(exc: BaseException, step: Step) -> tuple[str, str | None]:
    connect = sys.modules.get("runtime.connect")  # imported by a run over Spark Connect only
    lost = connect.lost_server(exc) if connect is not None else None
    if lost is not None:  # the server went away: what happened and what to do, not gRPC's retries
        return f"{step.id}: {lost[0]} during this step", lost[1]
    if isinstance(exc, (RunError, SourceError)):
        return str(exc), getattr(exc, "hint", None)
    failure = worker_error(exc) if not isinstance(exc, PipeError) else None
    in_model = _model_line(exc, step) if failure is not None and failure.kind not in PIPE_ERRORS else None
    if in_model is not None:  # a function of the table's Python model (a UDF) failed on an executor
        return (f"{step.sql_file}:{in_model}: {step.id}: a function of the Python model failed in a Spark task: {failure.line()}",
                failure.hint() or "fix the model (`--debug` shows the worker's traceback)")
    if failure is not None and failure.kind not in PIPE_ERRORS and failure.hint() is not None:
        # not the SQL's fault nor the data's: the executors' Python, memory, a lost executor
        return f"{step.id}: a Spark task failed: {failure.line()}", failure.hint()
    if failure is not None and failure.kind not in PIPE_ERRORS:
        # any other Python exception in a task runs pipe's own code (not a Python model's): not the SQL's fault
        return f"{step.id}: internal error in a Spark task: {failure.line()}", _BUG
    if is_user_error(exc):
        where = f"{step.sql_file}: " if step.kind == "write" and step.sql_file else ""
        if step.kind == "write" and "lacks column(s)" in str(exc):
            # key / partition_by / precombine name a column the SELECT does not have: the name in
            # the YAML is the likelier typo (the writer's WriteError says "the input lacks column(s)")
            return (f"{step.file}:{step.line}: {step.id}: {spark_message(exc)}",
                    f"check key, partition_by and precombine in {step.file} against the columns {step.sql_file or 'the SQL'} selects")
        return f"{where}{step.id}: {spark_message(exc)}", None
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted", None
    return f"{step.id}: internal error: {type(exc).__name__}: {spark_message(exc)}", _BUG


def _model_line(exc: BaseException, step: Step) -> int | None:
    """The last line of the step's Python model in a task's traceback (`File "tables/x.py", line
    12`), or None when the model's code is not in it."""
    if step.kind != "write" or step.python is None or not step.sql_file:
        return None
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - a Java exception whose message cannot be fetched any more
        return None
    lines = re.findall(rf'File "{re.escape(step.sql_file)}", line (\d+)', text)
    return int(lines[-1]) if lines else None


_BUG = "this may be a bug in pipe; run with --debug for the traceback"

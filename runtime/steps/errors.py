"""How a failed step reads: pipe's own errors as they are, Spark's and the executors' as one
line saying what failed (the worker's traceback only with --debug), cancellations apart. The
errors themselves, and how Spark's read, are in runtime/errors.py."""

from __future__ import annotations

import re
import sys

from compiler.errors import PipeError
from compiler.plan import Step
from runtime.errors import RunError, is_user_error, spark_message
from runtime.sources import SourceError
from runtime.task_errors import PIPE_ERRORS, worker_error


def describe_error(exc: BaseException, step: Step) -> tuple[str, str | None]:
    connect = sys.modules.get("runtime.spark.connect")  # imported by a run over Spark Connect only
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

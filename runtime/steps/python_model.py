"""A table's Python model, called: the module's text from the plan is run (not the file, so
what runs is what was compiled and diffed) and its model() is given the DataFrames of the views
the write step registered for its inputs. It returns a DataFrame, which the write step writes as
it writes a SELECT's result.

The module runs on the driver, in pipe's Python; it only builds the DataFrame's plan, and Spark
runs it. Its functions (UDFs) reach the executors by value: the module is never put in
sys.modules, so cloudpickle ships the code instead of an import the executors could not do."""

from __future__ import annotations

import linecache
import traceback
from typing import Any

from compiler.plan import Step
from runtime.errors import RunError, is_cancellation, spark_message


def frame(session, step: Step, this_available: bool):
    """The DataFrame model() returns, its inputs read from the step's views in `session`."""
    spec = step.python
    file = step.sql_file or step.file
    module = _module(step, file)
    kwargs: dict[str, Any] = {param: session.table(_quoted(name)) for param, name in spec["inputs"].items()}
    if "spark" in spec["extras"]:
        kwargs["spark"] = session
    if "this" in spec["extras"]:
        kwargs["this"] = session.table(_quoted(step.name)) if this_available else None
    try:
        df = module["model"](**kwargs)
    except Exception as exc:  # noqa: BLE001 - the model's own failure, said at its line
        raise _failure(exc, step, file, "model() failed") from exc
    if not _is_dataframe(df):
        raise RunError(f"{file}:{spec['line']}: table {step.name}: model() returned {type(df).__name__}, not a Spark DataFrame",
                       "return the DataFrame to write (build it from the inputs or from `spark`)")
    return df


def _module(step: Step, file: str) -> dict[str, Any]:
    """The module's namespace after running its text."""
    from pipe.model import ref, source

    code_text = step.python["code"]
    # tracebacks (--debug) show the model's lines
    linecache.cache[file] = (len(code_text), None, code_text.splitlines(keepends=True), file)
    namespace: dict[str, Any] = {"__name__": f"pipe_model_{step.name}", "__file__": file, "ref": ref, "source": source}
    try:
        exec(compile(code_text, file, "exec", dont_inherit=True), namespace)  # noqa: S102 - the project's model, as SQL runs
    except Exception as exc:  # noqa: BLE001 - an import that fails, a mistake at module level
        raise _failure(exc, step, file, "its module failed to load") from exc
    if not callable(namespace.get("model")):
        raise RunError(f"{file}:{step.python['line']}: table {step.name}: the module no longer defines model()",
                       "keep `def model(...)` at the top level of the file")
    return namespace


def _failure(exc: Exception, step: Step, file: str, what: str) -> RunError:
    if is_cancellation(exc):
        raise exc
    line = model_line(exc, file) or step.python["line"]
    said = spark_message(exc) if type(exc).__module__.startswith(("pyspark", "py4j")) else f"{type(exc).__name__}: {exc}"
    hint = "fix the model (`--debug` shows the traceback)"
    if isinstance(exc, ImportError):
        hint = "install the package in the Python that runs pipe (the model runs on the driver)"
    error = RunError(f"{file}:{line}: table {step.name}: {what}: {said}", hint)
    error.show_cause = True  # --debug prints the model's traceback (runtime/executor.py)
    return error


def model_line(exc: BaseException, file: str) -> int | None:
    """The deepest line of `file` in the traceback of `exc` (where the model was when it failed)."""
    found = None
    for frame_summary in traceback.extract_tb(exc.__traceback__):
        if frame_summary.filename == file:
            found = frame_summary.lineno
    return found


def _quoted(name: str) -> str:
    return f"`{name}`"


def _is_dataframe(value: Any) -> bool:
    from pyspark.sql import DataFrame

    if isinstance(value, DataFrame):
        return True
    try:
        from pyspark.sql.connect.dataframe import DataFrame as ConnectDataFrame
    except ImportError:  # pragma: no cover - Connect's dependencies absent
        return False
    return isinstance(value, ConnectDataFrame)

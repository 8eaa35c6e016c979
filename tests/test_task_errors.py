"""A failure inside a Spark task (a Python worker) is read back as one line with a hint, and never
blamed on the table's SQL (runtime/task_errors.py, runtime/steps/errors.describe_error). The errors
here are real: raised by Python workers of the test session's Spark."""

from __future__ import annotations

import pytest

from compiler.plan import Step
from runtime.errors import is_user_error
from runtime.steps.errors import describe_error
from runtime.task_errors import worker_error

ORDERS = Step(id="table.orders", kind="write", name="orders", depends_on=(), config={}, file="tables/orders.yml", line=2,
              sql="select 1", sql_file="tables/orders.sql")


def _task_raising(spark, statement: str) -> BaseException:
    def task(batches):
        exec(statement)  # noqa: S102 - the failure under test, raised in the Python worker
        yield from batches

    with pytest.raises(Exception) as info:
        spark.range(4).mapInArrow(task, "id long").collect()
    return info.value


def test_a_module_missing_on_the_executors_is_one_line_with_a_hint_not_blamed_on_the_sql(spark):
    exc = _task_raising(spark, "import pipe_lacking_module")
    failure = worker_error(exc)
    assert failure.line() == "ModuleNotFoundError: No module named 'pipe_lacking_module'"
    message, hint = describe_error(exc, ORDERS)
    assert message == "table.orders: a Spark task failed: ModuleNotFoundError: No module named 'pipe_lacking_module'"
    assert "spark.pyspark.python" in hint and "pipe pack-env" in hint
    assert "Traceback" not in message and "tables/orders.sql" not in message


def test_memory_exhausted_in_a_task_points_at_the_executors_memory(spark):
    exc = _task_raising(spark, "raise MemoryError()")
    message, hint = describe_error(exc, ORDERS)
    assert message == "table.orders: a Spark task failed: MemoryError"
    assert "spark.executor.memory" in hint and "spark.executor.pyspark.memory" in hint


def test_pipe_own_error_raised_in_a_task_is_its_message(spark):
    exc = _task_raising(spark, "from runtime.table.errors import TableError; raise TableError('orders: the log file x.log.1 is damaged')")
    assert worker_error(exc).line() == "orders: the log file x.log.1 is damaged"


def test_a_python_exception_in_a_task_is_an_internal_error_not_blamed_on_the_sql(spark):
    exc = _task_raising(spark, "raise KeyError('Field \"_pipe_failed_expectations\" does not exist in schema')")
    assert not is_user_error(exc)  # so the executor keeps the traceback for --debug
    message, hint = describe_error(exc, ORDERS)
    assert message == ("table.orders: internal error in a Spark task: KeyError: "
                       "'Field \"_pipe_failed_expectations\" does not exist in schema'")
    assert hint == "this may be a bug in pipe; run with --debug for the traceback"
    assert "tables/orders.sql" not in message


def test_a_source_read_cut_short_by_ctrl_c_is_a_cancellation_not_an_unreadable_file(spark):
    """Ctrl-C cancels the step's Spark jobs; the files source reports a failed read of its files
    as "cannot read the json files (...)" around Spark's error, which is then the cancellation."""
    import threading
    import time

    from runtime.sources import SourceError
    from runtime.errors import is_cancellation

    caught: list[BaseException] = []

    def read() -> None:
        spark.sparkContext.setJobGroup("pipe-test-cancel", "a long read", interruptOnCancel=True)
        try:
            spark.range(0, 10**12, numPartitions=4).selectExpr("sum(id % 7)").collect()
        except Exception as exc:  # noqa: BLE001 - the cancellation under test
            caught.append(exc)

    reader = threading.Thread(target=read)
    reader.start()
    deadline = time.time() + 120
    while not spark.sparkContext.statusTracker().getJobIdsForGroup("pipe-test-cancel") and time.time() < deadline:
        time.sleep(0.1)
    spark.sparkContext.cancelJobGroup("pipe-test-cancel")
    reader.join(120)
    assert caught, "the job was cancelled"
    try:
        raise SourceError("source raw_orders: cannot read the json files (job cancelled)", "check `format`") from caught[0]
    except SourceError as wrapped:
        assert is_cancellation(wrapped)
    try:
        raise SourceError("source raw_orders: cannot read the json files (bad)", "check `format`") from ValueError("line 3: bad")
    except SourceError as wrapped:
        assert not is_cancellation(wrapped)

"""Commands that run the plan's steps: run, build, seed, test, retry (and `run --continuous`)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from pathlib import Path

import click

from compiler.errors import ProjectError
from pipe import __version__, output
from pipe.commands.common import (
    EXIT_FAILED, cli_problem, common_options, compile_plan, Context, exclude_option, load_plan, select_option,
    state_option, target_option, vars_option,
)
from pipe.commands.sessions import spark_factory

_RUN_OPTIONS = (
    select_option,
    exclude_option,
    target_option,
    vars_option,
    click.option("--full-refresh", is_flag=True, help="Rebuild the selected tables from all of their input."),
    click.option("--dry-run", is_flag=True, help="Say what would run and how much new input waits; write nothing, start no Spark."),
    click.option("--threads", type=click.IntRange(1, 64), default=4, show_default=True, help="Steps run at the same time."),
    click.option("--fail-fast", is_flag=True, help="Stop at the first failed step (cancel what runs, start nothing new)."),
    click.option("--quiet", "-q", is_flag=True, help="Print only errors and a one-line summary."),
    click.option("--log-format", type=click.Choice(["text", "json"]), default="text", help="json: one JSON object per event on stdout."),
    click.option("--plan", "plan_path", default=None, type=click.Path(dir_okay=False), help="Run this compiled plan.json instead of compiling the project."),
    click.option("--defer", "defer_target", default=None, metavar="TARGET",
                 help="Read the tables this run does not build from TARGET's lake, pinned (docs/dev-loop.md)."),
    click.option("--defer-as-of", default=None, metavar="WHEN",
                 help="With --defer: pin at this instant or UTC time, or `latest` (default: TARGET's latest successful run)."),
    state_option,
    click.option("--empty", is_flag=True, help="Run the selected tables' SQL on inputs with no rows: new tables are created empty; nothing is consumed."),
    click.option("--sample", "sample_spec", default=None, metavar="SPEC",
                 help="Build the selected tables from part of their input: 'N rows', 'N rows per partition', 'N days', 'N hours'."),
)


def _run_options(command):
    for option in reversed(_RUN_OPTIONS):
        command = option(command)
    return command


@click.command(name="run")
@_run_options
@click.option("--continuous", is_flag=True, help="Run rounds until interrupted (Ctrl-C finishes the current round, then exits).")
@click.option("--min-sync-interval-s", type=click.IntRange(0, 86400), default=10, show_default=True,
              help="With --continuous: a round starts at least this many seconds after the previous one started.")
@common_options
@click.pass_obj
def run_cmd(ctx: Context, select, exclude, target, vars_text, full_refresh, dry_run, threads, fail_fast, quiet, log_format, plan_path,
            defer_target, defer_as_of, state_dir, empty, sample_spec, continuous, min_sync_interval_s) -> None:
    """Run the project's pipeline on Spark: only new input, checkpoints in each table's timeline."""
    _execute(ctx, "run", select, exclude, target, vars_text, full_refresh, dry_run, threads, fail_fast, quiet, log_format, plan_path,
             continuous, min_sync_interval_s, defer_target=defer_target, defer_as_of=defer_as_of, state_dir=state_dir,
             sample=_sample_arg(empty, sample_spec))


@click.command(name="build")
@_run_options
@common_options
@click.pass_obj
def build_cmd(ctx: Context, select, exclude, target, vars_text, full_refresh, dry_run, threads, fail_fast, quiet, log_format, plan_path,
              defer_target, defer_as_of, state_dir, empty, sample_spec) -> None:
    """Run the tables and their data tests in dependency order: a table whose error-severity
    test fails stops the steps that read it."""
    _execute(ctx, "build", select, exclude, target, vars_text, full_refresh, dry_run, threads, fail_fast, quiet, log_format, plan_path,
             defer_target=defer_target, defer_as_of=defer_as_of, state_dir=state_dir, sample=_sample_arg(empty, sample_spec))


@click.command(name="seed")
@_run_options
@common_options
@click.pass_obj
def seed_cmd(ctx: Context, select, exclude, target, vars_text, full_refresh, dry_run, threads, fail_fast, quiet, log_format, plan_path,
             defer_target, defer_as_of, state_dir, empty, sample_spec) -> None:
    """Load the seeds (seeds/**/*.csv) into their tables: only those whose file or settings
    changed since their last load; --full-refresh loads them all again."""
    _execute(ctx, "seed", select, exclude, target, vars_text, full_refresh, dry_run, threads, fail_fast, quiet, log_format, plan_path,
             defer_target=defer_target, defer_as_of=defer_as_of, state_dir=state_dir, sample=_sample_arg(empty, sample_spec))


def _sample_arg(empty: bool, spec: str | None):
    """--empty / --sample SPEC as runtime/sample.Sample, or None."""
    from runtime.sample import Sample, SampleError

    if empty and spec:
        raise ProjectError([cli_problem("--empty and --sample cannot be combined", "--empty builds no rows; --sample builds some")])
    if empty:
        return Sample.nothing()
    if spec is None:
        return None
    try:
        return Sample.parse(spec)
    except SampleError as exc:
        raise ProjectError([cli_problem(f"--sample {spec!r} is not a sample", "'1000 rows', '100 rows per partition', '3 days' or '12 hours'")]) from exc


@click.command(name="test")
@select_option
@exclude_option
@target_option
@vars_option
@click.option("--threads", type=click.IntRange(1, 64), default=4, show_default=True, help="Tests run at the same time.")
@click.option("--fail-fast", is_flag=True, help="Stop at the first failed test.")
@click.option("--quiet", "-q", is_flag=True, help="Print only failures and a one-line summary.")
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text", help="json: one JSON object per event on stdout.")
@click.option("--plan", "plan_path", default=None, type=click.Path(dir_okay=False), help="Run the tests of this compiled plan.json.")
@click.option("--unit", "unit_only", is_flag=True, help="Only the unit tests (tests/unit/*.yml): no table of the lake is read.")
@click.option("--record", "record_table", metavar="TABLE", default=None,
              help="Write a unit test of TABLE from the lake's tables (tests/unit/<name>.yml) instead of running tests.")
@click.option("--as-of", "record_as_of", default=None, help="With --record: read the inputs as of this instant or time (default: latest).")
@click.option("--rows", "record_rows", type=click.IntRange(1, 1000), default=10, show_default=True, help="With --record: rows per input.")
@click.option("--this", "record_this", is_flag=True, help="With --record: give the table's own rows too (an incremental run).")
@click.option("--name", "record_name", default=None, help="With --record: the test's name (default: TABLE_recorded).")
@state_option
@common_options
@click.pass_obj
def test_cmd(ctx: Context, select, exclude, target, vars_text, threads, fail_fast, quiet, log_format, plan_path, unit_only, record_table,
             record_as_of, record_rows, record_this, record_name, state_dir) -> None:
    """Run the data tests on the tables' latest commits (and the sources' data) and the unit
    tests on their given rows; exit 1 when an error-severity test fails."""
    if record_table is not None:
        from pipe import unit_record

        unit_record.record(ctx, record_table, record_as_of, record_rows, record_this, record_name, target, vars_text, compile_plan,
                           lambda plan, root: spark_factory(plan, root, ctx.debug, announce=not quiet))
        return
    _execute(ctx, "test --unit" if unit_only else "test", select, exclude, target, vars_text, False, False, threads, fail_fast, quiet,
             log_format, plan_path, state_dir=state_dir)


@click.command(name="retry")
@click.option("--threads", type=click.IntRange(1, 64), default=None, help="Steps run at the same time (default: as in the run retried).")
@click.option("--fail-fast", is_flag=True, help="Stop at the first failed step.")
@click.option("--quiet", "-q", is_flag=True, help="Print only errors and a one-line summary.")
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text", help="json: one JSON object per event on stdout.")
@common_options
@click.pass_obj
def retry_cmd(ctx: Context, threads, fail_fast, quiet, log_format) -> None:
    """Run again what failed, was skipped or was cancelled in the last `pipe run`, `build` or
    `test` (target/run_results.json), with its target, variables and deferral pins."""
    from pipe import dev_loop

    root = ctx.root()
    doc = dev_loop.last_results(root)
    args = doc["args"]
    command = args.get("command") if args.get("command") in ("run", "build", "test", "seed") else "run"
    if args.get("dry_run"):
        raise ProjectError([cli_problem("the last run was a dry run: it ran nothing to retry", f"run `pipe {command}` itself")])
    target, vars_text = args.get("target"), args.get("vars")
    plan = compile_plan(ctx, target, vars_text).plan
    again, gone = dev_loop.retried_steps(doc, plan)
    for sid in gone:
        output.err.print(f"[yellow]warning[/]: {sid} failed in the last run and is no longer in the project; not retried")
    if not again:
        output.out.print(f"nothing to retry: no step of the last `pipe {command}` ({doc.get('started_at', '?')}) failed or was skipped")
        return
    defer = dev_loop.retry_deferral(doc, root, plan, vars_text, again)
    spec = args.get("sample")  # the sample's text, "empty" for --empty
    _execute(ctx, command, tuple(again), (), target, vars_text, bool(args.get("full_refresh")), False,
             threads or int(args.get("threads") or 4), fail_fast, quiet, log_format, None, deferral=defer, retry_of=doc.get("started_at"),
             sample=_sample_arg(spec == "empty", None if spec == "empty" else spec))


def _execute(ctx: Context, command: str, select, exclude, target, vars_text, full_refresh, dry_run, threads, fail_fast, quiet,
             log_format, plan_path, continuous: bool = False, min_sync_interval_s: int = 0, defer_target: str | None = None,
             defer_as_of: str | None = None, state_dir: str | None = None, deferral=None, retry_of: str | None = None,
             sample=None) -> None:
    from compiler.graph import select as select_steps
    from pipe import dev_loop
    from runtime.executor import RunOptions

    if continuous and (dry_run or full_refresh or defer_target or sample):
        flag = "--dry-run" if dry_run else "--full-refresh" if full_refresh else "--defer" if defer_target else "--empty/--sample"
        raise ProjectError([cli_problem(f"--continuous cannot be combined with {flag}",
                                 "run the rebuild, the dry run or the deferred run once, then start the continuous run")])
    if defer_as_of is not None and defer_target is None:
        raise ProjectError([cli_problem("--defer-as-of pins what --defer reads; it needs --defer TARGET", "add --defer prod (the target to read from)")])
    plan, graph, root = load_plan(ctx, plan_path, target, vars_text)
    unit_only = command == "test --unit"
    command = "test" if unit_only else command
    chosen = [s for s in select_steps(graph, select, exclude, dev_loop.state_matcher(state_dir, plan)) if _in_command(command, plan.step(s).kind)]
    if command == "seed":  # `pipe seed`: the seeds among them (compiler/seeds.py)
        chosen = [s for s in chosen if plan.step(s).config.get("seed")]
    if unit_only:  # `pipe test --unit` (compiler/unit_tests.py)
        chosen = [s for s in chosen if plan.step(s).kind == "unit"]
    if not chosen:
        what = "test" if command == "test" else "step"
        output.err.print(f"[yellow]warning[/]: no {what} matches the selection; nothing to run")
        return
    if defer_target is not None:
        deferral = dev_loop.deferral(root, plan, chosen, defer_target, defer_as_of, vars_text)
    if deferral is not None and log_format == "text" and not quiet:
        from rich.markup import escape

        output.err.print(escape(deferral.summary()))
    # pipe build reuses the passes of tests whose tables have not changed; pipe test checks them all
    options = RunOptions(full_refresh=full_refresh, threads=threads, fail_fast=fail_fast, dry_run=dry_run, reuse_tests=command == "build",
                         sample=sample)
    if full_refresh:
        from rich.markup import escape

        from runtime.steps.context import RunContext
        from runtime.steps.write import rebuild_warnings

        for warning in rebuild_warnings(RunContext(plan, root, chosen, options)):
            output.err.print(f"[yellow]warning[/]: {escape(warning)}")
    args = {"command": command, "select": list(select), "exclude": list(exclude), "full_refresh": full_refresh, "dry_run": dry_run,
            "threads": threads, "target": plan.target.name, "vars": vars_text, "state": state_dir,
            "sample": sample.text if sample is not None else None}
    if retry_of:
        args["retry_of"] = retry_of
    factory = spark_factory(plan, root, ctx.debug, announce=not quiet and log_format == "text")
    with _run_lock(plan, root, dry_run or command == "test") as lock:  # tests only read
        if not continuous:
            run = _run_round(ctx, plan, root, chosen, options, factory, quiet, log_format, args, deferral, lock)
            if run.interrupted:
                raise click.exceptions.Exit(143 if run.terminated else 130)
            if run.failed:
                raise click.exceptions.Exit(EXIT_FAILED)
            return
        run = _run_continuously(ctx, plan, root, chosen, options, factory, quiet, log_format, args, min_sync_interval_s, lock)
    if run is not None and run.failed:
        raise click.exceptions.Exit(EXIT_FAILED)


def _in_command(command: str, kind: str) -> bool:
    """`pipe run` runs sources and tables (seeds too), `pipe test` the data and unit tests,
    `pipe build` all of them; `pipe seed` the seeds and `pipe test --unit` the unit tests
    (filtered in `_execute`)."""
    return command == "build" or (kind in ("test", "unit")) == (command == "test")


@contextlib.contextmanager
def _run_lock(plan, root: Path, dry_run: bool):
    """A run holds the lake's run lock (runtime/run_lock.py) from before Spark starts to its
    end; a second run is refused at once. A dry run writes nothing and takes no lock."""
    if dry_run:
        yield None
        return
    from runtime import run_lock
    from runtime.steps.context import RunContext

    where = RunContext(plan, root)
    with run_lock.hold(where.lake, where.storage_options, command="pipe run") as me:
        yield me


def _run_continuously(ctx, plan, root, chosen, options, factory, quiet, log_format, args, interval_s: int, lock=None):
    """Rounds until Ctrl-C (or SIGTERM): the first signal lets the current round finish and
    ends the loop; a second one interrupts at once. A failed round is reported and the next
    round retries (its input was not consumed). Returns the last round's result."""
    stop = threading.Event()
    previous = {}

    def on_signal(signum, frame):
        if stop.is_set():
            signal.signal(signal.SIGINT, signal.default_int_handler)
            raise KeyboardInterrupt
        stop.set()
        output.err.print("[yellow]stopping[/]: the current round finishes first (press Ctrl-C again to interrupt it)")

    for sig in (signal.SIGINT, signal.SIGTERM):
        previous[sig] = signal.signal(sig, on_signal)
    last = None
    number = 0
    try:
        while not stop.is_set():
            number += 1
            started = time.monotonic()
            if log_format == "text" and not quiet:
                output.out.print(f"[bold]round {number}[/] ({_utc_now()})")
            last = _run_round(ctx, plan, root, chosen, options, factory, quiet, log_format, {**args, "continuous": True, "round": number},
                              lock=lock)
            stop.wait(max(0.0, interval_s - (time.monotonic() - started)))
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if log_format == "text":
        output.err.print(f"stopped after {number} round{'s' if number != 1 else ''}")
    return last


def _utc_now() -> str:
    import datetime as dt

    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _run_round(ctx, plan, root, chosen, options, factory, quiet, log_format, args, deferral=None, lock=None):
    from runtime import run_lock, run_record
    from runtime.executor import Executor
    from pipe.run_display import Display

    display = Display(output.out, output.err, mode=log_format, quiet=quiet)
    executor = Executor(plan, root, chosen, options, spark_factory=factory, listener=display, defer=deferral)
    display.begin(executor.selected, {s.id: (s.kind, s.name) for s in plan.steps})
    started = run_record.utc_instant()
    run = executor.run()
    held = lock is None or run_lock.still_holds(executor.lake, executor.ctx.storage_options, lock)
    if not run.failed and not run.interrupted and not options.dry_run and args["command"] != "test" and options.sample is None and held:
        try:  # what `--defer` of another target pins this lake's tables at (runtime/run_record.py)
            run_record.record_success(executor.lake, executor.ctx.storage_options, started, plan.target.name, args["command"],
                                      executor.ctx.written)
        except Exception as exc:  # noqa: BLE001 - the run's commits stand; only deferral to this lake loses its latest pin
            from rich.markup import escape as escape_markup

            output.err.print(f"[yellow]warning[/]: the run succeeded, but its record could not be written ({type(exc).__name__}: "
                             f"{escape_markup(str(exc))}); `--defer {plan.target.name}` pins at the previous successful run")
    results = {
        "pipe_version": __version__,
        "project": plan.project,
        "target": plan.target.name,
        "args": args,
        "started_at": run.started_at,
        "elapsed_s": round(run.elapsed_s, 3),
        "success": not run.failed and not run.interrupted,
        "interrupted": run.interrupted,
        "lake": executor.lake,
        "steps": [r.to_dict() for r in run.steps],
    }
    if deferral is not None:
        results["defer"] = deferral.to_dict()
    target_dir = root / "target"
    target_dir.mkdir(exist_ok=True)
    tmp = target_dir / ".run_results.json.tmp"
    tmp.write_text(output.mask(json.dumps(results, indent=2, sort_keys=True, default=str)) + "\n", encoding="utf-8")
    os.replace(tmp, target_dir / "run_results.json")
    display.end(run, {"results": "target/run_results.json"})
    if ctx.debug:
        for r in run.steps:
            if r.traceback:
                output.err.print(r.traceback, markup=False)
    return run

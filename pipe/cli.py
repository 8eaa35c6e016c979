"""The `pipe` command. Exit codes: 0 success, 1 a step or run failed, 2 a mistake in the
project or the command line. A mistake never prints a Python traceback; `--debug` does."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path

import click

from compiler.errors import Location, PipeError, ProjectError
from pipe import __version__, output

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class _Context:
    def __init__(self, debug: bool, project_dir: str | None):
        self.debug = debug
        self.project_dir = project_dir

    def root(self) -> Path:
        from compiler.project import PROJECT_FILE, find_project_root

        if self.project_dir:
            return Path(self.project_dir).resolve()
        found = find_project_root(Path.cwd())
        if found is None:
            from compiler.errors import Diagnostic

            raise ProjectError([Diagnostic(Location(PROJECT_FILE), f"no {PROJECT_FILE} in {Path.cwd()} or any folder above it",
                                           "cd into a project, pass --project-dir, or create one with `pipe init NAME`")])
        return found


def _compile(ctx: _Context, target: str | None, vars_text: str | None, cache_write: bool = True, files=None):
    """The outcomes of the SQL checks are cached in target/; `pipe diff`, which leaves the
    working tree alone, only reads them (cache_write=False). `files`: the project's files, when
    already read (compiler.project.ProjectFiles)."""
    from compiler import partial
    from compiler.api import compile_project
    from compiler.project import ProjectFiles, parse_cli_vars

    root = ctx.root()
    cli_vars = parse_cli_vars(vars_text)
    if cache_write and files is None:
        files = ProjectFiles.read(root)  # the plan written below is of the very files fingerprinted
    result = compile_project(root, target=target, cli_vars=cli_vars, cache_dir=root / "target", cache_write=cache_write,
                             files=files)
    if result.warnings:
        output.diagnostics(result.warnings)
    output.hide_secrets(result.plan)
    if cache_write:
        # every command that compiles leaves the plan it used in target/plan.json, as `pipe compile`
        # does (dbt writes its manifest on every command): `pipe diff` compares against what ran
        fingerprint = partial.fingerprint(files, target, cli_vars)
        if partial.reuse(root / "target", fingerprint) is None:
            _write_plan(root / "target", result, fingerprint)
    return result


def _write_plan(target_dir: Path, result, fingerprint: str | None):
    """Writes the compiled plan to target_dir/plan.json atomically (a temporary file replaced),
    and records the compile for the next one (compiler/partial.py). Returns its summary."""
    from compiler import partial

    step_texts = partial.load_step_texts(target_dir)  # steps encoded by the last compile are not encoded again
    plan_json = result.plan.to_json(step_texts)
    target_dir.mkdir(exist_ok=True)
    tmp = target_dir / f".plan.json.{os.getpid()}.tmp"
    try:
        tmp.write_text(plan_json, encoding="utf-8")
        os.replace(tmp, target_dir / "plan.json")
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    partial.save_step_texts(target_dir, step_texts)
    summary = partial.Summary.of(result.plan)
    partial.remember(target_dir, fingerprint, plan_json, result.warnings, summary)
    return summary


def _set_project_dir(click_ctx: click.Context, _param, value):
    if value is not None:
        click_ctx.find_object(_Context).project_dir = value


def _set_debug(click_ctx: click.Context, _param, value):
    if value:
        click_ctx.find_object(_Context).debug = True


def _common(command):
    """Options every command takes, after the command name too (`pipe compile --project-dir x`)."""
    command = click.option("--project-dir", default=None, type=click.Path(file_okay=False), expose_value=False,
                           callback=_set_project_dir, help="Project folder (default: the nearest folder with pipe_project.yml).")(command)
    return click.option("--debug", is_flag=True, expose_value=False, callback=_set_debug, help="Show Python tracebacks for every error.")(command)


_target_option = click.option("--target", "-t", default=None, help="Target from pipe_project.yml (default: default_target).")
_vars_option = click.option("--vars", "vars_text", default=None, help="Variables as YAML or JSON, e.g. '{min_amount: 10}'.")


class _SelectorsOption(click.Option):
    """--select / --exclude take every word up to the next option, as dbt's do: `--select a b`
    is `--select 'a b'` (the flag may also be repeated). The words reach selection joined by
    spaces, which is its union syntax."""

    def add_to_parser(self, parser, ctx):
        result = super().add_to_parser(parser, ctx)
        option = next((parser._long_opt.get(o) or parser._short_opt.get(o) for o in self.opts
                       if o in parser._long_opt or o in parser._short_opt), None)
        if option is not None:
            process = option.process

            def greedy(value, state):
                words = [value]
                while state.rargs and not any(state.rargs[0].startswith(p) for p in parser._opt_prefixes):
                    words.append(state.rargs.pop(0))
                process(" ".join(words), state)

            option.process = greedy
        return result


_state_option = click.option("--state", "state_dir", default=None, type=click.Path(file_okay=False), metavar="DIR",
                             help="Reference run for state:/result: selectors: a folder with its plan.json and run_results.json.")
_select_option = click.option("--select", "-s", multiple=True, cls=_SelectorsOption, metavar="SELECTOR...",
                              help="Steps to choose: name, +name, name+, tag:x, path:..., config.KEY:value (several: --select a b).")
_exclude_option = click.option("--exclude", multiple=True, cls=_SelectorsOption, metavar="SELECTOR...",
                               help="Steps to leave out (same syntax as --select).")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="pipe")
@click.option("--debug", is_flag=True, help="Show Python tracebacks for every error.")
@click.option("--project-dir", default=None, type=click.Path(file_okay=False), help="Project folder (default: the nearest folder with pipe_project.yml).")
@click.pass_context
def cli(click_ctx: click.Context, debug: bool, project_dir: str | None) -> None:
    """pipe: declarative pipelines on Spark, with Apache Hudi tables."""
    click_ctx.obj = _Context(debug, project_dir)


@cli.command()
@click.argument("name")
@_common
@click.pass_obj
def init(ctx: _Context, name: str) -> None:
    """Create a new project NAME from the example project."""
    import shutil

    from pipe.template import template_dir

    if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name):
        raise ProjectError([_cli(f"invalid project name '{name}'", "use letters, digits and _, starting with a letter or _")])
    dest = Path.cwd() / name
    if dest.exists():
        raise ProjectError([_cli(f"{dest} already exists", "choose another name or remove the folder")])
    source = template_dir()
    tmp = dest.with_name(f".{name}.pipe-init")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(source, tmp, ignore=shutil.ignore_patterns("__pycache__", "lake", "target", "spark-warehouse", "*.pyc"))
    project_file = tmp / "pipe_project.yml"
    text = project_file.read_text(encoding="utf-8")
    project_file.write_text(re.sub(r"(?m)^name: .*$", f"name: {name}", text, count=1), encoding="utf-8")
    os.replace(tmp, dest)  # the project appears whole or not at all
    output.line(f"Created project [bold]{name}[/] in {dest}")
    output.line(f"Next: cd {name} && pipe compile")


@cli.command(name="compile")
@_target_option
@_vars_option
@_common
@click.pass_obj
def compile_cmd(ctx: _Context, target: str | None, vars_text: str | None) -> None:
    """Validate the project and write target/plan.json."""
    started = time.perf_counter()
    from compiler import partial
    from compiler.project import ProjectFiles, parse_cli_vars

    root = ctx.root()
    cli_vars = parse_cli_vars(vars_text)
    target_dir = root / "target"
    # partial parsing (compiler/partial.py): a project unchanged since the plan.json in target/
    # was compiled keeps it; otherwise it is compiled from the very files fingerprinted
    files = ProjectFiles.read(root)
    fingerprint = partial.fingerprint(files, target, cli_vars)
    reused = partial.reuse(target_dir, fingerprint)
    if reused is not None:
        if reused.warnings:
            output.diagnostics(reused.warnings)
        summary = reused.summary
    else:
        from compiler.api import compile_project, cyclic_gc_paused

        with cyclic_gc_paused():  # the plan's encoding too: a collection then walks every object the compile made
            result = compile_project(root, target=target, cli_vars=cli_vars, cache_dir=target_dir, files=files)
            if result.warnings:
                output.diagnostics(result.warnings)
            summary = _write_plan(target_dir, result, fingerprint)
    elapsed = time.perf_counter() - started
    detail = ", ".join(f"{n} {a}" for a, n in summary.actions.items())
    output.line(
        f"Compiled [bold]{summary.project}[/] for target [bold]{summary.target}[/]: "
        f"{summary.sources} source{'s' if summary.sources != 1 else ''}, {summary.tables} table{'s' if summary.tables != 1 else ''}"
        + (f" ({detail})" if detail else "")
        + (f" of which {summary.seeds} seed{'s' if summary.seeds != 1 else ''}" if summary.seeds else "")
        + (f", {summary.tests} test{'s' if summary.tests != 1 else ''}" if summary.tests else "")
        + (f", {summary.unit_tests} unit test{'s' if summary.unit_tests != 1 else ''}" if summary.unit_tests else "")
        + f" -> target/plan.json in {elapsed:.2f}s"
    )


@cli.command(name="ls")
@_select_option
@_exclude_option
@_target_option
@_vars_option
@click.option("--output", "fmt", type=click.Choice(["text", "json"]), default="text", help="One id per line, or one JSON object per line.")
@_state_option
@_common
@click.pass_obj
def ls_cmd(ctx: _Context, select, exclude, target, vars_text, fmt, state_dir) -> None:
    """List the steps of the project, optionally selected."""
    from compiler.graph import select as select_steps
    from pipe.dev_loop import state_matcher

    result = _compile(ctx, target, vars_text)
    chosen = select_steps(result.graph, select, exclude, state_matcher(state_dir, result.plan))
    if not chosen and (select or exclude):
        output.err.print("[yellow]warning[/]: no step matches the selection")
    for step_id in chosen:
        if fmt == "json":
            step = result.plan.step(step_id)
            output.plain(json.dumps({"id": step.id, "kind": step.kind, "name": step.name, "depends_on": list(step.depends_on),
                                     "file": step.file, "tags": list(step.tags), "action": step.action}, sort_keys=True))
        else:
            output.plain(step_id)


@cli.group(name="docs")
def docs_group() -> None:
    """A browsable site of the project: the lineage graph, every table and source, their columns and commits."""


@docs_group.command(name="generate")
@_select_option
@_exclude_option
@_target_option
@_vars_option
@click.option("--no-lake", is_flag=True, help="Do not read the tables' timelines (no commits on the pages).")
@_common
@click.pass_obj
def docs_generate(ctx: _Context, select, exclude, target, vars_text, no_lake) -> None:
    """Write the site to target/docs/ (open target/docs/index.html, no server needed)."""
    started = time.perf_counter()
    from compiler import partial
    from compiler.project import ProjectFiles, parse_cli_vars
    from pipe.docs import record

    root = ctx.root()
    out = root / "target" / "docs"
    cli_vars = parse_cli_vars(vars_text)
    files = ProjectFiles.read(root)  # compiled below from the very bytes fingerprinted
    fingerprint = record.fingerprint(partial.fingerprint(files, target, cli_vars), select, exclude, no_lake)
    done = record.up_to_date(out, fingerprint)
    if done is not None:  # an unchanged project, and a site without commits: nothing to parse, trace or render
        if done.warnings:
            output.diagnostics(done.warnings)
        output.line(f"The docs of [bold]{done.project}[/] are up to date ({done.tables} table{'s' if done.tables != 1 else ''}, "
                    f"{done.sources} source{'s' if done.sources != 1 else ''}; the project has not changed): "
                    f"{(out / 'index.html').relative_to(root)} in {time.perf_counter() - started:.2f}s")
        output.line("Open it in a browser (no server needed), or run `pipe docs serve`")
        return

    from compiler.api import cyclic_gc_paused

    with cyclic_gc_paused():  # the SQL trees kept for column lineage would make each collection walk millions of nodes
        _docs_build(ctx, files, fingerprint, started, select, exclude, target, vars_text, no_lake)


def _docs_build(ctx: _Context, files, fingerprint: str | None, started: float, select, exclude, target, vars_text, no_lake) -> None:
    from compiler.graph import select as select_steps
    from compiler.sqlcheck import keep_parsed
    from pipe.docs import record
    from pipe.docs.lake import read_histories
    from pipe.docs.site import build_site, write_site

    with keep_parsed() as parsed:  # column lineage reads the trees the SQL check parses
        result = _compile(ctx, target, vars_text, files=files)
    root = result.project.root
    out = root / "target" / "docs"
    chosen = select_steps(result.graph, select, exclude)
    picked = set(chosen)
    tables = [s.name for s in result.plan.steps if s.kind == "write" and s.id in picked]
    histories, note = ({}, "Commits are not shown: the site was generated with --no-lake.") if no_lake else read_histories(result.plan, root, tables)
    selection = " ".join(([f"--select {' '.join(select)}"] if any(s.strip() for s in select) else [])
                         + ([f"--exclude {' '.join(exclude)}"] if any(s.strip() for s in exclude) else []))
    site = build_site(result, chosen, histories=histories, lake_note=note, cache_dir=root / "target", selection=selection, parsed=parsed)
    record.remember(out, None)  # a site half written is never taken for an up-to-date one
    index = write_site(site, out)
    sources = sum(p.kind == "source" for p in site.pages.values())
    record.remember(out, fingerprint, record.Recorded(result.warnings, site.project, len(site.pages) - sources, sources))
    read = sum(1 for h in histories.values() if h.rows)
    output.line(f"Wrote the docs of [bold]{site.project}[/]: {len(site.pages) - sources} table{'s' if len(site.pages) - sources != 1 else ''}, "
                f"{sources} source{'s' if sources != 1 else ''}"
                + (f", commits of {read} table{'s' if read != 1 else ''}" if read else "")
                + f" -> {index.relative_to(root)} in {time.perf_counter() - started:.2f}s")
    if note and not no_lake:
        output.line(f"[dim]{note}[/]")
    output.line("Open it in a browser (no server needed), or run `pipe docs serve`")


@docs_group.command(name="serve")
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True, help="Port on 127.0.0.1 (0: any free one).")
@_common
@click.pass_obj
def docs_serve(ctx: _Context, port: int) -> None:
    """Serve target/docs/ on 127.0.0.1 until Ctrl-C."""
    from pipe.docs.serve import serve

    site = ctx.root() / "target" / "docs"
    if not (site / "index.html").is_file():
        raise ProjectError([_cli(f"no site in {site}", "run `pipe docs generate` first")])
    try:
        serve(site, port, lambda url: output.line(f"Serving the docs at {url} (Ctrl-C stops)"))
    except OSError as exc:
        raise ProjectError([_cli(f"cannot serve on 127.0.0.1:{port}: {exc.strerror or exc}",
                                 "choose another port with --port (0 picks a free one)")]) from exc
    output.line("Stopped")


def _load_plan(ctx: _Context, plan_path: str | None, target: str | None, vars_text: str | None):
    """The plan to run: compiled now from the project, or read from --plan (as reviewed in CI)."""
    from compiler.plan import Plan

    if plan_path is None:
        result = _compile(ctx, target, vars_text)
        return result.plan, result.graph, result.project.root
    if target or vars_text:
        raise ProjectError([_cli("--plan runs a compiled plan as it is; --target and --vars belong to `pipe compile`",
                                 "compile with those options, then run the plan it wrote")])
    path = Path(plan_path)
    try:
        plan = Plan.from_json(path.read_text(encoding="utf-8"), origin=str(path))
    except OSError as exc:
        raise ProjectError([_cli(f"cannot read {path}: {exc.strerror}", "run `pipe compile` to write target/plan.json")]) from exc
    output.hide_secrets(plan)
    return plan, plan.graph(), ctx.root()


def _spark_factory(plan, root: Path, debug: bool = False, announce: bool = True):
    """Starts (once, when a step first needs it) the run's Spark: a Spark Connect session when the
    target or SPARK_REMOTE names a server, or when this project's own `pipe server` runs for this
    target with its settings; embedded Spark otherwise."""
    from compiler.render import resolve_env_placeholders
    from runtime.executor import RunError

    def start():
        from runtime.spark import connect, session

        try:
            conf = {k: resolve_env_placeholders(str(v), os.environ) for k, v in plan.target.spark_conf.items()}
            master = resolve_env_placeholders(plan.target.spark_master, os.environ)
        except KeyError as exc:
            raise RunError(f"environment variable {exc.args[0]} is not set; the Spark settings of target {plan.target.name} need it",
                           f"export {exc.args[0]}=... before `pipe run`") from exc
        try:
            remote = connect.remote_of(conf, os.environ)
            own = None if remote else _own_server(plan, root, master, conf)
            if not debug:
                _quiet_query_loggers()
            if own is not None:
                from runtime.spark import server

                server.lease(own)
                spark = session.get_spark(master, conf, reads_s3=_reads_s3(plan), reads_kafka=_reads_kafka(plan), remote=own.url,
                                          own_server=own)
            else:
                spark = session.get_spark(master, conf, app_name=f"pipe {plan.project}", reads_s3=_reads_s3(plan),
                                          reads_kafka=_reads_kafka(plan), packages=_packages(plan))
            if announce:
                from rich.markup import escape

                from runtime.spark import cluster

                if own is not None:
                    output.err.print(f"[dim]Spark: the pipe server of target {plan.target.name} at {own.url} "
                                     f"({own.master}; `pipe server stop` ends it)[/]")
                elif remote.startswith("sc://"):
                    output.err.print(f"[dim]Spark: Spark Connect server {escape(remote.split('/;')[0])}[/]")
                if cluster.shipment is not None:  # a cluster: say which Python runs the tasks
                    output.err.print(f"[dim]{escape(cluster.shipment.describe())}[/]")
            return spark
        except Exception as exc:  # noqa: BLE001 - Spark could not start: say why, once
            from runtime.spark.cluster import ExecutorPythonError

            if isinstance(exc, PipeError):
                raise
            if isinstance(exc, ExecutorPythonError):
                raise RunError(str(exc), exc.hint) from exc
            raise RunError(f"Spark did not start: {exc}", getattr(exc, "hint", None)) from exc

    return start


def _own_server(plan, root: Path, master: str, conf: dict):
    """The running `pipe server` of this project and target, if it has the target's settings."""
    from runtime.spark import server

    state = server.read_state(root, plan.target.name)
    if state is None:
        return None
    if not server.started_with(state, master, conf, plan.project):
        output.err.print(f"[yellow]warning[/]: the pipe server of target {plan.target.name} ({state.url}) was started with other "
                         "Spark settings or another version of pipe's code; this command starts its own Spark (`pipe server stop` and `pipe server start` renew it)")
        return None
    server.touch(state)
    return state


def _packages(plan) -> tuple[str, ...]:
    """The jars the plan's sources need on Spark's classpath (the JDBC driver of each `jdbc` source)."""
    from runtime.sources.jdbc import package_for

    return tuple(sorted({p for s in plan.steps if s.kind == "ingest" and s.config.get("kind") == "jdbc"
                         for p in [package_for(s.config)] if p}))


def _reads_kafka(plan) -> bool:
    """Whether Spark's tasks read Kafka (a `kind: kafka` source, with confluent-kafka)."""
    return any(s.kind == "ingest" and s.config.get("kind") == "kafka" for s in plan.steps)


def _reads_s3(plan) -> bool:
    """Whether Spark's tasks read or write S3 themselves (with boto3): a lake or a source on S3."""
    from compiler.render import resolve_env_placeholders

    try:
        lake = resolve_env_placeholders(plan.target.lake, os.environ)
    except KeyError:
        lake = plan.target.lake
    return lake.startswith(("s3://", "s3a://")) or any(
        s.kind == "ingest" and s.config.get("kind") in ("s3_events", "s3_incremental") for s in plan.steps)


def _quiet_query_loggers() -> None:
    """PySpark logs every failed query with its whole Java stack trace on stderr; pipe reports
    the error itself (with the file), so those loggers stay quiet unless --debug."""
    from pyspark.logger import PySparkLogger

    for name in ("SQLQueryContextLogger", "DataFrameQueryContextLogger"):
        PySparkLogger.getLogger(name).disabled = True


_RUN_OPTIONS = (
    _select_option,
    _exclude_option,
    _target_option,
    _vars_option,
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
    _state_option,
    click.option("--empty", is_flag=True, help="Run the selected tables' SQL on inputs with no rows: new tables are created empty; nothing is consumed."),
    click.option("--sample", "sample_spec", default=None, metavar="SPEC",
                 help="Build the selected tables from part of their input: 'N rows', 'N rows per partition', 'N days', 'N hours'."),
)


def _run_options(command):
    for option in reversed(_RUN_OPTIONS):
        command = option(command)
    return command


@cli.command(name="run")
@_run_options
@click.option("--continuous", is_flag=True, help="Run rounds until interrupted (Ctrl-C finishes the current round, then exits).")
@click.option("--min-sync-interval-s", type=click.IntRange(0, 86400), default=10, show_default=True,
              help="With --continuous: a round starts at least this many seconds after the previous one started.")
@_common
@click.pass_obj
def run_cmd(ctx: _Context, select, exclude, target, vars_text, full_refresh, dry_run, threads, fail_fast, quiet, log_format, plan_path,
            defer_target, defer_as_of, state_dir, empty, sample_spec, continuous, min_sync_interval_s) -> None:
    """Run the project's pipeline on Spark: only new input, checkpoints in each table's timeline."""
    _execute(ctx, "run", select, exclude, target, vars_text, full_refresh, dry_run, threads, fail_fast, quiet, log_format, plan_path,
             continuous, min_sync_interval_s, defer_target=defer_target, defer_as_of=defer_as_of, state_dir=state_dir,
             sample=_sample_arg(empty, sample_spec))


@cli.command(name="build")
@_run_options
@_common
@click.pass_obj
def build_cmd(ctx: _Context, select, exclude, target, vars_text, full_refresh, dry_run, threads, fail_fast, quiet, log_format, plan_path,
              defer_target, defer_as_of, state_dir, empty, sample_spec) -> None:
    """Run the tables and their data tests in dependency order: a table whose error-severity
    test fails stops the steps that read it."""
    _execute(ctx, "build", select, exclude, target, vars_text, full_refresh, dry_run, threads, fail_fast, quiet, log_format, plan_path,
             defer_target=defer_target, defer_as_of=defer_as_of, state_dir=state_dir, sample=_sample_arg(empty, sample_spec))


@cli.command(name="seed")
@_run_options
@_common
@click.pass_obj
def seed_cmd(ctx: _Context, select, exclude, target, vars_text, full_refresh, dry_run, threads, fail_fast, quiet, log_format, plan_path,
             defer_target, defer_as_of, state_dir, empty, sample_spec) -> None:
    """Load the seeds (seeds/**/*.csv) into their tables: only those whose file or settings
    changed since their last load; --full-refresh loads them all again."""
    _execute(ctx, "seed", select, exclude, target, vars_text, full_refresh, dry_run, threads, fail_fast, quiet, log_format, plan_path,
             defer_target=defer_target, defer_as_of=defer_as_of, state_dir=state_dir, sample=_sample_arg(empty, sample_spec))


def _sample_arg(empty: bool, spec: str | None):
    """--empty / --sample SPEC as runtime/sample.Sample, or None."""
    from runtime.sample import Sample, SampleError

    if empty and spec:
        raise ProjectError([_cli("--empty and --sample cannot be combined", "--empty builds no rows; --sample builds some")])
    if empty:
        return Sample.nothing()
    if spec is None:
        return None
    try:
        return Sample.parse(spec)
    except SampleError as exc:
        raise ProjectError([_cli(f"--sample {spec!r} is not a sample", "'1000 rows', '100 rows per partition', '3 days' or '12 hours'")]) from exc


@cli.command(name="test")
@_select_option
@_exclude_option
@_target_option
@_vars_option
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
@_state_option
@_common
@click.pass_obj
def test_cmd(ctx: _Context, select, exclude, target, vars_text, threads, fail_fast, quiet, log_format, plan_path, unit_only, record_table,
             record_as_of, record_rows, record_this, record_name, state_dir) -> None:
    """Run the data tests on the tables' latest commits (and the sources' data) and the unit
    tests on their given rows; exit 1 when an error-severity test fails."""
    if record_table is not None:
        from pipe import unit_record

        unit_record.record(ctx, record_table, record_as_of, record_rows, record_this, record_name, target, vars_text, _compile,
                           lambda plan, root: _spark_factory(plan, root, ctx.debug, announce=not quiet))
        return
    _execute(ctx, "test --unit" if unit_only else "test", select, exclude, target, vars_text, False, False, threads, fail_fast, quiet,
             log_format, plan_path, state_dir=state_dir)


@cli.command(name="retry")
@click.option("--threads", type=click.IntRange(1, 64), default=None, help="Steps run at the same time (default: as in the run retried).")
@click.option("--fail-fast", is_flag=True, help="Stop at the first failed step.")
@click.option("--quiet", "-q", is_flag=True, help="Print only errors and a one-line summary.")
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text", help="json: one JSON object per event on stdout.")
@_common
@click.pass_obj
def retry_cmd(ctx: _Context, threads, fail_fast, quiet, log_format) -> None:
    """Run again what failed, was skipped or was cancelled in the last `pipe run`, `build` or
    `test` (target/run_results.json), with its target, variables and deferral pins."""
    from pipe import dev_loop

    root = ctx.root()
    doc = dev_loop.last_results(root)
    args = doc["args"]
    command = args.get("command") if args.get("command") in ("run", "build", "test", "seed") else "run"
    if args.get("dry_run"):
        raise ProjectError([_cli("the last run was a dry run: it ran nothing to retry", f"run `pipe {command}` itself")])
    target, vars_text = args.get("target"), args.get("vars")
    plan = _compile(ctx, target, vars_text).plan
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


def _execute(ctx: _Context, command: str, select, exclude, target, vars_text, full_refresh, dry_run, threads, fail_fast, quiet,
             log_format, plan_path, continuous: bool = False, min_sync_interval_s: int = 0, defer_target: str | None = None,
             defer_as_of: str | None = None, state_dir: str | None = None, deferral=None, retry_of: str | None = None,
             sample=None) -> None:
    from compiler.graph import select as select_steps
    from pipe import dev_loop
    from runtime.executor import RunOptions

    if continuous and (dry_run or full_refresh or defer_target or sample):
        flag = "--dry-run" if dry_run else "--full-refresh" if full_refresh else "--defer" if defer_target else "--empty/--sample"
        raise ProjectError([_cli(f"--continuous cannot be combined with {flag}",
                                 "run the rebuild, the dry run or the deferred run once, then start the continuous run")])
    if defer_as_of is not None and defer_target is None:
        raise ProjectError([_cli("--defer-as-of pins what --defer reads; it needs --defer TARGET", "add --defer prod (the target to read from)")])
    plan, graph, root = _load_plan(ctx, plan_path, target, vars_text)
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
    factory = _spark_factory(plan, root, ctx.debug, announce=not quiet and log_format == "text")
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
    import signal
    import threading
    import time

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


def _instant_arg(value: str | None, what: str) -> str | None:
    if value is not None and not re.fullmatch(r"\d{14,17}", value):
        raise ProjectError([_cli(f"{what} {value!r} is not an instant time", "instants look like 20261121170042123; see `pipe timeline TABLE`")])
    return value


def _table_for(ctx: _Context, name: str, target: str | None):
    """The project table NAME as stored in the target's lake (opened without Spark)."""
    from compiler.api import has_dead_letter_table
    from compiler.errors import did_you_mean
    from runtime.steps.context import RunContext

    result = _compile(ctx, target, None)
    plan = result.plan
    tables = [s.name for s in plan.steps if s.kind == "write"]
    # the dead-letter table of each s3_events and s3_incremental source (and kafka source with on_bad_record: dead_letter) is a table too
    tables += [s.name + "_dead_letter" for s in plan.steps if s.kind == "ingest" and has_dead_letter_table(s.config)]
    # and so is the quarantine table of each table with a `quarantine` expectation
    tables += [s.name + "__quarantine" for s in plan.steps
               if s.kind == "write" and any(e["action"] == "quarantine" for e in s.config.get("expect") or ())]
    # and the failures table of each test with store_failures
    tables += [s.name + "__failures" for s in plan.steps if s.kind == "test" and s.config.get("store_failures")]
    if name not in tables:
        raise ProjectError([_cli(f"no table named '{name}' in project {plan.project}", did_you_mean(name, tables) or f"tables: {', '.join(tables)}")])
    lake = RunContext(plan, result.project.root)
    uri = lake.table_uri(name)
    if not lake.table_exists(name):
        hint = f"run `pipe run --select +{name}`"
        if name.endswith("_dead_letter") and name not in [s.name for s in plan.steps]:
            hint = "nothing has been dead-lettered yet (the table appears with the first message or object)"
        elif name.endswith("__quarantine") and name not in [s.name for s in plan.steps]:
            hint = "no row has been quarantined yet (the table appears with the first one)"
        elif name.endswith("__failures") and name not in [s.name for s in plan.steps]:
            hint = f"the test has not run yet: `pipe test --select test:{name[:-len('__failures')]}`"
        raise ProjectError([_cli(f"table {name} has not been built yet (nothing at {uri})", hint)])
    return lake.open_table(name), plan


def _spark_for(table, plan, root: Path, debug: bool):
    """The Spark session that reads (or compacts) `table`; on S3 it must have an S3 file system."""
    from runtime import s3
    from runtime.table.errors import TableError

    spark = _spark_factory(plan, root, debug)()
    try:
        s3.check_spark(spark, table.storage.spec.uri, f"table {table.config.name}")
    except s3.SparkCannotReadS3 as exc:
        raise TableError(str(exc), exc.hint) from exc
    return spark


@cli.command(name="pack-env")
@click.option("--output", "output_path", default=None, type=click.Path(dir_okay=False),
              help="Also copy the archive here (e.g. a folder every node and the driver can read).")
@click.option("--rebuild", is_flag=True, help="Build it again even if the cache has it.")
@_common
@click.pass_obj
def pack_env_cmd(ctx: _Context, output_path, rebuild) -> None:
    """Pack the Python packages pipe's tasks need into an archive for a cluster's executors, and print the target settings that ship it."""
    import shutil

    from runtime.spark.cluster import ExecutorPythonError, pack_env
    from runtime.executor import RunError

    started = time.perf_counter()
    try:
        packed = pack_env(rebuild=rebuild)
    except ExecutorPythonError as exc:
        raise RunError(str(exc), exc.hint) from exc
    path = packed.path
    if output_path:
        path = Path(output_path).resolve()
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(packed.path, path)
    size = path.stat().st_size / 1e6
    output.line(f"Packed {', '.join(packed.pins)} for Python {packed.python} -> {path} ({size:.0f} MB, "
                f"{time.perf_counter() - started:.1f}s)")
    output.line("Add to the target's spark conf in pipe_project.yml (put the archive where the cluster can read it, "
                "e.g. s3://..., and use that URI):")
    for key, value in packed.settings(str(path)).items():
        output.plain(f'  {key}: "{value}"')
    output.line(f"[dim]The executors need Python {packed.python} at {packed.base} (the same machine image); "
                "pyspark comes from Spark itself.[/]")


@cli.group(name="server")
def server_group() -> None:
    """A warm local Spark for this project and target (Spark Connect): start, stop, status."""


def _server_target(ctx: _Context, target: str | None):
    from compiler.render import resolve_env_placeholders
    from runtime.spark import connect

    result = _compile(ctx, target, None)
    plan = result.plan
    try:
        conf = {k: resolve_env_placeholders(str(v), os.environ) for k, v in plan.target.spark_conf.items()}
        master = resolve_env_placeholders(plan.target.spark_master, os.environ)
    except KeyError as exc:
        raise ProjectError([_cli(f"environment variable {exc.args[0]} is not set; the Spark settings of target {plan.target.name} need it",
                                 f"export {exc.args[0]}=...")]) from exc
    if connect.remote_of(conf, {}):
        raise ProjectError([_cli(f"target {plan.target.name} names a Spark Connect server (spark.remote); pipe uses that one",
                                 "a pipe server is for targets that run Spark on this machine")])
    return plan, result.project.root, master, conf


def _age(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600} h {seconds % 3600 // 60} min" if seconds >= 3600 else f"{seconds // 60} min {seconds % 60} s"


@server_group.command(name="start")
@_target_option
@click.option("--idle-timeout", default="60m", show_default=True, metavar="DURATION",
              help="Stop after this long without a command using it (e.g. 30m, 2h; 0: never).")
@click.option("--no-warmup", is_flag=True, help="Return once the server listens, without its warm-up (the first runs are then slower).")
@_common
@click.pass_obj
def server_start(ctx: _Context, target: str | None, idle_timeout: str, no_warmup: bool) -> None:
    """Start a Spark Connect server with the target's Spark settings; pipe run, show and test use it."""
    from runtime.spark import server

    match = re.fullmatch(r"\s*(\d+)\s*([smh]?)\s*", idle_timeout)
    if match is None:
        raise ProjectError([_cli(f"--idle-timeout {idle_timeout!r} is not a duration", "write e.g. 90s, 30m, 2h, or 0 for never")])
    idle = int(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[match.group(2)]
    plan, root, master, conf = _server_target(ctx, target)
    started = time.perf_counter()
    state, new = server.start(root, plan.project, plan.target.name, master, conf, idle_timeout_s=idle)  # ServerError: a RunError
    from pipe import forkserver

    forkserver.ensure_started()  # commands on the server start without importing pipe and PySpark (pipe/launch.py)
    if not new:
        output.line(f"The pipe server of target [bold]{plan.target.name}[/] already runs at {state.url} "
                    f"(for {_age(time.time() - state.started_at)})")
        return
    up = time.perf_counter() - started
    from pipe.warmup import warm_up

    try:
        warmed = None if no_warmup else warm_up(state, conf)
    except BaseException:
        server.stop(root, plan.target.name)
        raise
    stops = f"after {_age(idle)} idle or " if idle else ""
    output.line(f"Started the pipe server of target [bold]{plan.target.name}[/] at {state.url} ({state.master}) "
                f"in {up:.1f}s, " + ("not warmed up (--no-warmup)" if warmed is None else f"warmed up in {warmed:.1f}s"))
    output.line(f"pipe run, show and test in this project use it; it stops {stops}with `pipe server stop`. Log: {state.log}")


@server_group.command(name="stop")
@_target_option
@_common
@click.pass_obj
def server_stop(ctx: _Context, target: str | None) -> None:
    """Stop the target's Spark Connect server."""
    from runtime.spark import server

    plan, root, _, _ = _server_target(ctx, target)
    state = server.stop(root, plan.target.name)
    if state is None:
        output.line(f"No pipe server runs for target [bold]{plan.target.name}[/] of this project")
    else:
        output.line(f"Stopped the pipe server of target [bold]{plan.target.name}[/] ({state.url}, up {_age(time.time() - state.started_at)})")


@server_group.command(name="status")
@_target_option
@_common
@click.pass_obj
def server_status(ctx: _Context, target: str | None) -> None:
    """Say whether the target's Spark Connect server runs, and whether commands use it."""
    from runtime.spark import server

    plan, root, master, conf = _server_target(ctx, target)
    state = server.read_state(root, plan.target.name)
    if state is None:
        output.line(f"No pipe server runs for target [bold]{plan.target.name}[/]; commands start embedded Spark "
                    "(`pipe server start` starts one)")
        raise click.exceptions.Exit(EXIT_FAILED)
    matches = server.started_with(state, master, conf, plan.project)
    idle = f"idle for {_age(server.idle_for(state))}" if server.idle_for(state) else "in use"
    stops = f"; stops after {_age(state.idle_timeout_s)} idle" if state.idle_timeout_s else ""
    output.line(f"The pipe server of target [bold]{plan.target.name}[/] runs at {state.url} ({state.master}, pid {state.server_pid}), "
                f"up {_age(time.time() - state.started_at)}, {idle}{stops}")
    if not matches:
        output.line("[yellow]It was started with other Spark settings than the target has now, or another version of pipe's code: "
                    "commands do not use it[/] "
                    "(`pipe server stop`, then `pipe server start`)")
        raise click.exceptions.Exit(EXIT_FAILED)
    from pipe import forkserver

    handed = "commands are handed to pipe's fork server" if forkserver.serves() else "no fork server: commands import pipe and PySpark themselves"
    output.line(f"{handed}. Log: {state.log}")


@cli.command(name="show")
@click.argument("table_name", metavar="TABLE")
@click.option("--limit", "-n", type=click.IntRange(0), default=20, show_default=True, help="Rows to print.")
@click.option("--as-of", default=None, help="Time travel: the table as of this instant.")
@click.option("--since", default=None, help="Incremental: rows written by commits after this instant.")
@click.option("--meta", is_flag=True, help="Include Hudi's _hoodie_* meta columns.")
@click.option("--output", "fmt", type=click.Choice(["text", "json"]), default="text", help="A table, or one JSON object per row.")
@_target_option
@_common
@click.pass_obj
def show_cmd(ctx: _Context, table_name, limit, as_of, since, meta, fmt, target) -> None:
    """Print rows of a table.

    A table on a local disk is read in this process (pyarrow), without starting Spark; a
    table on S3 is read with Spark."""
    from rich.table import Table as RichTable

    _instant_arg(as_of, "--as-of")
    _instant_arg(since, "--since")
    table, plan = _table_for(ctx, table_name, target)
    until = as_of if since else None
    keys = list(table.config.record_key_fields) if not since else []  # an incremental read keeps commit order
    if table.storage.spec.is_s3:
        table.spark = _spark_for(table, plan, ctx.root(), ctx.debug)
        columns, rows = _rows_with_spark(table.read(as_of=as_of, since=since, until=until, meta=meta), keys, limit + 1)
    else:
        schema, batches = table.read_batches(as_of=as_of, since=since, until=until, meta=meta)
        columns, rows = _first_rows(schema, batches, [k for k in keys if k in schema.names], limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    if fmt == "json":
        for r in rows:
            output.plain(json.dumps(dict(zip(columns, r)), sort_keys=True, default=str))
        return
    t = RichTable(show_edge=False, box=None, header_style="bold", pad_edge=False)
    for c in columns:
        t.add_column(c, overflow="fold")
    for r in rows:
        t.add_row(*["" if v is None else str(v) for v in r])
    output.table(t)
    what = f"as of {as_of}" if as_of and not since else (f"since {since}" if since else "latest")
    how = "; read with Spark, as the table is on S3" if table.storage.spec.is_s3 else ""
    output.line(f"[dim]{len(rows)} row{'s' if len(rows) != 1 else ''} of {table_name} ({what}){', more not shown (--limit)' if more else ''}{how}[/]")


def _rows_with_spark(df, keys: list[str], n: int) -> tuple[list[str], list[tuple]]:
    """The first `n` rows of a DataFrame by `keys`: the sort and the limit run in Spark."""
    if keys:
        df = df.orderBy(*[f"`{c}`" for c in keys])
    return df.columns, [tuple(r) for r in df.limit(n).collect()]


def _first_rows(schema, batches, keys: list[str], n: int) -> tuple[list[str], list[tuple]]:
    """The first `n` rows by `keys` (ascending, as Spark's orderBy), or the first
    `n` read when there are no keys; only `n` rows are held besides the batch being read.
    Values are the Python values Spark's collect() gives (pipe.output.spark_value)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    best = pa.Table.from_batches([], schema)  # (schema.empty_table() would import pandas)
    for batch in batches:
        best = pa.concat_tables([best, pa.Table.from_batches([batch], schema)])
        if keys:
            order = pc.sort_indices(best, sort_keys=[(k, "ascending") for k in keys])  # record keys are never null
            best = best.take(order.slice(0, n))
        elif best.num_rows >= n:
            break
    best = best.slice(0, n)
    types = [f.type for f in schema]
    # timestamps as microseconds since the epoch (as Spark hands them to Python): pyarrow's own
    # conversion to datetime imports pandas, which costs a third of a second
    best = pa.Table.from_arrays([c.cast(pa.int64()) if pa.types.is_timestamp(c.type) else c for c in best.columns], names=best.column_names)
    return schema.names, [tuple(output.spark_value(v, t) for v, t in zip(row.values(), types)) for row in best.to_pylist()]


@cli.command(name="diff")
@click.argument("base_plan", required=False, type=click.Path(dir_okay=False))
@click.argument("head_plan", required=False, type=click.Path(dir_okay=False))
@click.option("--base-ref", default=None, help="Compile the project as it is at this git ref (e.g. origin/main) for the base; the working tree is not touched.")
@_target_option
@_vars_option
@click.option("--format", "fmt", type=click.Choice(["text", "markdown", "json"]), default="text", help="markdown: a pull-request comment; json: see docs/diff.md.")
@click.option("--fail-on", type=click.Choice(["rewrite", "destructive", "breaking"]), default=None,
              help="Exit 1 only if a change is of this class or a more severe one (for gating CI).")
@click.option("--data", "data", default=None, metavar="BASE:HEAD",
              help="Compare the rows of the tables built in two targets instead of the plans, e.g. --data prod:dev (Spark).")
@_select_option
@_exclude_option
@click.option("--samples", type=click.IntRange(0, 1000), default=None, metavar="N",
              help="With --data: sample rows shown per kind (added, removed, changed) and table [default: 5].")
@click.option("--fail-on-data", "fail_on_data", multiple=True, metavar="EXPR",
              help="With --data: exit 1 if a table meets EXPR, e.g. 'changed_rows > 1%', 'removed_rows > 0', 'mismatch.amount > 0.5%'.")
@_state_option
@_common
@click.pass_obj
def diff_cmd(ctx: _Context, base_plan, head_plan, base_ref, target, vars_text, fmt, fail_on, data, select, exclude, samples,
             fail_on_data, state_dir) -> None:
    """Compare two plans: what each step's change does, and what it touches downstream.

    BASE_PLAN and HEAD_PLAN are plan.json files; HEAD_PLAN defaults to compiling the project
    now. Exit 0: no changes, 1: changes (with --fail-on: a change of that class), 2: error.

    With --data BASE:HEAD, compare the rows of each table as built in two targets (joined by
    record key in Spark). Exit 0, or 1 when a --fail-on-data gate trips; 2: error."""
    from compiler.diff import diff_plans, fails, rebuild_warnings
    from pipe import diff_output

    data_only = [f for f, v in (("--select", any(s.strip() for s in select)), ("--exclude", any(s.strip() for s in exclude)),
                                ("--samples", samples is not None), ("--fail-on-data", bool(fail_on_data)), ("--state", state_dir)) if v]
    if data is not None:
        _data_diff(ctx, data, base_plan, head_plan, base_ref, target, fail_on, vars_text, fmt, select, exclude,
                   5 if samples is None else samples, fail_on_data, state_dir)
        return
    if data_only:
        raise ProjectError([_cli(f"{', '.join(data_only)} belong{'s' if len(data_only) == 1 else ''} to a data diff",
                                 "add --data BASE:HEAD, e.g. `pipe diff --data prod:dev`")])
    if base_ref is not None and base_plan is not None and head_plan is None:
        base_plan, head_plan = None, base_plan  # `pipe diff --base-ref REF head.json`
    if (base_plan is None) == (base_ref is None):
        raise ProjectError([_cli("give the base: a plan file (`pipe diff BASE_PLAN`) or a git ref (`pipe diff --base-ref origin/main`)",
                                 "e.g. `pipe diff --base-ref origin/main`, or `pipe diff old/plan.json target/plan.json`")])
    if base_ref is not None:
        base, base_label = _plan_at_ref(ctx, base_ref, target, vars_text), base_ref
    else:
        base, base_label = _read_plan(base_plan), base_plan
    if head_plan is not None:
        head, head_label = _read_plan(head_plan), head_plan
    else:
        head, head_label = _compile(ctx, target, vars_text, cache_write=False).plan, "working tree"
    diff = diff_plans(base, head, base_label, head_label)
    diff.warnings.extend(rebuild_warnings(diff, head))
    _write_diff(diff_output, diff, fmt)
    if fails(diff, fail_on) if fail_on else diff.has_changes:
        raise click.exceptions.Exit(EXIT_FAILED)


def _data_diff(ctx: _Context, data: str, base_plan, head_plan, base_ref, target, fail_on, vars_text, fmt, select, exclude,
               samples: int, fail_on_data, state_dir: str | None = None) -> None:
    """`pipe diff --data BASE:HEAD`: the selected tables as built in two targets, compared in
    Spark (runtime/data_diff.py), written by pipe/data_diff_output.py."""
    from dataclasses import replace

    from compiler.graph import SelectionError
    from compiler.graph import select as select_steps
    from pipe.dev_loop import state_matcher
    from runtime import data_diff, s3
    from runtime.steps.context import RunContext

    sides = data.split(":")
    if len(sides) != 2 or not all(x.strip() for x in sides):
        raise ProjectError([_cli(f"--data {data!r} is not BASE:HEAD", "name two targets of pipe_project.yml, e.g. --data prod:dev")])
    base_name, head_name = (x.strip() for x in sides)
    given = [f for f, v in (("BASE_PLAN", base_plan), ("HEAD_PLAN", head_plan), ("--base-ref", base_ref), ("--target", target),
                            ("--fail-on", fail_on)) if v]
    if given:
        raise ProjectError([_cli(f"--data compares two targets' tables; {', '.join(given)} belong{'s' if len(given) == 1 else ''} to a plan diff",
                                 "run the plan diff and the data diff as two commands (the markdown of --data is a section to append)")])
    try:
        gates = data_diff.parse_gates(fail_on_data)
    except data_diff.GateError as exc:
        raise ProjectError([_cli(f"--fail-on-data: {exc}")]) from exc
    base_result = _compile(ctx, base_name, vars_text, cache_write=False)
    head_result = _compile(ctx, head_name, vars_text, cache_write=False)
    base_plan_, head_plan_ = base_result.plan, head_result.plan
    chosen: list[str] = []
    failed: SelectionError | None = None
    for result in (head_result, base_result):  # a table of one target's plan only is chosen too
        try:
            chosen += [i for i in select_steps(result.graph, select, exclude, state_matcher(state_dir, result.plan)) if i not in chosen]
        except SelectionError as exc:
            failed = failed or exc
    if failed is not None and not chosen:
        raise failed
    steps = {s.id: s for s in (*base_plan_.steps, *head_plan_.steps) if s.kind == "write"}
    names = [steps[i].name for i in chosen if i in steps]
    if not names and state_dir is not None:  # nothing modified (state:modified+ on a change of docs only): nothing to compare
        _render_data_diff(data_diff.DataDiff(base_name, head_name, (), tuple(gates)), fmt)
        return
    if not names:
        raise ProjectError([_cli("no table is selected", "a data diff compares tables; select some with --select")])
    base_lake = RunContext(base_plan_, base_result.project.root)
    head_lake = RunContext(head_plan_, head_result.project.root)
    present = {n: (base_lake.table_exists(n), head_lake.table_exists(n)) for n in names}
    if not any(b or h for b, h in present.values()):
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        raise ProjectError([_cli(f"no selected table is built in {base_name} or in {head_name} ({shown})",
                                 f"build them first, e.g. `pipe run --target {head_name}`")])
    opened = {n: (base_lake.open_table(n), head_lake.open_table(n)) for n, (b, h) in present.items() if b and h}
    columns_of = {c.name.lower() for pair in opened.values() for t in pair for c in (t.writer_schema() or ())}
    unknown = [g.metric for g in gates if g.metric.startswith("mismatch.") and g.metric.split(".", 1)[1].lower() not in columns_of]
    if unknown and opened:  # before Spark starts: a typo in a column's name
        raise ProjectError([_cli(f"--fail-on-data: no table compared has a column {unknown[0].split('.', 1)[1]!r}",
                                 "name a column of a selected table, e.g. mismatch.amount")])
    spark = _spark_factory(head_plan_, head_result.project.root, ctx.debug)() if opened else None
    for pair in opened.values():
        for t in pair:
            t.spark = spark
    lineage = _column_graph(head_result, ctx.root())
    reads = {s.name for s in head_plan_.steps if s.kind == "write"} | {
        s.name for s in head_plan_.steps if s.kind == "ingest" and s.config.get("kind") == "table"}
    lakes = {base_name: base_lake.lake, head_name: head_lake.lake}
    tables = []
    for name in names:
        if name not in opened:
            in_base, in_head = present[name]
            status = "only_in_base" if in_base else "only_in_head" if in_head else "in_neither"
            tables.append(data_diff.TableDataDiff(name, status))
            continue
        base_table, head_table = opened[name]
        for t in (base_table, head_table):
            try:
                s3.check_spark(spark, t.storage.spec.uri, f"table {name}")
            except s3.SparkCannotReadS3 as exc:
                raise data_diff.DataDiffError(str(exc), exc.hint) from exc
        scoped = any(p.step(f"table.{name}").config.get("index") in data_diff.PARTITION_SCOPED
                     for p in (base_plan_, head_plan_) if f"table.{name}" in p.step_ids)
        d = data_diff.compare(spark, name, base_table, head_table, partition_scoped=scoped, samples=samples, labels=(base_name, head_name))
        inputs = data_diff.compare_inputs(base_table, head_table, (base_name, head_name), reads, lakes)
        columns = tuple(replace(c, reaches=lineage.downstream(name, c.name)) if c.mismatches and lineage is not None else c
                        for c in d.columns)
        tables.append(replace(d, inputs=inputs, columns=columns))
    _render_data_diff(data_diff.DataDiff(base_name, head_name, tuple(tables), tuple(gates)), fmt)


def _write_diff(renderer, diff, fmt: str) -> None:
    """Writes a plan diff (renderer: pipe/diff_output.py) or a data diff (pipe/data_diff_output.py) in `fmt`."""
    if fmt == "json":
        output.out.file.write(renderer.render_json(diff))
    elif fmt == "markdown":
        output.out.file.write(renderer.render_markdown(diff))
    else:
        renderer.render_text(diff, output.out)
    output.out.file.flush()


def _render_data_diff(diff, fmt: str) -> None:
    """Writes a data diff in `fmt`; exit 1 when a --fail-on-data gate tripped."""
    from pipe import data_diff_output

    _write_diff(data_diff_output, diff, fmt)
    if diff.failures:
        raise click.exceptions.Exit(EXIT_FAILED)


def _column_graph(result, root: Path):
    """The head's column lineage (compiler/lineage.py), read from the docs' cache in target/ where
    it holds it and not written back (a diff leaves the working tree alone); None if it fails."""
    from compiler.lineage import ColumnGraph, LineageCache, plan_lineage

    steps = {s.id: s for s in result.plan.steps if s.kind in ("ingest", "write")}
    try:
        return ColumnGraph(steps, plan_lineage(steps, LineageCache(root / "target")))
    except Exception:  # noqa: BLE001 - lineage is a help to the reader; the diff stands without it
        return None


def _read_plan(path_text: str):
    from compiler.plan import Plan

    path = Path(path_text)
    try:
        return Plan.from_json(path.read_text(encoding="utf-8"), origin=str(path))
    except OSError as exc:
        raise ProjectError([_cli(f"cannot read {path}: {exc.strerror}", "give a plan.json written by `pipe compile`")]) from exc


def _plan_at_ref(ctx: _Context, ref: str, target: str | None, vars_text: str | None):
    """Compiles the project as committed at `ref`, from a `git archive` of it in a temporary
    folder (the working tree and the index are not touched)."""
    import io
    import subprocess
    import tarfile
    import tempfile

    from compiler.api import compile_project
    from compiler.project import parse_cli_vars

    root = ctx.root()

    def git(*args: str, binary: bool = False):
        try:
            return subprocess.run(["git", "-C", str(root), *args], capture_output=True, check=True, text=not binary)
        except FileNotFoundError as exc:
            raise ProjectError([_cli("--base-ref needs git, which is not installed")]) from exc
        except subprocess.CalledProcessError as exc:
            err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr
            raise ProjectError([_cli(f"git {' '.join(args[:2])} failed: {err.strip().splitlines()[-1] if err.strip() else exc}",
                                     "is the project in a git repository, and does the ref exist? (`git fetch` it first in CI)")]) from exc

    top = Path(git("rev-parse", "--show-toplevel").stdout.strip())
    prefix = Path(root).resolve().relative_to(top.resolve())
    try:
        commit = git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}").stdout.strip()
    except ProjectError as exc:
        raise ProjectError([_cli(f"git knows no commit '{ref}'", "check the ref's spelling; in CI fetch the base branch first "
                                 "(`git fetch origin main:refs/remotes/origin/main`, or actions/checkout with fetch-depth: 0)")]) from exc
    tar_bytes = git("archive", "--format=tar", commit, "--", str(prefix) if str(prefix) != "." else ".", binary=True).stdout
    with tempfile.TemporaryDirectory(prefix="pipe-diff-") as tmp:
        with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as tar:
            tar.extractall(tmp, filter="data")
        base_root = Path(tmp) / prefix
        if not (base_root / "pipe_project.yml").exists():
            raise ProjectError([_cli(f"there is no pipe_project.yml in {prefix} at {ref}", "the project did not exist yet at that ref")])
        try:
            # the outcomes of the working tree's SQL checks hold for every table the ref did not change
            return compile_project(base_root, target=target, cli_vars=parse_cli_vars(vars_text), cache_dir=root / "target", cache_write=False).plan
        except ProjectError as exc:
            first = exc.diagnostics[0] if exc.diagnostics else None
            raise ProjectError([_cli(f"the project at {ref} does not compile: {first.message if first else exc}",
                                     f"check out {ref} and run `pipe compile` to see why")]) from exc


@cli.command(name="discover")
@click.argument("source")
@_target_option
@_vars_option
@_common
@click.pass_obj
def discover_cmd(ctx: _Context, source, target, vars_text) -> None:
    """Write down the tables a fan-out SOURCE captures (<source>.captured.yml beside it): its topics, their keys and columns."""
    from pipe.discover import discover

    result = _compile(ctx, target, vars_text)
    path, said = discover(result, ctx.root(), source)
    rel = path.relative_to(ctx.root()).as_posix()
    output.plain(f"{rel}:")
    for line in said:
        output.plain(line)
    output.plain(f"Review {rel} and commit it; `pipe diff` shows what it changes.")


@cli.command(name="doctor")
@click.argument("paths", nargs=-1, metavar="[PATH...]")
@click.option("--output", "fmt", type=click.Choice(["text", "json"]), default="text", help="Text, or one JSON object.")
@_target_option
@_common
@click.pass_obj
def doctor_cmd(ctx: _Context, paths, fmt, target) -> None:
    """Audit the Hudi tables under PATH (default: the target's lake) before pipe writes to them; exit 1 if any needs a change."""
    from pipe import doctor
    from runtime import s3

    settings: dict[str, str] = {}
    if not paths or ctx.project_dir or _in_project():
        from runtime.steps.context import RunContext

        result = _compile(ctx, target, None, cache_write=False)
        where = RunContext(result.plan, result.project.root)
        settings = where.s3a
        paths = paths or (where.lake,)
    uris = []
    for path in paths:
        if s3.is_s3(path):
            uris.append(path)
            continue
        folder = Path(path).expanduser().resolve()
        if not folder.is_dir():
            raise ProjectError([_cli(f"no folder {path}", "name a lake's folder, a table's, or an s3:// location")])
        uris.append(str(folder))
    findings = doctor.audit(uris, lambda uri: s3.client_options(settings, s3.bucket_of(uri)) if s3.is_s3(uri) else ())
    if fmt == "json":
        output.plain(json.dumps({"tables": [f.to_dict() for f in findings], "paths": list(paths)}, sort_keys=True))
    elif not findings:
        output.line(f"no Hudi table under {', '.join(paths)} (a table is a folder with .hoodie/hoodie.properties)")
    else:
        for f in findings:
            for line in doctor.describe(f):
                output.line(line)
            output.line("")
        output.line(doctor.summary(findings))
    if not findings:
        raise click.exceptions.Exit(EXIT_USAGE)
    code = doctor.exit_code(findings)
    if code:
        raise click.exceptions.Exit(code)


def _in_project() -> bool:
    from compiler.project import find_project_root

    return find_project_root(Path.cwd()) is not None


@cli.command(name="timeline")
@click.argument("table_name", metavar="TABLE")
@click.option("--all", "show_all", is_flag=True, help="Include archived instants.")
@click.option("--output", "fmt", type=click.Choice(["text", "json"]), default="text", help="A table, or one JSON object per instant.")
@_target_option
@_common
@click.pass_obj
def timeline_cmd(ctx: _Context, table_name, show_all, fmt, target) -> None:
    """Print the instants of a table: time, action, state, operation, counts, checkpoints."""
    from rich.table import Table as RichTable

    from runtime.table.history import instant_rows, short_checkpoint

    table, _ = _table_for(ctx, table_name, target)
    rows = instant_rows(table, archived=show_all)
    if fmt == "json":
        for row in rows:
            output.plain(json.dumps(row, sort_keys=True))
        return
    t = RichTable(show_edge=False, box=None, header_style="bold", pad_edge=False)
    checks = any("expectations" in row for row in rows)
    completed = any("completed" in row for row in rows)  # Hudi 1.x: incremental reads go by completion time
    for col in (("instant", "action", "state") + (("completed",) if completed else ()) + ("operation", "ins/upd/del", "files", "checkpoints")
                + (("expectations",) if checks else ())):
        t.add_column(col, overflow="fold", no_wrap=col not in ("checkpoints", "expectations"))
    for row in rows:
        cps = row.get("checkpoints") or {}
        cp_text = ", ".join(f"{k}={short_checkpoint(v)}" for k, v in sorted(cps.items()))
        iud = f"{row['inserts']}/{row['updates']}/{row['deletes']}" if "inserts" in row else ""
        state = row["state"] + (" (archived)" if row["timeline"] == "archived" else "")
        cells = ([row["instant"], row["action"], state] + ([row.get("completed", "")] if completed else [])
                 + [row.get("detail") or row.get("operation", ""), iud, str(row.get("files", "")), cp_text])
        if checks:
            e = row.get("expectations") or {}
            cells.append(", ".join(f"{n}: {v['failed']} {v['action']}" for n, v in sorted(e.items()) if n != "rows"))
        t.add_row(*cells)
    output.table(t)  # never crop instants


# --- table services ---------------------------------------------------------------------------

def _service_context(ctx: _Context, table_name: str, target: str | None):
    """The table, its settings from the project, and the incremental consumers holding it back."""
    from runtime.steps.context import RunContext

    table, plan = _table_for(ctx, table_name, target)
    step = next((s for s in plan.steps if s.kind == "write" and s.name == table_name), None)
    config = dict(step.config) if step is not None else {"clean": {}, "archive": {}}
    consumers = RunContext(plan, ctx.root()).consumer_checkpoints(table_name)
    return table, config, consumers


@contextlib.contextmanager
def _naming(table_name: str):
    """Hints of the table engine say `pipe ... TABLE ...`; the user typed the table's name."""
    from runtime.table.errors import TableError

    try:
        yield
    except TableError as exc:
        if exc.hint:
            exc.hint = exc.hint.replace(" TABLE ", f" {table_name} ")
        raise


def _report_retired(table) -> None:
    """A change that retired a Java writer's metadata table says so (Table.retire_metadata_table)."""
    if table.retired:
        output.line(f"[yellow]![/] {table.retired}")


def _downstream_warning(table_name: str, consumers: dict[str, str], instant: str) -> None:
    """Consumers that have read past the instant the table now ends at fail on their next run."""
    past = {who: cp for who, cp in consumers.items() if cp > instant}
    for who, cp in sorted(past.items()):
        reader = who.split(" ", 1)[0]
        output.line(f"[yellow]![/] {who} has read {table_name} up to {cp}, which is gone: its next run stops until it is rebuilt "
                    f"(`pipe run --select {reader} --full-refresh`), or its source sets `on_checkpoint_lost: full_read`")


@cli.command(name="clean")
@click.argument("table_name", metavar="TABLE")
@click.option("--policy", type=click.Choice(["keep_latest_commits", "keep_latest_file_versions"]), default=None,
              help="Override the table's clean.policy for this run.")
@click.option("--retain", type=click.IntRange(1), default=None, help="Override the table's clean.retain for this run.")
@_target_option
@_common
@click.pass_obj
def clean_cmd(ctx: _Context, table_name, policy, retain, target) -> None:
    """Delete old file versions of a table, then archive its timeline.

    Keeps what the retained commits, savepoints and incremental consumers still need."""
    table, config, consumers = _service_context(ctx, table_name, target)
    clean_cfg, archive_cfg = config.get("clean") or {}, config.get("archive") or {}
    policy = policy or clean_cfg.get("policy", "keep_latest_commits")
    retain = retain or clean_cfg.get("retain", 10)
    oldest = min(consumers.values()) if consumers else None
    with _naming(table_name):
        result = table.clean(policy, retain, retain_from=oldest)
        archived = table.archive(archive_cfg.get("min_instants", 20), archive_cfg.get("max_instants", 30), keep_from=oldest)
    _report_retired(table)
    what = f"{policy}, retain {retain}"
    if result.instant:
        output.line(f"[green]✓[/] cleaned {table_name}: deleted {result.files_deleted} file(s) no retained commit needs "
                    f"({what}; clean instant {result.instant})")
    else:
        output.line(f"[green]✓[/] nothing to clean in {table_name} ({what})")
    if result.earliest_retained:
        output.line(f"  earliest retained commit: {result.earliest_retained}")
    for sp in table.savepoints():
        output.line(f"  kept: the files of savepoint {sp}")
    for who, cp in sorted(consumers.items(), key=lambda kv: kv[1]):
        output.line(f"  kept: what {who} has read up to {cp} needs")
    if archived:
        output.line(f"  archived {len(archived)} instant(s), {archived[0]} to {archived[-1]} (`pipe timeline {table_name} --all` lists them)")


@cli.command(name="sync")
@click.argument("table_names", nargs=-1, metavar="[TABLE]...")
@click.option("--full", is_flag=True, help="Compare every partition of the table with the catalog's, not only those written since the last sync.")
@_target_option
@_vars_option
@_common
@click.pass_obj
def sync_cmd(ctx: _Context, table_names, full, target, vars_text) -> None:
    """Register tables in the target's catalog and bring them up to date (every table, or the
    TABLEs named).

    `pipe run` does this after every commit; `pipe sync` catches up after a sync that failed,
    and registers the tables of a catalog newly set on the target (docs/catalog.md)."""
    from compiler.errors import did_you_mean
    from runtime.steps.context import RunContext
    from runtime.steps.sync import close_catalog

    result = _compile(ctx, target, vars_text)
    plan = result.plan
    if not plan.target.catalog:
        raise ProjectError([_cli(f"target {plan.target.name} has no catalog to sync to",
                                 "set `catalog: {kind: spark}` or `catalog: {kind: glue}` on the target in pipe_project.yml (docs/catalog.md)")])
    writes = {s.name: s for s in plan.steps if s.kind == "write"}
    for name in table_names:
        if name not in writes:
            raise ProjectError([_cli(f"no table named '{name}' in project {plan.project}", did_you_mean(name, writes) or f"tables: {', '.join(writes)}")])
    lake = RunContext(plan, result.project.root, spark_factory=_spark_factory(plan, result.project.root, ctx.debug, announce=False))
    try:
        _sync_tables(ctx, lake, [writes[n] for n in table_names or writes], full)
    finally:
        close_catalog(lake)


def _sync_tables(ctx: _Context, lake, steps_, full: bool) -> None:
    """`pipe sync`: each table synced in turn; one's failure does not stop the others."""
    from rich.markup import escape

    from runtime.steps.sync import sync_step

    failed = 0
    for step in steps_:
        name = step.name
        if not lake.table_exists(name):
            output.line(f"[dim]-[/] {name}: not built yet (nothing at {escape(lake.table_uri(name))}); its first run registers it")
            continue
        try:
            outcome = sync_step(lake, step, full=full)
        except Exception as exc:  # noqa: BLE001 - one table's failure does not stop the others
            if ctx.debug:
                _print_traceback()
            failed += 1
            output.fail(f"{name}: catalog sync failed: {exc}", getattr(exc, "hint", None)
                        or (None if isinstance(exc, PipeError) else "run again with --debug for the traceback"))
            if getattr(exc, "unreachable", False):  # the others would wait for it again
                break
            continue
        if outcome is None:
            output.line(f"[dim]-[/] {name}: no commit has written its columns yet; nothing to register")
        elif outcome.up_to_date:
            output.line(f"[green]✓[/] {name}: {', '.join(outcome.names)} up to date (instant {outcome.instant})")
        else:
            output.line(f"[green]✓[/] {name}{escape(outcome.summary()).replace('; ', ': ', 1)} (instant {outcome.instant}"
                        f"{', every partition compared' if outcome.full else ''})")
    if failed:
        raise click.exceptions.Exit(EXIT_FAILED)


@cli.command(name="compact")
@click.argument("table_name", metavar="TABLE")
@_target_option
@_common
@click.pass_obj
def compact_cmd(ctx: _Context, table_name, target) -> None:
    """Compact a merge-on-read table: fold the log files of every file group into a new base
    file (one commit), so that reads no longer merge them."""
    from runtime.table.config import MERGE_ON_READ
    from runtime.table.errors import TableError

    table, plan = _table_for(ctx, table_name, target)
    if table.config.table_type != MERGE_ON_READ:
        raise TableError(f"table {table_name} is copy-on-write: its writes leave no log files to compact",
                         "only tables with `type: merge_on_read` are compacted")
    with _naming(table_name):
        before = [s for s in table.view().latest_slices() if s.has_logs]
        pending = table.timeline().pending_compactions()  # a Java writer's plan is executed too
        if before or pending:
            table.spark = _spark_for(table, plan, ctx.root(), ctx.debug)
        done = table.compact() if before or pending else None
    _report_retired(table)
    if done is None:
        output.line(f"[green]✓[/] nothing to compact in {table_name}: no file group has log files")
        return
    logs = sum(len(s.log_files) for s in before)
    output.line(f"[green]✓[/] compacted {table_name}: {len(before)} file group(s), {logs} log file(s) folded into new base files "
                f"(commit {done}); `pipe clean {table_name}` deletes the old versions once no retained commit needs them")


@cli.command(name="savepoint")
@click.argument("table_name", metavar="TABLE")
@click.argument("instant", required=False)
@click.option("--delete", "delete", is_flag=True, help="Delete the savepoint of INSTANT instead.")
@click.option("--comment", default="", help="Stored with the savepoint.")
@_target_option
@_common
@click.pass_obj
def savepoint_cmd(ctx: _Context, table_name, instant, delete, comment, target) -> None:
    """Savepoint a commit (default: the latest), so that cleaning keeps its files and the
    table can be restored to it; or delete a savepoint (--delete)."""
    _instant_arg(instant, "INSTANT")
    table, _, _ = _service_context(ctx, table_name, target)
    if delete:
        if instant is None:
            raise ProjectError([_cli("--delete needs the INSTANT of the savepoint", f"savepoints of {table_name}: {', '.join(table.savepoints()) or 'none'}")])
        with _naming(table_name):
            table.delete_savepoint(instant)
        _report_retired(table)
        output.line(f"[green]✓[/] deleted the savepoint of {table_name} at {instant}; cleaning may now remove its files")
        return
    with _naming(table_name):
        done = table.savepoint(instant, comment=comment)
    _report_retired(table)
    output.line(f"[green]✓[/] savepointed {table_name} at {done}: cleaning keeps its files, and `pipe restore {table_name} {done}` returns the table to it")


@cli.command(name="restore")
@click.argument("table_name", metavar="TABLE")
@click.argument("instant")
@_target_option
@_common
@click.pass_obj
def restore_cmd(ctx: _Context, table_name, instant, target) -> None:
    """Return a table to a completed commit: every later write is undone under one restore
    instant. Source checkpoints go back with the data, so the next run reads that input again."""
    _instant_arg(instant, "INSTANT")
    table, _, consumers = _service_context(ctx, table_name, target)
    with _naming(table_name):
        restored, undone = table.restore(instant)
    _report_retired(table)
    output.line(f"[green]✓[/] restored {table_name} to {instant}: undid {len(undone)} write(s) ({', '.join(undone)}); restore instant {restored}")
    _downstream_warning(table_name, consumers, instant)


@cli.command(name="rollback")
@click.argument("table_name", metavar="TABLE")
@click.argument("instant")
@_target_option
@_common
@click.pass_obj
def rollback_cmd(ctx: _Context, table_name, instant, target) -> None:
    """Undo the latest completed write of a table (INSTANT names it, as a check). Its source
    checkpoints go with it, so the next run reads that input again."""
    _instant_arg(instant, "INSTANT")
    table, _, consumers = _service_context(ctx, table_name, target)
    with _naming(table_name):
        rolled = table.rollback(instant)
    _report_retired(table)
    latest = table.timeline().latest_completed()
    now = f"the table is as of {latest.time}" if latest else "the table has no commit now"
    output.line(f"[green]✓[/] rolled back {table_name} {instant} (rollback instant {rolled}); {now}")
    _downstream_warning(table_name, consumers, latest.time if latest else "")


@cli.command(name="migrate")
@click.argument("table_name", metavar="TABLE")
@click.option("--to", "to_version", type=click.Choice(["6", "8", "9"]), required=True,
              help="The Hudi table version: 6 (Hudi 0.14/0.15), 8 (Hudi 1.0) or 9 (Hudi 1.1).")
@click.option("--dry-run", is_flag=True, help="Say what would change, and change nothing.")
@_target_option
@_common
@click.pass_obj
def migrate_cmd(ctx: _Context, table_name, to_version, dry_run, target) -> None:
    """Upgrade or downgrade a table's Hudi version in place, as Hudi's own writer does: failed
    writes rolled back, a merge-on-read table compacted, the timeline rewritten in the new
    version's layout, hoodie.properties changed in one crash-safe step, an empty commit on the
    timeline. Running it again finishes an interrupted migration."""
    from runtime.table.config import MERGE_ON_READ

    to = int(to_version)
    table, plan = _table_for(ctx, table_name, target)
    with _naming(table_name):
        if dry_run:
            m = table.migrate(to, dry_run=True)
        else:
            if table.config.table_type == MERGE_ON_READ and table.config.table_version != to:
                table.spark = _spark_for(table, plan, ctx.root(), ctx.debug)  # the compaction before it
            m = table.migrate(to)
    _report_retired(table)
    if m.from_version == to:
        if m.finished:
            verb = "would delete" if dry_run else "deleted"
            output.line(f"[green]✓[/] {table_name} is at version {to}; {verb} {len(m.finished)} file(s) an interrupted migration left "
                        f"of the old layout (e.g. {m.finished[0]})")
        else:
            output.line(f"[green]✓[/] {table_name} is at version {to} already: nothing to do")
        return
    if dry_run:
        output.line(f"{table_name}: version {m.from_version} -> {to} would")
        for line in m.lines():
            output.line(f"  {line}")
        output.line("  write an empty commit recording the migration (nothing was changed: --dry-run)")
        return
    output.line(f"[green]✓[/] migrated {table_name} from version {m.from_version} to {to} (commit {m.instant})")
    for line in m.lines():
        output.line(f"  {line}")


def _print_traceback() -> None:
    """With --debug: the traceback of the exception being handled (traceback is imported only then)."""
    import traceback

    traceback.print_exc()


def _cli(message: str, hint: str | None = None):
    from compiler.errors import Diagnostic

    return Diagnostic(Location("<command line>"), message, hint)


# Commands after which a failed run has left files as they were.
_WRITING_COMMANDS = ("compile", "init")


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args  # before or after the command name
    command = next((a for a in args if a in cli.commands), None)
    # what pipe prints goes through output.mask: env_var() values of settings and options never show
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = output.MaskingStream(sys.stdout), output.MaskingStream(sys.stderr)
    previous = _cancel_on_sigterm()
    _stacks_on_sigusr2(streams[1])
    try:
        return _main(args, debug, command)
    finally:
        sys.stdout, sys.stderr = streams
        output.forget_secrets()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _stacks_on_sigusr2(stderr) -> None:
    """`kill -USR2 <pid>` prints where each of the command's Python threads is, on its standard
    error, and the command goes on: what to send a `pipe` that seems stuck (docs/run.md)."""
    import faulthandler

    if threading.current_thread() is threading.main_thread() and hasattr(signal, "SIGUSR2"):
        try:
            faulthandler.register(signal.SIGUSR2, file=stderr, all_threads=True)
        except (AttributeError, ValueError, OSError):  # no file descriptor (an embedding's stream): no dumps
            pass


def _cancel_on_sigterm():
    """SIGTERM cancels the command as Ctrl-C does (the run's steps are cancelled and reported,
    their writes roll back, the run lock is released), and it exits 143. Returns the handler it
    replaced (None when it replaced none: not in the main thread, or one is set already)."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return None

    def on_sigterm(signum, frame):  # noqa: ARG001 - signal handler
        from runtime.errors import Terminated

        raise Terminated()

    signal.signal(signal.SIGTERM, on_sigterm)
    return signal.SIG_DFL


def _main(args: list[str], debug: bool, command: str | None) -> int:
    try:
        code = cli.main(args=args, prog_name="pipe", standalone_mode=False)
        if isinstance(code, int) and code:
            return code  # click returns the code of an Exit raised by a command
    except ProjectError as exc:
        if debug:
            _print_traceback()
        output.diagnostics(exc.diagnostics, wrote_nothing=command in _WRITING_COMMANDS)
        return EXIT_USAGE
    except PipeError as exc:
        if debug:
            _print_traceback()
        output.fail(str(exc), getattr(exc, "hint", None))
        return getattr(exc, "exit_code", EXIT_USAGE)  # e.g. 1 for a run refused because another one is going on
    except click.exceptions.Abort:
        output.fail("aborted")
        return 130
    except click.ClickException as exc:
        exc.show()
        return EXIT_USAGE
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except KeyboardInterrupt as exc:
        output.fail("terminated (SIGTERM)" if getattr(exc, "signal_name", "") == "SIGTERM" else "interrupted")
        return getattr(exc, "exit_code", 130)
    except Exception as exc:  # a bug in pipe, not in the project
        if debug:
            _print_traceback()
        from runtime.table.errors import TableError

        if isinstance(exc, TableError):  # a table service or write refused; nothing was changed
            output.fail(str(exc), exc.hint)
            return EXIT_FAILED
        output.fail(f"internal error: {type(exc).__name__}: {exc}", "this is a bug in pipe; run again with --debug for the traceback and report it")
        return EXIT_FAILED
    return EXIT_OK


def entry() -> None:
    code = main()
    if code in (130, 143) and any(t.name.startswith("pipe-step") and t.is_alive() for t in threading.enumerate()):
        # interrupted twice, with a step's thread still in a call to Spark: Python would wait for
        # it at exit (concurrent.futures joins its threads); what is printed is printed, so go now
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)
    sys.exit(code)

"""`pipe server start | stop | status`, a project's own Spark Connect server
(runtime/spark/server.py), and `pipe pack-env`, the Python environment shipped to a cluster."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import click

from compiler.errors import ProjectError
from pipe import output
from pipe.commands.common import EXIT_FAILED, cli_problem, common_options, compile_plan, Context, target_option


@click.command(name="pack-env")
@click.option("--output", "output_path", default=None, type=click.Path(dir_okay=False),
              help="Also copy the archive here (e.g. a folder every node and the driver can read).")
@click.option("--rebuild", is_flag=True, help="Build it again even if the cache has it.")
@common_options
@click.pass_obj
def pack_env_cmd(ctx: Context, output_path, rebuild) -> None:
    """Pack the Python packages pipe's tasks need into an archive for a cluster's executors, and print the target settings that ship it."""
    import shutil

    from runtime.spark.cluster import ExecutorPythonError, pack_env
    from runtime.errors import RunError

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


@click.group(name="server")
def server_group() -> None:
    """A warm local Spark for this project and target (Spark Connect): start, stop, status."""


def _server_target(ctx: Context, target: str | None):
    from compiler.render import resolve_env_placeholders
    from runtime.spark import connect

    result = compile_plan(ctx, target, None)
    plan = result.plan
    try:
        conf = {k: resolve_env_placeholders(str(v), os.environ) for k, v in plan.target.spark_conf.items()}
        master = resolve_env_placeholders(plan.target.spark_master, os.environ)
    except KeyError as exc:
        raise ProjectError([cli_problem(f"environment variable {exc.args[0]} is not set; the Spark settings of target {plan.target.name} need it",
                                 f"export {exc.args[0]}=...")]) from exc
    if connect.remote_of(conf, {}):
        raise ProjectError([cli_problem(f"target {plan.target.name} names a Spark Connect server (spark.remote); pipe uses that one",
                                 "a pipe server is for targets that run Spark on this machine")])
    return plan, result.project.root, master, conf


def _age(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600} h {seconds % 3600 // 60} min" if seconds >= 3600 else f"{seconds // 60} min {seconds % 60} s"


@server_group.command(name="start")
@target_option
@click.option("--idle-timeout", default="60m", show_default=True, metavar="DURATION",
              help="Stop after this long without a command using it (e.g. 30m, 2h; 0: never).")
@click.option("--no-warmup", is_flag=True, help="Return once the server listens, without its warm-up (the first runs are then slower).")
@common_options
@click.pass_obj
def server_start(ctx: Context, target: str | None, idle_timeout: str, no_warmup: bool) -> None:
    """Start a Spark Connect server with the target's Spark settings; pipe run, show and test use it."""
    from runtime.spark import server

    match = re.fullmatch(r"\s*(\d+)\s*([smh]?)\s*", idle_timeout)
    if match is None:
        raise ProjectError([cli_problem(f"--idle-timeout {idle_timeout!r} is not a duration", "write e.g. 90s, 30m, 2h, or 0 for never")])
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
@target_option
@common_options
@click.pass_obj
def server_stop(ctx: Context, target: str | None) -> None:
    """Stop the target's Spark Connect server."""
    from runtime.spark import server

    plan, root, _, _ = _server_target(ctx, target)
    state = server.stop(root, plan.target.name)
    if state is None:
        output.line(f"No pipe server runs for target [bold]{plan.target.name}[/] of this project")
    else:
        output.line(f"Stopped the pipe server of target [bold]{plan.target.name}[/] ({state.url}, up {_age(time.time() - state.started_at)})")


@server_group.command(name="status")
@target_option
@common_options
@click.pass_obj
def server_status(ctx: Context, target: str | None) -> None:
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

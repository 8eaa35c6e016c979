"""The `pipe` command. Exit codes: 0 success, 1 a step or run failed, 2 a mistake in the
project or the command line. A mistake never prints a Python traceback; `--debug` does."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
import traceback
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


def _compile(ctx: _Context, target: str | None, vars_text: str | None):
    from compiler.api import compile_project
    from compiler.project import parse_cli_vars

    result = compile_project(ctx.root(), target=target, cli_vars=parse_cli_vars(vars_text))
    if result.warnings:
        output.diagnostics(result.warnings)
    return result


def _set_project_dir(click_ctx: click.Context, _param, value):
    if value is not None:
        click_ctx.find_object(_Context).project_dir = value


def _common(command):
    """Options every command takes, after the command name too (`pipe compile --project-dir x`)."""
    command = click.option("--project-dir", default=None, type=click.Path(file_okay=False), expose_value=False,
                           callback=_set_project_dir, help="Project folder (default: the nearest folder with pipe_project.yml).")(command)
    return click.option("--debug", is_flag=True, expose_value=False, help="Show Python tracebacks for every error.")(command)


_target_option = click.option("--target", "-t", default=None, help="Target from pipe_project.yml (default: default_target).")
_vars_option = click.option("--vars", "vars_text", default=None, help="Variables as YAML or JSON, e.g. '{min_amount: 10}'.")
_select_option = click.option("--select", "-s", multiple=True, help="Steps to choose: name, +name, name+, tag:x, path:..., config.KEY:value.")
_exclude_option = click.option("--exclude", multiple=True, help="Steps to leave out (same syntax as --select).")


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
    result = _compile(ctx, target, vars_text)
    plan = result.plan
    target_dir = result.project.root / "target"
    target_dir.mkdir(exist_ok=True)
    tmp = target_dir / ".plan.json.tmp"
    tmp.write_text(plan.to_json(), encoding="utf-8")
    os.replace(tmp, target_dir / "plan.json")
    elapsed = time.perf_counter() - started
    ingest = sum(1 for s in plan.steps if s.kind == "ingest")
    writes = [s for s in plan.steps if s.kind == "write"]
    actions: dict[str, int] = {}
    for s in writes:
        actions[s.action] = actions.get(s.action, 0) + 1
    detail = ", ".join(f"{n} {a}" for a, n in sorted(actions.items()))
    output.line(
        f"Compiled [bold]{plan.project}[/] for target [bold]{plan.target.name}[/]: "
        f"{ingest} source{'s' if ingest != 1 else ''}, {len(writes)} table{'s' if len(writes) != 1 else ''}"
        + (f" ({detail})" if detail else "")
        + f" -> target/plan.json in {elapsed:.2f}s"
    )


@cli.command(name="ls")
@_select_option
@_exclude_option
@_target_option
@_vars_option
@click.option("--output", "fmt", type=click.Choice(["text", "json"]), default="text", help="One id per line, or one JSON object per line.")
@_common
@click.pass_obj
def ls_cmd(ctx: _Context, select, exclude, target, vars_text, fmt) -> None:
    """List the steps of the project, optionally selected."""
    from compiler.graph import select as select_steps

    result = _compile(ctx, target, vars_text)
    chosen = select_steps(result.graph, select, exclude)
    if not chosen and (select or exclude):
        output.err.print("[yellow]warning[/]: no step matches the selection")
    for step_id in chosen:
        if fmt == "json":
            step = result.plan.step(step_id)
            output.plain(json.dumps({"id": step.id, "kind": step.kind, "name": step.name, "depends_on": list(step.depends_on),
                                     "file": step.file, "tags": list(step.tags), "action": step.action}, sort_keys=True))
        else:
            output.plain(step_id)


def _cli(message: str, hint: str | None = None):
    from compiler.errors import Diagnostic

    return Diagnostic(Location("<command line>"), message, hint)


# Commands after which a failed run has left files as they were.
_WRITING_COMMANDS = ("compile", "init")


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args  # before or after the command name
    command = next((a for a in args if a in cli.commands), None)
    try:
        cli.main(args=args, prog_name="pipe", standalone_mode=False)
    except ProjectError as exc:
        if debug:
            traceback.print_exc()
        output.diagnostics(exc.diagnostics, wrote_nothing=command in _WRITING_COMMANDS)
        return EXIT_USAGE
    except PipeError as exc:
        if debug:
            traceback.print_exc()
        output.fail(str(exc))
        return EXIT_USAGE
    except click.exceptions.Abort:
        output.fail("aborted")
        return 130
    except click.ClickException as exc:
        exc.show()
        return EXIT_USAGE
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except KeyboardInterrupt:
        output.fail("interrupted")
        return 130
    except Exception as exc:  # a bug in pipe, not in the project
        if debug:
            traceback.print_exc()
        output.fail(f"internal error: {type(exc).__name__}: {exc}", "this is a bug in pipe; run again with --debug for the traceback and report it")
        return EXIT_FAILED
    return EXIT_OK


def entry() -> None:
    sys.exit(main())

"""What every command shares: the context (project folder, --debug), the options most commands take,
compiling the project into a plan, and the exit codes."""

from __future__ import annotations

import os
import re
from pathlib import Path

import click

from compiler.errors import Location, ProjectError
from pipe import output


EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class Context:
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


def compile_plan(ctx: Context, target: str | None, vars_text: str | None, cache_write: bool = True, files=None):
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
            write_plan(root / "target", result, fingerprint)
    return result


def write_plan(target_dir: Path, result, fingerprint: str | None):
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
        click_ctx.find_object(Context).project_dir = value


def _set_debug(click_ctx: click.Context, _param, value):
    if value:
        click_ctx.find_object(Context).debug = True


def common_options(command):
    """Options every command takes, after the command name too (`pipe compile --project-dir x`)."""
    command = click.option("--project-dir", default=None, type=click.Path(file_okay=False), expose_value=False,
                           callback=_set_project_dir, help="Project folder (default: the nearest folder with pipe_project.yml).")(command)
    return click.option("--debug", is_flag=True, expose_value=False, callback=_set_debug, help="Show Python tracebacks for every error.")(command)


target_option = click.option("--target", "-t", default=None, help="Target from pipe_project.yml (default: default_target).")


vars_option = click.option("--vars", "vars_text", default=None, help="Variables as YAML or JSON, e.g. '{min_amount: 10}'.")


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


state_option = click.option("--state", "state_dir", default=None, type=click.Path(file_okay=False), metavar="DIR",
                             help="Reference run for state:/result: selectors: a folder with its plan.json and run_results.json.")


select_option = click.option("--select", "-s", multiple=True, cls=_SelectorsOption, metavar="SELECTOR...",
                              help="Steps to choose: name, +name, name+, tag:x, path:..., config.KEY:value (several: --select a b).")


exclude_option = click.option("--exclude", multiple=True, cls=_SelectorsOption, metavar="SELECTOR...",
                               help="Steps to leave out (same syntax as --select).")


def load_plan(ctx: Context, plan_path: str | None, target: str | None, vars_text: str | None):
    """The plan to run: compiled now from the project, or read from --plan (as reviewed in CI)."""
    from compiler.plan import Plan

    if plan_path is None:
        result = compile_plan(ctx, target, vars_text)
        return result.plan, result.graph, result.project.root
    if target or vars_text:
        raise ProjectError([cli_problem("--plan runs a compiled plan as it is; --target and --vars belong to `pipe compile`",
                                 "compile with those options, then run the plan it wrote")])
    path = Path(plan_path)
    try:
        plan = Plan.from_json(path.read_text(encoding="utf-8"), origin=str(path))
    except OSError as exc:
        raise ProjectError([cli_problem(f"cannot read {path}: {exc.strerror}", "run `pipe compile` to write target/plan.json")]) from exc
    output.hide_secrets(plan)
    return plan, plan.graph(), ctx.root()


def instant_arg(value: str | None, what: str) -> str | None:
    if value is not None and not re.fullmatch(r"\d{14,17}", value):
        raise ProjectError([cli_problem(f"{what} {value!r} is not an instant time", "instants look like 20261121170042123; see `pipe timeline TABLE`")])
    return value


def cli_problem(message: str, hint: str | None = None):
    from compiler.errors import Diagnostic

    return Diagnostic(Location("<command line>"), message, hint)


def in_project() -> bool:
    from compiler.project import find_project_root

    return find_project_root(Path.cwd()) is not None


def print_traceback() -> None:
    """With --debug: the traceback of the exception being handled (traceback is imported only then)."""
    import traceback

    traceback.print_exc()

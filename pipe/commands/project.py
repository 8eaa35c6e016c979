"""Commands on the project itself: init, compile, ls, docs, discover, doctor."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import click

from compiler.errors import ProjectError
from pipe import output
from pipe.commands.common import (
    EXIT_USAGE, cli_problem, common_options, compile_plan, Context, exclude_option, in_project, select_option,
    state_option, target_option, vars_option, write_plan,
)


@click.command()
@click.argument("name")
@common_options
@click.pass_obj
def init(ctx: Context, name: str) -> None:
    """Create a new project NAME from the example project."""
    import shutil

    from pipe.template import template_dir

    if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name):
        raise ProjectError([cli_problem(f"invalid project name '{name}'", "use letters, digits and _, starting with a letter or _")])
    dest = Path.cwd() / name
    if dest.exists():
        raise ProjectError([cli_problem(f"{dest} already exists", "choose another name or remove the folder")])
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


@click.command(name="compile")
@target_option
@vars_option
@common_options
@click.pass_obj
def compile_cmd(ctx: Context, target: str | None, vars_text: str | None) -> None:
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
            summary = write_plan(target_dir, result, fingerprint)
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


@click.command(name="ls")
@select_option
@exclude_option
@target_option
@vars_option
@click.option("--output", "fmt", type=click.Choice(["text", "json"]), default="text", help="One id per line, or one JSON object per line.")
@state_option
@common_options
@click.pass_obj
def ls_cmd(ctx: Context, select, exclude, target, vars_text, fmt, state_dir) -> None:
    """List the steps of the project, optionally selected."""
    from compiler.graph import select as select_steps
    from pipe.dev_loop import state_matcher

    result = compile_plan(ctx, target, vars_text)
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


@click.group(name="docs")
def docs_group() -> None:
    """A browsable site of the project: the lineage graph, every table and source, their columns and commits."""


@docs_group.command(name="generate")
@select_option
@exclude_option
@target_option
@vars_option
@click.option("--no-lake", is_flag=True, help="Do not read the tables' timelines (no commits on the pages).")
@common_options
@click.pass_obj
def docs_generate(ctx: Context, select, exclude, target, vars_text, no_lake) -> None:
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


def _docs_build(ctx: Context, files, fingerprint: str | None, started: float, select, exclude, target, vars_text, no_lake) -> None:
    from compiler.graph import select as select_steps
    from compiler.sqlcheck import keep_parsed
    from pipe.docs import record
    from pipe.docs.lake import read_histories
    from pipe.docs.site import build_site, write_site

    with keep_parsed() as parsed:  # column lineage reads the trees the SQL check parses
        result = compile_plan(ctx, target, vars_text, files=files)
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
@common_options
@click.pass_obj
def docs_serve(ctx: Context, port: int) -> None:
    """Serve target/docs/ on 127.0.0.1 until Ctrl-C."""
    from pipe.docs.serve import serve

    site = ctx.root() / "target" / "docs"
    if not (site / "index.html").is_file():
        raise ProjectError([cli_problem(f"no site in {site}", "run `pipe docs generate` first")])
    try:
        serve(site, port, lambda url: output.line(f"Serving the docs at {url} (Ctrl-C stops)"))
    except OSError as exc:
        raise ProjectError([cli_problem(f"cannot serve on 127.0.0.1:{port}: {exc.strerror or exc}",
                                 "choose another port with --port (0 picks a free one)")]) from exc
    output.line("Stopped")


@click.command(name="discover")
@click.argument("source")
@target_option
@vars_option
@common_options
@click.pass_obj
def discover_cmd(ctx: Context, source, target, vars_text) -> None:
    """Write down the tables a fan-out SOURCE captures (<source>.captured.yml beside it): its topics, their keys and columns."""
    from pipe.discover import discover

    result = compile_plan(ctx, target, vars_text)
    path, said = discover(result, ctx.root(), source)
    rel = path.relative_to(ctx.root()).as_posix()
    output.plain(f"{rel}:")
    for line in said:
        output.plain(line)
    output.plain(f"Review {rel} and commit it; `pipe diff` shows what it changes.")


@click.command(name="doctor")
@click.argument("paths", nargs=-1, metavar="[PATH...]")
@click.option("--output", "fmt", type=click.Choice(["text", "json"]), default="text", help="Text, or one JSON object.")
@target_option
@common_options
@click.pass_obj
def doctor_cmd(ctx: Context, paths, fmt, target) -> None:
    """Audit the Hudi tables under PATH (default: the target's lake) before pipe writes to them; exit 1 if any needs a change."""
    from pipe import doctor
    from runtime import s3

    settings: dict[str, str] = {}
    if not paths or ctx.project_dir or in_project():
        from runtime.steps.context import RunContext

        result = compile_plan(ctx, target, None, cache_write=False)
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
            raise ProjectError([cli_problem(f"no folder {path}", "name a lake's folder, a table's, or an s3:// location")])
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

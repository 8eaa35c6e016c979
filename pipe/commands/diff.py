"""`pipe diff`: what a change to the project does to the plan (compiler/diff.py) and, with --data,
to the tables' rows (runtime/data_diff.py)."""

from __future__ import annotations

from pathlib import Path

import click

from compiler.errors import ProjectError
from pipe import output
from pipe.commands.common import (
    EXIT_FAILED, cli_problem, common_options, compile_plan, Context, exclude_option, select_option,
    state_option, target_option, vars_option,
)
from pipe.commands.sessions import spark_factory


@click.command(name="diff")
@click.argument("base_plan", required=False, type=click.Path(dir_okay=False))
@click.argument("head_plan", required=False, type=click.Path(dir_okay=False))
@click.option("--base-ref", default=None, help="Compile the project as it is at this git ref (e.g. origin/main) for the base; the working tree is not touched.")
@target_option
@vars_option
@click.option("--format", "fmt", type=click.Choice(["text", "markdown", "json"]), default="text", help="markdown: a pull-request comment; json: see docs/diff.md.")
@click.option("--fail-on", type=click.Choice(["rewrite", "destructive", "breaking"]), default=None,
              help="Exit 1 only if a change is of this class or a more severe one (for gating CI).")
@click.option("--data", "data", default=None, metavar="BASE:HEAD",
              help="Compare the rows of the tables built in two targets instead of the plans, e.g. --data prod:dev (Spark).")
@select_option
@exclude_option
@click.option("--samples", type=click.IntRange(0, 1000), default=None, metavar="N",
              help="With --data: sample rows shown per kind (added, removed, changed) and table [default: 5].")
@click.option("--fail-on-data", "fail_on_data", multiple=True, metavar="EXPR",
              help="With --data: exit 1 if a table meets EXPR, e.g. 'changed_rows > 1%', 'removed_rows > 0', 'mismatch.amount > 0.5%'.")
@state_option
@common_options
@click.pass_obj
def diff_cmd(ctx: Context, base_plan, head_plan, base_ref, target, vars_text, fmt, fail_on, data, select, exclude, samples,
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
        raise ProjectError([cli_problem(f"{', '.join(data_only)} belong{'s' if len(data_only) == 1 else ''} to a data diff",
                                 "add --data BASE:HEAD, e.g. `pipe diff --data prod:dev`")])
    if base_ref is not None and base_plan is not None and head_plan is None:
        base_plan, head_plan = None, base_plan  # `pipe diff --base-ref REF head.json`
    if (base_plan is None) == (base_ref is None):
        raise ProjectError([cli_problem("give the base: a plan file (`pipe diff BASE_PLAN`) or a git ref (`pipe diff --base-ref origin/main`)",
                                 "e.g. `pipe diff --base-ref origin/main`, or `pipe diff old/plan.json target/plan.json`")])
    if base_ref is not None:
        base, base_label = _plan_at_ref(ctx, base_ref, target, vars_text), base_ref
    else:
        base, base_label = _read_plan(base_plan), base_plan
    if head_plan is not None:
        head, head_label = _read_plan(head_plan), head_plan
    else:
        head, head_label = compile_plan(ctx, target, vars_text, cache_write=False).plan, "working tree"
    diff = diff_plans(base, head, base_label, head_label)
    diff.warnings.extend(rebuild_warnings(diff, head))
    _write_diff(diff_output, diff, fmt)
    if fails(diff, fail_on) if fail_on else diff.has_changes:
        raise click.exceptions.Exit(EXIT_FAILED)


def _data_diff(ctx: Context, data: str, base_plan, head_plan, base_ref, target, fail_on, vars_text, fmt, select, exclude,
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
        raise ProjectError([cli_problem(f"--data {data!r} is not BASE:HEAD", "name two targets of pipe_project.yml, e.g. --data prod:dev")])
    base_name, head_name = (x.strip() for x in sides)
    given = [f for f, v in (("BASE_PLAN", base_plan), ("HEAD_PLAN", head_plan), ("--base-ref", base_ref), ("--target", target),
                            ("--fail-on", fail_on)) if v]
    if given:
        raise ProjectError([cli_problem(f"--data compares two targets' tables; {', '.join(given)} belong{'s' if len(given) == 1 else ''} to a plan diff",
                                 "run the plan diff and the data diff as two commands (the markdown of --data is a section to append)")])
    try:
        gates = data_diff.parse_gates(fail_on_data)
    except data_diff.GateError as exc:
        raise ProjectError([cli_problem(f"--fail-on-data: {exc}")]) from exc
    base_result = compile_plan(ctx, base_name, vars_text, cache_write=False)
    head_result = compile_plan(ctx, head_name, vars_text, cache_write=False)
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
        raise ProjectError([cli_problem("no table is selected", "a data diff compares tables; select some with --select")])
    base_lake = RunContext(base_plan_, base_result.project.root)
    head_lake = RunContext(head_plan_, head_result.project.root)
    present = {n: (base_lake.table_exists(n), head_lake.table_exists(n)) for n in names}
    if not any(b or h for b, h in present.values()):
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        raise ProjectError([cli_problem(f"no selected table is built in {base_name} or in {head_name} ({shown})",
                                 f"build them first, e.g. `pipe run --target {head_name}`")])
    opened = {n: (base_lake.open_table(n), head_lake.open_table(n)) for n, (b, h) in present.items() if b and h}
    columns_of = {c.name.lower() for pair in opened.values() for t in pair for c in (t.writer_schema() or ())}
    unknown = [g.metric for g in gates if g.metric.startswith("mismatch.") and g.metric.split(".", 1)[1].lower() not in columns_of]
    if unknown and opened:  # before Spark starts: a typo in a column's name
        raise ProjectError([cli_problem(f"--fail-on-data: no table compared has a column {unknown[0].split('.', 1)[1]!r}",
                                 "name a column of a selected table, e.g. mismatch.amount")])
    spark = spark_factory(head_plan_, head_result.project.root, ctx.debug)() if opened else None
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
        raise ProjectError([cli_problem(f"cannot read {path}: {exc.strerror}", "give a plan.json written by `pipe compile`")]) from exc


def _plan_at_ref(ctx: Context, ref: str, target: str | None, vars_text: str | None):
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
            raise ProjectError([cli_problem("--base-ref needs git, which is not installed")]) from exc
        except subprocess.CalledProcessError as exc:
            err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr
            raise ProjectError([cli_problem(f"git {' '.join(args[:2])} failed: {err.strip().splitlines()[-1] if err.strip() else exc}",
                                     "is the project in a git repository, and does the ref exist? (`git fetch` it first in CI)")]) from exc

    top = Path(git("rev-parse", "--show-toplevel").stdout.strip())
    prefix = Path(root).resolve().relative_to(top.resolve())
    try:
        commit = git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}").stdout.strip()
    except ProjectError as exc:
        raise ProjectError([cli_problem(f"git knows no commit '{ref}'", "check the ref's spelling; in CI fetch the base branch first "
                                 "(`git fetch origin main:refs/remotes/origin/main`, or actions/checkout with fetch-depth: 0)")]) from exc
    tar_bytes = git("archive", "--format=tar", commit, "--", str(prefix) if str(prefix) != "." else ".", binary=True).stdout
    with tempfile.TemporaryDirectory(prefix="pipe-diff-") as tmp:
        with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as tar:
            tar.extractall(tmp, filter="data")
        base_root = Path(tmp) / prefix
        if not (base_root / "pipe_project.yml").exists():
            raise ProjectError([cli_problem(f"there is no pipe_project.yml in {prefix} at {ref}", "the project did not exist yet at that ref")])
        try:
            # the outcomes of the working tree's SQL checks hold for every table the ref did not change
            return compile_project(base_root, target=target, cli_vars=parse_cli_vars(vars_text), cache_dir=root / "target", cache_write=False).plan
        except ProjectError as exc:
            first = exc.diagnostics[0] if exc.diagnostics else None
            raise ProjectError([cli_problem(f"the project at {ref} does not compile: {first.message if first else exc}",
                                     f"check out {ref} and run `pipe compile` to see why")]) from exc

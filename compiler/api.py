"""The compiler's front door: runs the stages in order and gathers every diagnostic.

    read (project.py) -> validate -> render -> graph -> plan

Each stage reports into one Collector and later stages still run on what could be read, so a
user sees all of a project's mistakes in one go."""

from __future__ import annotations

import contextlib
import gc
import graphlib
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from compiler import data_tests, unit_tests
from compiler.errors import Collector, Diagnostic
from compiler.graph import Edge, build_graph, check_cycles, source_id, table_id, test_id, topological_order
from compiler.partial import ParseCache
from compiler.plan import Plan, Step, TargetSpec, step_attributes, timeline_action
from compiler.project import Project, ProjectFiles, load_project
from compiler.render import Renderer, RenderedSource, RenderedTable
from compiler.schema import CATALOG_NAME_RE
from compiler.validate import validate

if TYPE_CHECKING:  # imported when a graph is built: a compile without a cycle never needs it
    import networkx as nx

# Settings that describe a step for people and selection but do not change what it does; a
# table's tests become test steps of their own.
_DESCRIPTIVE = ("description", "tags", "columns", "tests", "data_tests")
# table keys in a step's config only when set, so that a plan made before the key existed keeps
# every fingerprint (keys from before that rule stay in with their defaults)
_ONLY_WHEN_SET = ("cdc_logging",)


@dataclass(frozen=True)
class CompileResult:
    plan: Plan
    warnings: tuple[Diagnostic, ...]
    project: Project

    @cached_property
    def graph(self) -> nx.DiGraph:
        """The plan's dependency graph (networkx), built when a command asks for it: the
        compile orders its steps without it (compiler.graph.topological_order)."""
        return self.plan.graph()


def compile_project(root: str | Path, target: str | None = None, cli_vars: Mapping[str, Any] | None = None, *,
                    check_sql: bool = True, cache_dir: Path | None = None, cache_write: bool = True,
                    files: ProjectFiles | None = None) -> CompileResult:
    """Compiles the project at `root`. Raises ProjectError with every problem found.

    `check_sql` parses every table's SQL and checks its columns (compiler/sqlcheck.py); its
    outcomes are cached in `cache_dir` when given (the commands pass the project's target/), and
    only read from there when not `cache_write`, as is what the compile made of each file
    (compiler/partial.py's ParseCache). `files`: the project's files when they have been read
    already (`pipe compile` reads them first, for partial parsing)."""
    cache_dir = Path(cache_dir) if cache_dir is not None else None
    cache = ParseCache.load(cache_dir) if cache_dir is not None else None
    try:
        with cyclic_gc_paused():
            return _compile(Path(root), target, cli_vars, check_sql, cache_dir, cache_write, files, cache)
    finally:  # a compile with errors still leaves what it made of its good files
        if cache is not None and cache_write:
            cache.save(cache_dir)


@contextlib.contextmanager
def cyclic_gc_paused():
    """Compiling allocates many small objects and frees nothing cyclic; pausing the cyclic
    collector saves about a fifth of the time on large projects (and more when sqlglot's trees
    are kept, as `pipe docs` does)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _compile(root: Path, target: str | None, cli_vars: Mapping[str, Any] | None, check_sql: bool, cache_dir: Path | None,
             cache_write: bool, files: ProjectFiles | None, cache: ParseCache | None) -> CompileResult:
    errors = Collector()
    project = load_project(Path(root), target=target, cli_vars=cli_vars, errors=errors, files=files, parse_cache=cache)
    validate(project, errors)

    renderer = Renderer(project, errors, cache)
    target = _render_target(project, renderer)
    renderer.set_target_lake(target.lake)
    rendered_tables = {name: renderer.render_table(t) for name, t in project.tables.items()}
    rendered_sources = {name: renderer.render_source(s) for name, s in project.sources.items()}

    declared_tests = data_tests.read_declared(project, errors, renderer) + data_tests.read_singular(project, renderer, errors)
    expectations = data_tests.read_expectations(project, {n: r.config for n, r in rendered_tables.items()}, errors)
    edges = _edges(project, rendered_tables)
    _check_s3_sources(project, edges, errors)
    steps = _steps(project, rendered_tables, rendered_sources, edges, expectations)
    _check_catalog_names(project, target, steps, errors)
    order = _order(steps, edges, errors)
    known_columns: Mapping[str, Any] = {}
    if check_sql:
        from compiler.sqlcheck import check_sql as check_tables_sql

        write_order = [steps[i].name for i in order if i in steps and steps[i].kind == "write"] if order is not None else sorted(project.tables)
        known_columns = check_tables_sql(project, rendered_tables, write_order, errors, cache_dir, cache_write)
    tests = data_tests.finish(declared_tests, project, known_columns, errors)
    units = unit_tests.read(project, errors)
    unit_tests.check(units, project, rendered_tables, known_columns, errors)
    errors.raise_if_errors()
    if tests or units:
        test_steps, test_edges = _test_steps(tests)
        steps.update(test_steps)
        steps.update(_unit_steps(units))
        order = _order(steps, edges + test_edges, errors)
        errors.raise_if_errors()

    plan = Plan(
        project=project.name,
        target=target,
        vars=dict(sorted(project.vars.items())),
        steps=tuple(steps[i] for i in order),
    )
    return CompileResult(plan=plan, warnings=tuple(errors.warnings), project=project)


def _order(steps: Mapping[str, Step], edges: list[Edge], errors: Collector) -> list[str] | None:
    """The steps' ids in the plan's order, or None when the edges make a cycle: then the
    networkx graph is built to report every cycle and where each of its links is written."""
    try:
        return topological_order(steps, ((e.upstream, e.downstream) for e in edges))
    except graphlib.CycleError:
        check_cycles(build_graph({s.id: step_attributes(s) for s in steps.values()}, edges), errors)
        return None


def _check_catalog_names(project: Project, target: TargetSpec, steps: Mapping[str, Step], errors: Collector) -> None:
    """Two tables registered under one catalog name (`Orders` and `orders`; a merge-on-read
    `events` and a table `events_rt`) would take turns at one entry."""
    if not target.catalog:
        return
    if "{{" not in target.catalog["database"] and not CATALOG_NAME_RE.match(target.catalog["database"]):
        errors.error(project.project_doc.at(("targets", target.name, "catalog", "database")),
                     f"invalid catalog database name '{target.catalog['database']}' (as rendered)",
                     "use lower-case letters, digits and _, starting with a letter or _")
    owner: dict[str, str] = {}
    for step in sorted((s for s in steps.values() if s.kind == "write"), key=lambda s: s.name):
        for name in target.catalog_names(step):
            if name in owner:
                errors.error(project.tables[step.name].location, f"table {step.name} would be registered as {name}, "
                             f"which table {owner[name]} is registered as too",
                             "rename one of them, or set another catalog table_prefix")
            owner.setdefault(name, step.name)


def _render_target(project: Project, renderer: Renderer) -> TargetSpec:
    """The chosen target with its settings rendered (`lake: "s3://{{ env_var('B') }}/x"`)."""
    t = project.target
    where = ("targets", t.name)
    env_vars: dict[str, str | None] = {}

    def render(value, location):
        if not isinstance(value, str):
            return value
        text, found = renderer.render_text(value, location)
        env_vars.update(found)
        return text

    lake = render(t.lake, _lake_location(project))
    master = render(t.spark_master, project.project_doc.at(where + ("spark", "master")))
    conf = {k: render(v, project.project_doc.at(where + ("spark", "conf", k))) for k, v in t.spark_conf.items()}
    catalog = None
    if t.catalog:
        catalog = {k: render(v, project.project_doc.at(where + ("catalog", k))) for k, v in t.catalog.items()}
    return TargetSpec(name=t.name, lake=lake, spark_master=master, spark_conf=conf, env_vars=dict(sorted(env_vars.items())),
                      shared_paths=t.shared_paths, catalog=catalog)


def _lake_location(project: Project):
    from compiler.validate import target_sets_lake

    if target_sets_lake(project):
        return project.project_doc.at(("targets", project.target.name, "lake"))
    return project.project_doc.at(("lake",))


def _edges(project: Project, rendered: Mapping[str, RenderedTable]) -> list[Edge]:
    edges = []
    for name, r in rendered.items():
        for ref, loc in r.refs.items():
            edges.append(Edge(table_id(ref), table_id(name), loc))
        for src, loc in r.sources.items():
            edges.append(Edge(source_id(src), table_id(name), loc))
    for name, source in project.sources.items():
        for key in ("table", "metadata_table"):
            upstream = source.config.get(key)
            if upstream in project.tables:
                edges.append(Edge(table_id(upstream), source_id(name), source.at(key)))
    return edges


def _check_s3_sources(project: Project, edges: list[Edge], errors: Collector) -> None:
    """An `s3_events` source feeds exactly one table (two tables would split the queue's messages
    between them); an `s3_incremental` source reads a table fed by an `s3_events` source."""
    readers: dict[str, list[Edge]] = {}
    for e in edges:
        readers.setdefault(e.upstream, []).append(e)
    queue_tables: set[str] = set()
    for name, source in project.sources.items():
        if source.config.get("kind") != "s3_events":
            continue
        consumers = sorted(readers.get(source_id(name), []), key=lambda e: (e.location.file, e.location.line, e.downstream))
        for e in consumers[1:]:
            first = consumers[0].downstream.split(".", 1)[1]
            errors.error(e.location, f"source '{name}' (kind s3_events) is read by table '{first}' already; "
                         f"each queue message goes to one reader, so two tables would each get part of them",
                         f"let '{first}' be the S3 metadata table and read its objects with `kind: s3_incremental` sources "
                         f"(`metadata_table: {first}`), one per table")
        queue_tables.update(e.downstream.split(".", 1)[1] for e in consumers)
    for name, source in project.sources.items():
        dead = name + "_dead_letter"
        if has_dead_letter_table(source.config) and dead in project.tables:
            errors.error(project.tables[dead].location, f"table name '{dead}' is taken by the dead-letter table of source '{name}'",
                         "rename the table")
        meta = source.config.get("metadata_table")
        if source.config.get("kind") == "s3_incremental" and meta in project.tables and meta not in queue_tables:
            errors.error(source.at("metadata_table"), f"metadata_table of source '{name}' is '{meta}', which reads no `s3_events` source",
                         "name the table whose SQL selects from the s3_events source (the S3 metadata table)")


def has_dead_letter_table(config) -> bool:
    """Whether a source writes a dead-letter table `<source>_dead_letter`."""
    return config.get("kind") in ("s3_events", "s3_incremental") or (config.get("kind") == "kafka" and config.get("on_bad_record") == "dead_letter")


def _test_steps(tests: list[data_tests.DataTest]) -> tuple[dict[str, Step], list[Edge]]:
    """A `test` step per data test, after the table or source it checks and every table or
    source its SQL reads."""
    steps: dict[str, Step] = {}
    edges: list[Edge] = []
    for t in tests:
        tid = test_id(t.name)
        deps = set()
        if t.model is not None:
            deps.add(table_id(t.model) if t.model_kind == "table" else source_id(t.model))
        if t.test == "relationships":
            deps.add(table_id(t.args["to"]) if t.args["to_kind"] == "table" else source_id(t.args["to"]))
        deps |= {table_id(r) for r in t.refs} | {source_id(s) for s in t.sources}
        edges += [Edge(d, tid, t.location) for d in deps]
        steps[tid] = Step(
            id=tid,
            kind="test",
            name=t.name,
            depends_on=tuple(sorted(deps)),
            config=t.config(),
            file=t.location.file,
            line=t.location.line,
            description=t.description,
            sql=t.sql,
            sql_file=t.sql_file,
            env_vars=dict(sorted(t.env_vars.items())),
        ).with_fingerprint()
    return steps, edges


def _unit_steps(units: list[unit_tests.UnitTest]) -> dict[str, Step]:
    """A `unit` step per unit test. It reads nothing of the lake, so it depends on no step;
    `pipe build` runs it before the table it tests, which it gates (runtime/executor.py)."""
    steps = {}
    for u in units:
        uid = f"unit.{u.name}"
        steps[uid] = Step(id=uid, kind="unit", name=u.name, depends_on=(), config=u.config(), file=u.location.file,
                          line=u.location.line, description=u.description, tags=u.tags).with_fingerprint()
    return steps


def _steps(project: Project, tables: Mapping[str, RenderedTable], sources: Mapping[str, RenderedSource], edges: list[Edge],
           expectations: Mapping[str, list[dict[str, str]]]) -> dict[str, Step]:
    deps: dict[str, set[str]] = {}
    for e in edges:
        deps.setdefault(e.downstream, set()).add(e.upstream)
    steps: dict[str, Step] = {}
    for name, source in project.sources.items():
        sid = source_id(name)
        r = sources[name]
        loc = source.location
        steps[sid] = Step(
            id=sid,
            kind="ingest",
            name=name,
            depends_on=tuple(sorted(deps.get(sid, ()))),
            config={k: v for k, v in r.config.items() if k not in _DESCRIPTIVE},
            file=loc.file,
            line=loc.line,
            description=source.description,
            tags=tuple(source.tags),
            env_vars=dict(sorted(r.env_vars.items())),
        ).with_fingerprint()
    for name, table in project.tables.items():
        tid = table_id(name)
        r = tables[name]
        loc = table.location
        config = {k: v for k, v in r.config.items() if k not in _DESCRIPTIVE and k != "expect"}
        for key in _ONLY_WHEN_SET:  # keys added later: the fingerprints of tables without them stay as they were
            if config.get(key) is None:
                config.pop(key, None)
        if expectations.get(name):  # only when set: the fingerprints of tables without them stay as they were
            config["expect"] = expectations[name]
        steps[tid] = Step(
            id=tid,
            kind="write",
            name=name,
            depends_on=tuple(sorted(deps.get(tid, ()))),
            config=config,
            file=loc.file,
            line=loc.line,
            description=table.description,
            tags=tuple(table.tags),
            sql=r.sql,
            sql_full_refresh=r.sql_full_refresh,
            sql_file=table.sql_file or table.python_file,
            action=timeline_action(config["operation"], config["type"]),
            python=r.python,
            env_vars=dict(sorted(r.env_vars.items())),
        ).with_fingerprint()
    return steps


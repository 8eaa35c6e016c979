"""The site's pages, gathered from the compiled plan (steps, SQL, tests), the project (column
descriptions), column lineage (compiler/lineage.py) and, where the lake is readable, each table's
timeline (lake.py); then written as static files with Jinja.

The graph's data goes into `graph-data.js`, a script every page can load from disk: browsers
refuse fetch() of a file:// URL, so a JSON file could not be read without a server."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from compiler.api import CompileResult
from compiler.data_tests import QUARANTINE_SUFFIX
from compiler.lineage import ColumnLineage, LineageCache, TableLineage, plan_lineage
from compiler.plan import Step
from pipe.docs.lake import History
from pipe.docs.layout import Position, layered_layout
from pipe.docs.record import MANIFEST, files_present

HERE = Path(__file__).resolve().parent
KINDS = {"ingest": "source", "write": "table"}


@dataclass(frozen=True)
class Column:
    name: str
    type: str = ""  # "" when unknown
    description: str = ""
    tests: tuple[str, ...] = ()
    # where it comes from: (step id or "" outside the project, column) pairs; None: not traced
    inputs: tuple[tuple[str, str], ...] | None = None
    direct: bool = False
    traced: bool = False  # lineage applies (a table with SQL); False for a source's columns


@dataclass(frozen=True)
class Page:
    step: Step
    kind: str  # source | table
    category: str  # what colours the node: a source's kind, a table's operation
    upstream: tuple[str, ...]
    downstream: tuple[str, ...]
    columns: tuple[Column, ...]
    columns_from: str  # where the columns and types were read
    tests: tuple[Step, ...]
    history: History | None = None

    @property
    def id(self) -> str:
        return self.step.id

    @property
    def config(self) -> Mapping[str, Any]:
        return self.step.config


@dataclass(frozen=True)
class Site:
    project: str
    target: str
    pages: dict[str, Page]  # by step id, in the plan's (topological) order
    positions: dict[str, Position]
    lake_note: str = ""  # why no page shows commits ("" when the lake was read)
    selection: str = ""  # the --select/--exclude the site was made with
    names: dict[str, str] = field(default_factory=dict)  # every step id of the project -> name
    # the quarantine tables of the tables shown (expectations with action quarantine), by node id
    quarantines: dict[str, "Quarantine"] = field(default_factory=dict)

    def listing(self) -> list[tuple[str, str, str, str]]:
        """Every source, table and quarantine table of the site as (name, kind, what, href),
        sorted by name: the list beside the graph."""
        rows = [(p.step.name, p.kind, p.category + (f", {_TYPES.get(p.config.get('type'), '')}" if p.kind == "table" else ""),
                 f"nodes/{p.id}.html") for p in self.pages.values()]
        rows += [(q.name, "quarantine", f"rows {q.table} quarantined", q.href) for q in self.quarantines.values()]
        return sorted(rows, key=lambda r: (r[0].lower(), r[0]))


@dataclass(frozen=True)
class Quarantine:
    """`<table>__quarantine`: where a table's expectations with action quarantine put the rows
    that fail them (runtime/steps/expect.py). It has no step of its own: its node is drawn fed
    by its table and opens the table's page."""

    table: str  # the table's name
    table_id: str
    expectations: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.table + QUARANTINE_SUFFIX

    @property
    def href(self) -> str:
        return f"nodes/{self.table_id}.html#quarantine"


_TYPES = {"copy_on_write": "copy-on-write", "merge_on_read": "merge-on-read"}


def build_site(result: CompileResult, chosen: Iterable[str], *, histories: Mapping[str, History] | None = None,
               lake_note: str = "", cache_dir: Path | None = None, selection: str = "", parsed: Mapping[str, Any] | None = None) -> Site:
    """The site of the steps `chosen` (ids; tests among them are shown on their tables' pages).
    `parsed`: the tables' SQL as the compile's SQL check parsed it (sqlcheck.keep_parsed)."""
    plan = result.plan
    steps = {s.id: s for s in plan.steps if s.kind in KINDS}
    chosen_ids = set(chosen)
    shown = [s for s in plan.steps if s.id in chosen_ids and s.kind in KINDS]
    downstream: dict[str, list[str]] = {i: [] for i in steps}
    tests: dict[str, list[Step]] = {i: [] for i in steps}
    for s in plan.steps:
        for d in s.depends_on:
            if s.kind == "test" and d in tests:
                tests[d].append(s)
            elif s.kind in KINDS and d in downstream:
                downstream[d].append(s.id)
    lineage = _lineage(result, steps, cache_dir, parsed or {})
    histories = histories or {}
    pages = {}
    for s in shown:
        own_tests = tuple(t for t in tests[s.id] if _tests_model(t, s))
        others = tuple(t for t in tests[s.id] if not _tests_model(t, s))  # e.g. a tests/*.sql reading it
        history = histories.get(s.name) if s.kind == "write" else None
        columns, columns_from = _columns(result, s, lineage.get(s.id), history, own_tests, steps)
        pages[s.id] = Page(
            step=s, kind=KINDS[s.kind], category=s.config.get("kind") if s.kind == "ingest" else s.config.get("operation"),
            upstream=tuple(d for d in s.depends_on if d in steps), downstream=tuple(downstream[s.id]),
            columns=columns, columns_from=columns_from, tests=own_tests + others, history=history,
        )
    quarantines = {f"quarantine.{p.step.name}": Quarantine(p.step.name, p.id, tuple(e["name"] for e in p.config.get("expect") or ()
                                                                                  if e.get("action") == "quarantine"))
                   for p in pages.values() if p.kind == "table" and any(e.get("action") == "quarantine" for e in p.config.get("expect") or ())}
    edges = [(u, p.id) for p in pages.values() for u in p.upstream] + [(q.table_id, qid) for qid, q in quarantines.items()]
    positions = layered_layout([*pages, *quarantines], edges)
    return Site(project=plan.project, target=plan.target.name, pages=pages, positions=positions, lake_note=lake_note,
                selection=selection, names={i: s.name for i, s in steps.items()}, quarantines=quarantines)


def _tests_model(test: Step, step: Step) -> bool:
    """Whether `test` is declared on `step` (rather than only reading it)."""
    return test.config.get("model") == step.name and test.config.get("model_kind") == KINDS[step.kind]


# --- columns and their lineage --------------------------------------------------------------------


def _lineage(result: CompileResult, steps: Mapping[str, Step], cache_dir: Path | None, parsed: Mapping[str, Any]) -> dict[str, TableLineage]:
    """Each table's column lineage (compiler.lineage.plan_lineage), cached in `cache_dir`."""
    cache = LineageCache(cache_dir)
    out = plan_lineage(steps, cache, parsed)
    cache.save()
    return out


def _columns(result: CompileResult, step: Step, lineage: TableLineage | None, history: History | None, tests: tuple[Step, ...],
             steps: Mapping[str, Step]) -> tuple[tuple[Column, ...], str]:
    """The page's columns, in this order of preference for names and types: the latest
    commit's schema, the declared `schema:`, the SQL's select list, the documented `columns:`."""
    node = (result.project.tables if step.kind == "write" else result.project.sources).get(step.name)
    documented = {c["name"].lower(): c for c in (node.config.get("columns") or []) if isinstance(c, dict) and "name" in c} if node else {}
    if history is not None and history.schema:
        typed, origin = list(history.schema), f"the latest commit ({history.last_write_instant})"
    elif step.config.get("schema"):
        typed, origin = [(c["name"], c["type"]) for c in step.config["schema"]], "the declared schema"
    elif lineage is not None and lineage.columns:
        typed, origin = [(c.column, "") for c in lineage.columns], "the SQL's select list (types are known once the table is written)"
    else:
        typed, origin = [], ""
    names = {n.lower() for n, _ in typed}
    typed += [(c["name"], "") for key, c in documented.items() if key not in names]
    if typed and not origin:
        origin = "the documented columns"
    by_name = {c.column.lower(): c for c in lineage.columns} if lineage is not None else {}
    relations = {steps[d].name.lower(): d for d in step.depends_on if d in steps}
    relations.setdefault(step.name.lower(), step.id)
    columns = []
    for name, type_ in typed:
        doc = documented.get(name.lower()) or {}
        col_tests = tuple(t.name for t in tests if name.lower() in [c.lower() for c in t.config.get("columns") or ()])
        traced: ColumnLineage | None = by_name.get(name.lower())
        inputs = tuple((relations.get(r, ""), c) for r, c in traced.inputs) if traced is not None and traced.inputs is not None else None
        columns.append(Column(name=name, type=type_, description=str(doc.get("description") or "").strip(), tests=col_tests,
                              inputs=inputs, direct=traced.direct if traced else False, traced=step.kind == "write" and bool(step.sql)))
    return tuple(columns), origin


# --- writing the files --------------------------------------------------------------------------

NODE_W, NODE_H, COL_W, ROW_H = 180, 28, 250, 44  # the graph's geometry, in SVG units


def graph_data(site: Site) -> dict[str, Any]:
    """What graph.js draws: nodes as [id, name, kind, category, x, y, table type, href] (a
    table's type: copy_on_write or merge_on_read, else ""; href "" for the node's own page),
    edges as index pairs. A quarantine table is a node of kind quarantine fed by its table."""
    index = {sid: i for i, sid in enumerate([*site.pages, *site.quarantines])}

    def at(sid: str) -> list[float]:
        return [site.positions[sid].layer * COL_W, round(site.positions[sid].row * ROW_H, 1)]

    nodes = [[p.id, p.step.name, p.kind, p.category, *at(p.id), p.config.get("type") or "" if p.kind == "table" else "", ""]
             for p in site.pages.values()]
    nodes += [[qid, q.name, "quarantine", "quarantine", *at(qid), "", q.href] for qid, q in site.quarantines.items()]
    edges = [[index[u], index[p.id]] for p in site.pages.values() for u in p.upstream if u in index]
    edges += [[index[q.table_id], index[qid]] for qid, q in site.quarantines.items()]
    return {"project": site.project, "nodes": nodes, "edges": edges, "node": [NODE_W, NODE_H]}




def write_site(site: Site, out: Path) -> Path:
    """Writes the site to `out`, in place: the pages that changed since the last generate, and
    removes those of steps no longer in it (rewriting a thousand unchanged files would cost a
    fifth of the command; creating them afresh, more)."""
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True, trim_blocks=True, lstrip_blocks=True,
                             auto_reload=False)  # the templates do not change while a site is written: no stat per page
    env.filters["setting"] = _setting
    env.filters["settings"] = _settings
    env.filters["checkpoint"] = _checkpoint
    _remove_links(out)
    try:
        before = json.loads((out / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        before = {}
    present = files_present(out)
    writer = _Writer(out, before, present)
    for f in (HERE / "static").iterdir():
        writer.write(f"static/{f.name}", f.read_text(encoding="utf-8"))
    writer.write("static/graph-data.js", "window.PIPE_GRAPH = " + json.dumps(graph_data(site), separators=(",", ":"), ensure_ascii=False) + ";\n")
    written = {**writer.written, **_write_pages(site, env.get_template("node.html"), writer)}
    for stale in sorted(present - set(written)):
        (out / stale).unlink()
    categories = sorted({(p.kind, p.category) for p in site.pages.values()} | ({("quarantine", "quarantine")} if site.quarantines else set()))
    types = sorted({p.config.get("type") for p in site.pages.values() if p.kind == "table" and p.config.get("type")})
    # the graph page last: it is what a reader opens, and links to every page written above
    (out / "index.html").write_text(env.get_template("graph.html").render(site=site, categories=categories, types=types, type_names=_TYPES, up=""), encoding="utf-8")
    (out / MANIFEST).write_text(json.dumps(written, sort_keys=True), encoding="utf-8")
    return out / "index.html"


def _remove_links(out: Path) -> None:
    """Makes the site's folders real folders holding no link: a link committed where the site
    is written (`target/docs/nodes` -> a folder of the user's) is removed, never written or
    deleted through (pages of steps no longer in the site are deleted, and pages overwritten)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    for folder in (out, out / "nodes", out / "static"):
        if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
            folder.unlink()  # the link itself, not what it points to
        folder.mkdir(exist_ok=True)
        with os.scandir(folder) as entries:
            for entry in entries:
                if entry.is_symlink():
                    os.unlink(entry.path)


class _Writer:
    """Writes a file of the site unless the last generate wrote the same text there."""

    def __init__(self, out: Path, before: Mapping[str, str], present: set[str]):
        self.out, self.before, self.present = out, before, present
        self.written: dict[str, str] = {}  # each file's digest, for the manifest

    def write(self, rel: str, text: str) -> None:
        digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
        self.written[rel] = digest
        if self.before.get(rel) != digest or rel not in self.present:
            (self.out / rel).write_text(text, encoding="utf-8")

    def fresh(self) -> "_Writer":
        """A writer of the same site that has written nothing yet."""
        return _Writer(self.out, self.before, self.present)


# Rendering a page takes about a millisecond, and creating its file about as long again on some
# disks: a site of this many pages or more is written by a process per core, forked once the
# whole site is in memory (Linux only: fork is what makes the site and the templates free to share).
# Only a process with one thread forks: a child forked while another thread holds a lock (the
# logging module's, an import's, malloc's) waits for it forever. `pipe docs serve` regenerating
# beside its server thread, or a process that started Spark (py4j's threads), renders in-process.
_FORK_FROM = 300
_job: tuple[Any, Any, Any] | None = None  # (site, template, writer) of the forked children


def _workers() -> int:
    """The processes that render pages: one per core this process may use, at most 8."""
    return min(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1, 8)


def _single_threaded() -> bool:
    """This process has one thread (Python's or any library's: Linux lists them all)."""
    try:
        return len(os.listdir("/proc/self/task")) == 1
    except OSError:
        return False


def _write_pages(site: Site, template, writer: _Writer) -> dict[str, str]:
    """Renders and writes a page per step; their files' digests."""
    global _job
    ids = list(site.pages)
    workers = _workers()
    if len(ids) < _FORK_FROM or workers < 2 or sys.platform != "linux" or not _single_threaded():
        return _render(site, template, writer, ids)
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    _job = (site, template, writer)
    try:
        # (not multiprocessing's Pool, whose map waits forever for a child that died)
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
            parts = list(pool.map(_render_part, [ids[i::workers] for i in range(workers)]))
    except BrokenProcessPool:  # a child died (killed, out of memory): this process writes the pages
        return _render(site, template, writer, ids)
    finally:
        _job = None
    return {rel: digest for part in parts for rel, digest in part.items()}


def _render_part(ids: list[str]) -> dict[str, str]:
    site, template, writer = _job
    return _render(site, template, writer, ids)


def _render(site: Site, template, writer: _Writer, ids: list[str]) -> dict[str, str]:
    pages = writer.fresh()
    for sid in ids:
        pages.write(f"nodes/{sid}.html", template.render(site=site, page=site.pages[sid], up="../"))
    return pages.written


def _setting(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, ensure_ascii=False)


def _settings(config: Mapping[str, Any]) -> str:
    """Every setting that is set, one per line as YAML would show a flow mapping."""
    return "\n".join(f"{k}: {_setting(v)}" for k, v in sorted(config.items()) if v not in (None, [], {}))


def _checkpoint(value: str) -> str:
    from runtime.table.history import short_checkpoint

    return short_checkpoint(value)

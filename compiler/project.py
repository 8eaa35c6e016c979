"""Reading a project folder into typed objects that remember where each setting was written.

`load_project` reads pipe_project.yml, sources/*.yml, tables/*.yml (+ tables/<name>.sql),
macros/*.sql and tests/*.sql (in one pass, `ProjectFiles`), checks every key against `schema.py`,
picks the target and merges vars. It never stops at the first problem: everything it finds is
collected for one report."""

from __future__ import annotations

import json
import math
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from compiler import fan_out, schema
from compiler.errors import Collector, Location, ProjectError, did_you_mean
from compiler.yamlsrc import Doc, load_yaml

PROJECT_FILE = "pipe_project.yml"


@dataclass(frozen=True)
class Target:
    name: str
    lake: str
    spark_master: str
    spark_conf: Mapping[str, Any]
    shared_paths: tuple[str, ...] = ()
    catalog: Mapping[str, Any] | None = None  # the `catalog` settings; None: kind none


@dataclass(frozen=True)
class Node:
    """What sources and tables share: a name, settings, and where they were declared."""

    name: str
    config: Mapping[str, Any]
    doc: Doc = field(compare=False, repr=False)
    path: tuple = field(compare=False, repr=False)

    @property
    def file(self) -> str:
        return self.doc.file

    @property
    def location(self) -> Location:
        return self.doc.at(self.path, key=True)

    def at(self, *keys: Any) -> Location:
        """Where setting `keys` is written (or the declaration itself when it is absent)."""
        return self.doc.at(self.path + keys)

    @property
    def tags(self) -> list[str]:
        return list(self.config.get("tags") or [])

    @property
    def description(self) -> str:
        return self.config.get("description") or ""

    @property
    def columns(self) -> list[dict[str, str]] | None:
        return self.config.get("schema")


@dataclass(frozen=True)
class Source(Node):
    @property
    def kind(self) -> str:
        return self.config["kind"]


@dataclass(frozen=True)
class Table(Node):
    sql_file: str | None = None  # relative path of the SELECT, when there is one
    sql_text: str | None = None
    python_file: str | None = None  # relative path of a Python model (compiler/python_models.py)
    python_text: str | None = None

    @property
    def operation(self) -> str:
        return self.config["operation"]


@dataclass(frozen=True)
class MacroFile:
    file: str
    text: str


# What a compile reads: pipe_project.yml and, in each of these folders (at any depth), the files
# ending so. The project is read from nothing else (`ProjectFiles`), which is what lets partial
# parsing (compiler/partial.py) fingerprint a compile's inputs.
INPUT_FOLDERS = (
    ("sources", (".yml", ".yaml")),
    ("tables", (".yml", ".yaml", ".sql", ".py")),
    ("macros", (".sql",)),
    ("tests", (".sql", ".yml", ".yaml", ".csv")),  # data tests; unit tests and their fixtures (compiler/unit_tests.py)
    ("seeds", (".csv", ".yml", ".yaml")),  # compiler/seeds.py
)


@dataclass(frozen=True)
class ProjectFiles:
    """The bytes of every file of a project a compile reads, read in one pass: the compile
    works from these, so a fingerprint of them (compiler/partial.py) is one of its inputs."""

    root: Path
    contents: Mapping[str, bytes | OSError]  # relative posix path -> bytes, or why it could not be read
    # files in the folders above that pipe does not read, and folders dbt reads that pipe does
    # not (`snapshots/`): each gets a warning (`unread`), so nothing is ignored without a word
    skipped: tuple[str, ...] = ()

    @classmethod
    def read(cls, root: Path) -> "ProjectFiles":
        contents: dict[str, bytes | OSError] = {}
        skipped: list[str] = [f"{name}/" for name in _OTHER_FOLDERS if os.path.isdir(os.path.join(root, name))]
        skipped += [name for name in _OTHER_FILES if os.path.isfile(os.path.join(root, name))]
        listed = [PROJECT_FILE] + [rel for folder, suffixes in INPUT_FOLDERS for rel in _files(root, folder, suffixes, contents, skipped)]
        for rel in listed:
            contents[rel] = _read_regular(root, rel, _SEED_LIMIT if rel.startswith("seeds/") and rel.endswith(".csv") else None)
        _links_in_target(root, contents)
        return cls(Path(root), contents, tuple(skipped))

    def unread(self, errors: Collector) -> None:
        """A warning for each file and folder of `skipped`, saying what to do with it."""
        for rel in self.skipped:
            message, hint = _unread_said(rel)
            errors.warning(Location(rel, 1), message, hint)

    def listing(self, folder: str, suffixes: tuple[str, ...]) -> list[str]:
        """Relative paths of the files under `folder` ending in `suffixes`, sorted (not those
        refused: `refused` reports them)."""
        prefix = folder + "/"
        return [rel for rel, data in self.contents.items()
                if rel.startswith(prefix) and rel.endswith(suffixes) and not isinstance(data, RefusedFile)]

    def refused(self, errors: Collector) -> None:
        """Reports every symbolic link and special file found where the project's files are read."""
        for data in self.contents.values():
            if isinstance(data, RefusedFile):
                errors.error(Location(data.rel, 1), data.message, data.hint)

    def text(self, rel: str, errors: Collector) -> str | None:
        """The file's text with universal newlines (as text mode reads it), or None with the
        reason reported when it could not be read or is not UTF-8."""
        data = self.contents[rel]
        if isinstance(data, RefusedFile):
            return None  # `refused` reports it
        if isinstance(data, OSError):
            errors.error(Location(rel, 1), f"cannot read file: {data.strerror}")
            return None
        try:
            return data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
        except UnicodeDecodeError as exc:
            line = data.count(b"\n", 0, exc.start) + 1
            col = len(data[data.rfind(b"\n", 0, exc.start) + 1: exc.start].decode("utf-8", "replace")) + 1
            errors.error(Location(rel, line, col), f"file is not UTF-8 text ({exc.reason} at byte {exc.start})", "save the file as UTF-8")
        return None


@dataclass(frozen=True)
class Project:
    root: Path
    name: str
    target: Target
    target_names: tuple[str, ...]
    vars: Mapping[str, Any]
    sources: Mapping[str, Source]
    tables: Mapping[str, Table]
    macros: tuple[MacroFile, ...]
    project_doc: Doc = field(compare=False, repr=False)
    files: ProjectFiles = field(compare=False, repr=False)  # what it was read from


def find_project_root(start: Path) -> Path | None:
    """The nearest folder at or above `start` holding pipe_project.yml, as git finds .git."""
    start = start.resolve()
    for folder in (start, *start.parents):
        if (folder / PROJECT_FILE).is_file():
            return folder
    return None


def parse_cli_vars(text: str | None) -> dict[str, Any]:
    """`--vars '{"a": 1}'` (YAML or JSON) as a mapping; ProjectError when it is not one."""
    if not text:
        return {}
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ProjectError([_cli_diag(f"--vars is not valid YAML or JSON: {exc}")]) from exc
    if not isinstance(value, dict):
        raise ProjectError([_cli_diag(f"--vars must be a mapping such as '{{min_amount: 10}}', not {value!r}")])
    return json.loads(json.dumps(value, default=str), parse_constant=float)


def _cli_diag(message: str):
    from compiler.errors import Diagnostic

    return Diagnostic(Location("<command line>"), message, "quote the value: --vars '{name: value}'")


class RefusedFile(OSError):
    """A symbolic link or a file that is not a regular file, where the project's files are read.

    A project may come from an untrusted pull request: a link `macros/env.sql` ->
    /proc/self/environ and an `{% include %}` would copy the CI's secrets into plan.json. pipe
    refuses every link (also one that stays inside the project: a copy costs nothing and links
    are easy to get wrong) and every device, pipe or socket, and never opens them."""

    def __init__(self, rel: str, link: str | None = None, kind: str | None = None):
        super().__init__(f"{rel} is refused")
        self.rel = rel
        if link is not None:
            self.message = f"'{rel}' is a symbolic link (to {link}); pipe does not follow links in a project"
            self.hint = ("delete it: pipe writes target/ itself (and it is best left out of git)" if rel.split("/")[0] == "target"
                         else "replace the link with a copy of the file or folder it points to (git: commit the file itself)")
        else:
            self.message = f"'{rel}' is a {kind}, not a regular file; pipe reads only regular files in a project"
            self.hint = "remove it, or replace it with a regular file"


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "named pipe"), (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device"), (stat.S_ISDIR, "folder")):
        if test(mode):
            return name
    return "special file"


_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


# a seed larger than this is refused (compiler/seeds.py), and read no further
_SEED_LIMIT = 50 * 1024 * 1024 + 1


def _read_regular(root: Path, rel: str, limit: int | None = None) -> bytes | OSError:
    """The bytes of root/rel (at most `limit` of them), or why not: RefusedFile for a link or a
    special file, which is never read (O_NOFOLLOW and a check of the open file, so no race swaps
    one in)."""
    path = os.path.join(root, rel)
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as exc:
        if os.path.islink(path):
            return RefusedFile(rel, os.readlink(path))
        return exc
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            return RefusedFile(rel, kind=_kind(mode))
        with open(fd, "rb", closefd=False) as f:
            return f.read() if limit is None else f.read(limit)
    except OSError as exc:
        return exc
    finally:
        os.close(fd)


def _links_in_target(root: Path, refused: dict[str, bytes | OSError]) -> None:
    """target/, where compiles write plan.json and their caches, and the files at its top level
    must not be links: a write through a committed one would land outside the project."""
    target = os.path.join(root, "target")
    if os.path.islink(target):
        refused["target"] = RefusedFile("target", os.readlink(target))
        return
    try:
        with os.scandir(target) as entries:
            for entry in entries:
                if entry.is_symlink():
                    refused[f"target/{entry.name}"] = RefusedFile(f"target/{entry.name}", os.readlink(entry.path))
    except OSError:
        pass  # no target/ yet


# dbt's folders and files that pipe has no counterpart for (seeds/ it reads: compiler/seeds.py)
_OTHER_FOLDERS = ("models", "snapshots", "analyses", "analysis")
_OTHER_FILES = ("dbt_project.yml", "profiles.yml")
# in pipe's folders, files nobody expects pipe to read: notes, editors' and Python's leftovers
_QUIET = (".md", ".txt", ".rst", ".gitkeep", ".keep", ".pyc", ".swp", "~", ".DS_Store")


def _unread_said(rel: str) -> tuple[str, str]:
    """The warning and its hint for a file or folder pipe does not read."""
    top = rel.split("/", 1)[0]
    if rel == "models/":
        return ("pipe does not read models/ (dbt's folder): tables live in tables/",
                "move each model's .sql (and its YAML, with `tables:` instead of `models:`) to tables/")
    if rel == "snapshots/":
        return ("pipe does not read snapshots/ (dbt snapshots)",
                "a table's history is on its Hudi timeline: read it with time travel or its change feed (docs/tables.md); "
                "or keep every version with a table whose operation is insert")
    if rel in ("analyses/", "analysis/"):
        return (f"pipe does not read {rel} (dbt analyses)", "keep such queries outside the project's folders, or make them tables")
    if rel in _OTHER_FILES:
        return (f"pipe does not read {rel}: its settings live in {PROJECT_FILE}",
                "move the project's name, vars and targets to pipe_project.yml (docs/project.md)")
    suffix = rel.rsplit(".", 1)[-1] if "." in rel.rsplit("/", 1)[-1] else ""
    if suffix == "py":
        return (f"pipe does not read {rel}: Python models live in tables/", "move it to tables/<name>.py, with `def model(...)` "
                "(docs/python-models.md), or out of the project's folders if it is not a model")
    if suffix == "csv":
        return (f"pipe does not read {rel}: seeds live in seeds/", "move it to seeds/ to load it as a table (docs/project.md, Seeds)")
    if suffix == "sql" and top in ("sources", "seeds"):
        return (f"pipe does not read {rel}: SQL lives in tables/ (a table's SELECT) and tests/ (a data test)", "move it there")
    if suffix in ("yml", "yaml") and top in ("macros", "tests"):
        return (f"pipe does not read {rel}", "tables and their tests are declared in tables/*.yml, sources in sources/*.yml")
    return f"pipe does not read {rel}", f"pipe reads {', '.join(f'{f}/*{s}' for f, ss in INPUT_FOLDERS if f == top for s in ss)} there"


def _files(root: Path, folder: str, suffixes: tuple[str, ...], refused: dict[str, bytes | OSError], skipped: list[str] | None = None) -> list[str]:
    """Relative posix paths of the files under root/folder ending in `suffixes`, sorted.
    Links, to files or folders, and special files go into `refused` instead (whatever their
    names: a linked folder could hold anything); the other files, into `skipped` (not hidden
    ones, notes and leftovers: `_QUIET`). (os.walk and plain strings: pathlib costs more than
    the listing on large projects.)"""
    found = []
    base = os.path.join(root, folder)
    if os.path.islink(base):
        refused[folder] = RefusedFile(folder, os.readlink(base))
        return []
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames.sort()
        rel_dir = os.path.relpath(dirpath, root).replace(os.sep, "/")
        for name in [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            dirnames.remove(name)  # os.walk lists a linked folder but does not enter it
            refused[f"{rel_dir}/{name}"] = RefusedFile(f"{rel_dir}/{name}", os.readlink(os.path.join(dirpath, name)))
        found.extend(f"{rel_dir}/{name}" for name in filenames if name.endswith(suffixes))
        if skipped is not None and not any(part.startswith(".") or part == "__pycache__" for part in rel_dir.split("/")):
            skipped.extend(sorted(f"{rel_dir}/{name}" for name in filenames
                                  if not name.endswith(suffixes) and not name.startswith(".") and not name.endswith(_QUIET)))
    return sorted(found)


def _top_level(doc: Doc, expected: str, errors: Collector, other: str) -> dict[str, Any]:
    """The `sources:` / `tables:` mapping of a file, reporting anything else at top level."""
    value = doc.value
    if value is None:
        return {}
    if not isinstance(value, dict):
        errors.error(doc.at(()), f"{doc.file} must be a mapping with a top-level '{expected}:' key")
        return {}
    for key in value:
        if key == "unit_tests" and expected == "tables":
            continue  # dbt's place for unit tests, beside the tables (compiler/unit_tests.py)
        if key != expected:
            hint = f"{other} are declared in {other}/*.yml" if key == other else did_you_mean(str(key), [expected]) or f"the only top-level key here is '{expected}:'"
            errors.error(doc.at((key,), key=True), f"unknown top-level key '{key}'", hint)
    entries = value.get(expected)
    if entries is None:
        return {}
    if not isinstance(entries, dict):
        errors.error(doc.at((expected,)), f"'{expected}:' must be a mapping of names to settings")
        return {}
    return entries


def _check_name(doc: Doc, path: tuple, name: Any, what: str, errors: Collector) -> bool:
    if not isinstance(name, str) or not schema.NAME_RE.match(name):
        errors.error(
            doc.at(path, key=True),
            f"invalid {what} name '{name}'",
            "use letters, digits and _, starting with a letter or _ (it becomes a folder and a SQL name)",
        )
        return False
    return True


def _source_elsewhere(kind: str):
    def hint(name: str) -> str | None:
        owners = [k for k, sec in schema.SOURCES.items() if k != kind and name in sec.by_name]
        if owners:
            return f"'{name}' is a setting of kind: {' / '.join(owners)}, not of kind: {kind}"
        return None

    return hint


def _catalog(conf: Mapping[str, Any], project_name: str, doc: Doc, where: tuple, errors: Collector) -> dict[str, Any] | None:
    """The target's catalog settings, checked; None for kind none. Hive and Glue keep names in
    lower case, so a name must be written in lower case (what the catalog shows)."""
    kind = conf["kind"] or "none"
    for key in ("region", "endpoint_url"):
        if conf[key] is not None and kind != "glue":
            errors.error(doc.at(where + (key,)), f"'{key}' applies to catalog kind glue only (this target's kind is {kind})",
                         "remove it, or set `kind: glue`")
    if kind == "none":
        return None
    database = conf["database"] if conf["database"] is not None else project_name.lower()
    if "{{" not in database and not schema.CATALOG_NAME_RE.match(database):
        errors.error(doc.at(where + ("database",)), f"invalid catalog database name '{database}'",
                     "use lower-case letters, digits and _, starting with a letter or _ (catalogs keep names in lower case)"
                     + (f": `{database.lower()}`" if schema.NAME_RE.match(database) else ""))
    prefix = conf["table_prefix"] or ""
    if not re.fullmatch(r"[a-z0-9_]*", prefix):
        errors.error(doc.at(where + ("table_prefix",)), f"invalid table_prefix '{prefix}'", "use lower-case letters, digits and _")
    out = {"kind": kind, "database": database, "table_prefix": prefix}
    if kind == "glue":
        out.update({k: conf[k] for k in ("region", "endpoint_url") if conf[k] is not None})
    return out


def load_project(
    root: Path,
    target: str | None = None,
    cli_vars: Mapping[str, Any] | None = None,
    errors: Collector | None = None,
    files: ProjectFiles | None = None,
    parse_cache=None,
) -> Project:
    """Reads the project at `root` (from `files` when they have been read already). Raises
    ProjectError listing every problem found. `parse_cache` (compiler.partial.ParseCache):
    what earlier compiles made of the YAML files, reused for those unchanged."""
    errors = errors if errors is not None else Collector()
    root = Path(root).resolve()
    project_path = root / PROJECT_FILE
    if not project_path.is_file():
        raise ProjectError(
            [_diag(Location(PROJECT_FILE), f"no {PROJECT_FILE} in {root}", "run pipe inside a project folder, pass --project-dir, or create one with `pipe init NAME`")]
        )
    files = files if files is not None else ProjectFiles.read(root)
    files.refused(errors)
    files.unread(errors)
    text = files.text(PROJECT_FILE, errors)
    doc = load_yaml(text or "", PROJECT_FILE, errors)
    if doc is None:  # unreadable: its error is reported; go on with defaults to check the rest
        doc = Doc(PROJECT_FILE, {"name": "project"})
    checker = schema.Checker(doc, errors)
    conf = checker.section(schema.PROJECT, doc.value, (), PROJECT_FILE)
    name = conf["name"] or "project"
    if conf["name"] is not None and not schema.NAME_RE.match(conf["name"]):
        errors.error(doc.at(("name",)), f"invalid project name '{conf['name']}'", "use letters, digits and _, starting with a letter or _")

    targets = conf["targets"] or {"dev": checker.section(schema.TARGET, {}, ("targets",), "target 'dev'")}
    target_name = target or conf["default_target"]
    if target_name not in targets:
        where = Location("<command line>") if target else doc.at(("default_target",))
        hint = did_you_mean(target_name, targets) or "targets in this project: " + ", ".join(sorted(targets))
        errors.error(where, f"unknown target '{target_name}'", hint)
        target_name = sorted(targets)[0]
    tconf = targets[target_name]
    # every target's catalog is checked, as every target's keys are: a typo in prod shows in dev
    catalogs = {t: _catalog(c["catalog"], name, doc, ("targets", t, "catalog"), errors) for t, c in targets.items()}
    chosen = Target(
        name=target_name,
        lake=tconf["lake"] or conf["lake"],
        spark_master=tconf["spark"]["master"],
        spark_conf={str(k): v for k, v in sorted(tconf["spark"]["conf"].items())},
        shared_paths=tuple(tconf["shared_paths"]),
        catalog=catalogs[target_name],
    )
    for name_, value in conf["vars"].items():
        _check_var(name_, value, doc.at(("vars", name_)), errors)
    for name_, value in tconf["vars"].items():
        _check_var(name_, value, doc.at(("targets", target_name, "vars", name_)), errors)
    for name_, value in (cli_vars or {}).items():
        _check_var(name_, value, Location("<command line>"), errors)
    merged_vars = {**conf["vars"], **tconf["vars"], **(cli_vars or {})}

    sources = _load_sources(files, errors, parse_cache)
    tables = _load_tables(files, errors, parse_cache)
    fan_out.expand(files, sources, tables, errors)
    from compiler import seeds  # which imports this module

    seeds.add_seeds(files, sources, tables, errors, parse_cache)
    _check_sql_names(sources, tables, errors)
    macros = []
    for rel in files.listing("macros", (".sql",)):
        mtext = files.text(rel, errors)
        if mtext is not None:
            macros.append(MacroFile(rel, mtext))

    return Project(
        root=root,
        name=name,
        target=chosen,
        target_names=tuple(sorted(targets)),
        vars=merged_vars,
        sources=sources,
        tables=tables,
        macros=tuple(macros),
        project_doc=doc,
        files=files,
    )


def _check_var(name: str, value: Any, where: Location, errors: Collector) -> None:
    """Vars go into plan.json, which holds JSON values only: no NaN or infinity."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, float) and not math.isfinite(v):
            errors.error(where, f"var '{name}' holds {v}, which plan.json cannot hold", "use a finite number or a string")
            return
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)


def _check_sql_names(sources: dict[str, Source], tables: dict[str, Table], errors: Collector) -> None:
    """Tables and sources become Spark views, whose names ignore case: no two may meet."""
    seen: dict[str, Node] = {}
    for node in [*sources.values(), *tables.values()]:
        other = seen.get(node.name.lower())
        if other is None:
            seen[node.name.lower()] = node
            continue
        hint = "rename one of them: ref() and source() share one case-insensitive namespace of SQL names"
        if node.name == other.name:
            errors.error(node.location, f"'{node.name}' is both a table and a source (source declared at {other.location})", hint)
        else:
            errors.error(node.location, f"'{node.name}' and '{other.name}' (declared at {other.location}) differ only in case", hint)


def _diag(location: Location, message: str, hint: str | None = None):
    from compiler.errors import Diagnostic

    return Diagnostic(location, message, hint)


def _entries(files: ProjectFiles, folder: str, other: str, errors: Collector, check, cache=None):
    """(doc, name, path, config) of every well-named entry under `folder:` in folder/*.yml, its
    config as `check(doc, name, body, path, errors)` made it (None: a mistake it reported).

    `cache` (compiler.partial.ParseCache): a file whose bytes are as when it was last read
    without a diagnostic is not parsed or checked again."""
    for rel in files.listing(folder, (".yml", ".yaml")):
        if folder == "sources" and fan_out.is_captured_file(rel):
            continue  # the tables a fan-out source captures (compiler/fan_out.py)
        data = files.contents[rel]
        found = _cached_entries(cache, rel, data)
        if found is None:
            before = len(errors.diagnostics)
            found = _read_entries(files, rel, folder, other, errors, check)
            if cache is not None and found is not None and len(errors.diagnostics) == before:
                doc, entries = found
                cache.put(rel, data, (doc.value, doc.key_pos, doc.value_pos, doc.has_templates, entries))
        if found is not None:
            doc, entries = found
            for name, path, config in entries:
                yield doc, name, path, config


def _read_entries(files: ProjectFiles, rel: str, folder: str, other: str, errors: Collector, check):
    text = files.text(rel, errors)
    doc = load_yaml(text, rel, errors) if text is not None else None
    if doc is None:
        return None
    entries = []
    for name, body in _top_level(doc, folder, errors, other).items():
        p = (folder, name)
        if _check_name(doc, p, name, folder[:-1], errors):
            config = check(doc, name, body, p, errors)
            if config is not None:
                entries.append((name, p, config))
    return doc, entries


def _cached_entries(cache, rel: str, data: bytes | OSError):
    """The doc and entries the cache keeps for this file's bytes, or None."""
    if cache is None or isinstance(data, OSError):
        return None
    payload = cache.get(rel, data)
    if payload is None:
        return None
    try:
        value, key_pos, value_pos, has_templates, entries = payload
        doc = Doc(rel, value, key_pos, value_pos, has_templates)
        return doc, [(name, tuple(path), config) for name, path, config in entries]
    except (TypeError, ValueError):  # not what _entries keeps: read the file again
        return None


def _check_source(doc: Doc, name: str, body: Any, p: tuple, errors: Collector) -> dict[str, Any] | None:
    kind = body.get("kind") if isinstance(body, dict) else None
    if isinstance(body, dict) and kind is None:
        errors.error(doc.at(p, key=True), f"source '{name}' is missing required key 'kind'", "add `kind:` with one of: " + ", ".join(schema.SOURCE_KINDS))
        return None
    if isinstance(body, dict) and not isinstance(kind, str):
        errors.error(doc.at(p + ("kind",)), f"'kind' in source '{name}' must be a string, not {schema.type_name(kind)}", "choose one of: " + ", ".join(schema.SOURCE_KINDS))
        return None
    if isinstance(body, dict) and kind not in schema.SOURCES:
        hint = did_you_mean(str(kind), schema.SOURCES) or ""
        errors.error(doc.at(p + ("kind",)), f"unknown source kind '{kind}' in source '{name}'", (hint + " " if hint else "") + "choose one of: " + ", ".join(schema.SOURCE_KINDS))
        return None
    checker = schema.Checker(doc, errors, elsewhere=_source_elsewhere(kind or "files"))
    config = checker.section(schema.SOURCES.get(kind or "files"), body, p, f"source '{name}'")
    return config if config.get("kind") is not None else None  # a missing kind was reported


def _check_table(doc: Doc, name: str, body: Any, p: tuple, errors: Collector) -> dict[str, Any]:
    return schema.Checker(doc, errors).section(schema.TABLE, body, p, f"table '{name}'")


def _load_sources(files: ProjectFiles, errors: Collector, cache=None) -> dict[str, Source]:
    sources: dict[str, Source] = {}
    for doc, name, p, config in _entries(files, "sources", "tables", errors, _check_source, cache):
        source = Source(name=name, config=config, doc=doc, path=p)
        if name in sources:
            errors.error(source.location, f"source '{name}' is declared twice (first at {sources[name].location})", "source names are unique across all files in sources/")
            continue
        sources[name] = source
    return sources


def _load_tables(files: ProjectFiles, errors: Collector, cache=None) -> dict[str, Table]:
    tables: dict[str, Table] = {}
    declared_sql: set[str] = set()
    sql_files = files.listing("tables", (".sql",))
    existing_sql = set(sql_files)
    # a package marker is not a model
    existing_py = {rel for rel in files.listing("tables", (".py",)) if not rel.endswith("/__init__.py")}
    for doc, name, p, config in _entries(files, "tables", "sources", errors, _check_table, cache):
        sql_rel = f"{doc.file.rsplit('/', 1)[0]}/{name}.sql"
        sql_text = files.text(sql_rel, errors) if sql_rel in existing_sql else None
        if sql_text is not None:
            declared_sql.add(sql_rel)
        py_rel = sql_rel[: -len(".sql")] + ".py"
        py_text = files.text(py_rel, errors) if py_rel in existing_py else None
        if py_text is not None:
            declared_sql.add(py_rel)
            if sql_text is not None:
                errors.error(Location(py_rel, 1, 1), f"table '{name}' has both {sql_rel} and {py_rel}",
                             "keep one: a table's rows come from its SELECT or from its Python model")
        table = Table(
            name=name,
            config=_with_default_operation(config),
            doc=doc,
            path=p,
            sql_file=sql_rel if sql_text is not None else None,
            sql_text=sql_text,
            python_file=py_rel if py_text is not None else None,
            python_text=py_text,
        )
        if name in tables:
            errors.error(table.location, f"table '{name}' is declared twice (first at {tables[name].location})", "table names are unique across all files in tables/")
            continue
        tables[name] = table
    # A SELECT (or a Python model) with no YAML is a table with default settings, as a dbt
    # model without a .yml.
    for rel in sorted([*sql_files, *existing_py]):
        if rel in declared_sql:
            continue
        stem, suffix = rel.rsplit(".", 1)
        name = stem.rsplit("/", 1)[-1]
        doc = Doc(rel, None)
        if not _check_name(doc, (), name, "table", errors):
            continue
        what = "a SQL file" if suffix == "sql" else "a Python model"
        if name in tables:
            here = tables[name].file
            hint = (f"keep one: {here} is its {'SQL' if tables[name].sql_file else 'Python model'}" if not tables[name].doc.value
                    else f"move the {'SQL' if suffix == 'sql' else 'model'} to {Path(here).parent.as_posix()}/{name}.{suffix}, beside its YAML")
            errors.error(Location(rel, 1, 1), f"table '{name}' has {what} here but is declared at {tables[name].location}", hint)
            continue
        text = files.text(rel, errors)
        if text is None:
            continue
        config = schema.Checker(doc, errors).section(schema.TABLE, {}, (), f"table '{name}'")
        code = {"sql_file": rel, "sql_text": text} if suffix == "sql" else {"python_file": rel, "python_text": text}
        tables[name] = Table(name=name, config=_with_default_operation(config), doc=doc, path=(), **code)
    return tables


def read_test_files(project: Project, errors: Collector) -> list[tuple[str, str]]:
    """(relative path, text) of every tests/**/*.sql: the project's singular data tests. Those
    in tests/generic/ are templates of generic tests instead (compiler/data_tests.py)."""
    out = []
    for rel in project.files.listing("tests", (".sql",)):
        if rel.startswith("tests/generic/"):
            continue
        text = project.files.text(rel, errors)
        if text is not None:
            out.append((rel, text))
    return out


def _with_default_operation(config: dict[str, Any]) -> dict[str, Any]:
    if config.get("operation") is None:
        config = {**config, "operation": "upsert" if config.get("key") else "insert"}
    return config

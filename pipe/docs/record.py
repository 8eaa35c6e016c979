"""The record of the last `pipe docs generate --no-lake`: a site made from a project that has not
changed since is up to date, and generating it again parses, traces and renders nothing, as
`pipe compile` of an unchanged project reuses its plan (compiler/partial.py).

The record (`target/docs/.site.json`) holds a fingerprint of everything the site was made from:

- the compile's own fingerprint (compiler/partial.py: every file of the project by content, the
  --target and --vars, the compiler's code and the libraries that shape a plan);
- the --select and --exclude given;
- pipe's docs code, templates and static files by content, and Jinja2 and sqlglot (the pages'
  renderer and the column lineage's parser) by their `__init__.py`'s size and modification time.

A site with commits (without --no-lake) is always made afresh: its tables' timelines move
without the project changing. The site is also made afresh when index.html, or a page the last
generate wrote, is missing."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from compiler.errors import Diagnostic

RECORD_FILE = ".site.json"
MANIFEST = ".pages.json"  # each page's hash as last written (site.write_site), so an unchanged page is not written again
FORMAT = 1
_DOCS = Path(__file__).resolve().parent
_LIBRARIES = ("jinja2", "sqlglot")


def fingerprint(project_fingerprint: str | None, select: Iterable[str], exclude: Iterable[str], no_lake: bool) -> str | None:
    """The site's fingerprint, or None when it cannot be up to date (a site with commits, or a
    project file that could not be read)."""
    if project_fingerprint is None or not no_lake:
        return None
    from importlib.util import find_spec

    h = hashlib.sha256(f"pipe docs {FORMAT}\0{project_fingerprint}\0".encode())
    h.update(json.dumps([sorted(a for a in select if a.strip()), sorted(a for a in exclude if a.strip())]).encode() + b"\0")
    for path in sorted(p for p in _DOCS.rglob("*") if p.is_file() and p.suffix in (".py", ".html", ".js", ".css")):
        data = path.read_bytes()
        h.update(f"{path.relative_to(_DOCS)}\0{len(data)}\0".encode())
        h.update(data)
    for name in _LIBRARIES:
        spec = find_spec(name)
        try:
            st = os.stat(spec.origin) if spec is not None and spec.origin else None
        except OSError:
            st = None
        h.update(f"{name}\0{st and st.st_size}\0{st and st.st_mtime_ns}\0".encode())
    return h.hexdigest()


@dataclass(frozen=True)
class Recorded:
    """What the last generate of an up-to-date site said: its compile's warnings, and its pages."""

    warnings: tuple[Diagnostic, ...]
    project: str
    tables: int
    sources: int


def up_to_date(out: Path, fp: str | None) -> Recorded | None:
    """The recorded generate, when its fingerprint is `fp` and every file it wrote (the pages
    listed in its manifest, and index.html) is still there."""
    from compiler.partial import read_record, warnings_from_json

    try:
        record = read_record(out / RECORD_FILE, FORMAT, fp)
        if record is None:
            return None
        with open(out / MANIFEST, encoding="utf-8") as f:
            written = json.load(f)
        if not (out / "index.html").is_file() or not set(written) <= files_present(out):
            return None
        done = Recorded(warnings_from_json(record["warnings"]), str(record["project"]), record["tables"], record["sources"])
        return done if isinstance(done.tables, int) and isinstance(done.sources, int) else None
    except (OSError, ValueError, RecursionError, KeyError, TypeError, AttributeError):
        return None  # no record, or a damaged one: generate in full


def files_present(out: Path) -> set[str]:
    """The pages and static files in the site folder `out`, as the manifest names them."""
    return {f"nodes/{n}" for n in os.listdir(out / "nodes")} | {f"static/{n}" for n in os.listdir(out / "static")}


def remember(out: Path, fp: str | None, done: Recorded | None = None) -> None:
    """Records a generate that wrote the site in `out`; with fp None, forgets any record (best
    effort: a record that cannot be written only costs the next generate its time)."""
    from compiler.partial import warnings_to_json

    path = out / RECORD_FILE
    if fp is None or done is None:
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)
        return
    tmp = out / f"{RECORD_FILE}.{os.getpid()}.tmp"
    try:
        tmp.write_text(json.dumps({"format": FORMAT, "fingerprint": fp, "warnings": warnings_to_json(done.warnings),
                                   "project": done.project, "tables": done.tables, "sources": done.sources}, sort_keys=True), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)

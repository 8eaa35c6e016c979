"""Partial parsing: `pipe compile` of a project that has not changed since its last compile
reuses what that compile wrote, as dbt's partial parsing reuses its manifest.

After a successful compile the command keeps `target/partial_parse.json`: a fingerprint of
everything the compile depended on, the sha256 of the plan.json it wrote, its warnings and the
counts its summary line gives. The fingerprint covers

- the name and bytes of every file the compile read (`project.ProjectFiles`: the compile works
  from the very bytes fingerprinted), so a file edited, added, removed or renamed changes it;
- the --target and --vars given, and the project's folder;
- the compiler's own code (every compiler/*.py, by content), the installed libraries that shape
  a plan or its diagnostics (PyYAML, Jinja2, sqlglot, networkx: their `__init__.py` by size and
  modification time, which any reinstall changes), networkx's settings in the environment
  (NETWORKX_*, which choose its backends) and the Python version.

Other environment variables are no input: env_var() leaves a placeholder the runtime resolves.
A compile whose fingerprint and plan.json are both as recorded prints the recorded warnings and
summary and parses nothing (no YAML, Jinja, SQL or graph).

A project that has changed is compiled again, but file by file what did not change is reused
(`ParseCache`, kept in `target/partial_parse_files.marshal`):

- each YAML file of sources/ and tables/ is parsed and checked against the schema once per
  content: the parsed document (values and positions) and its checked entries are kept by the
  file's digest, for files that gave no diagnostic (a file with a warning or an error is read
  again, so that the compile reports it again);
- each table's SQL file is split into text and expressions (compiler/simple_template.py) once
  per content; it is still rendered every time, as vars, macros and other tables may change.

plan.json itself is written with the text of each step the last compile encoded, where the step
is the same (`load_step_texts`, kept in `target/plan_steps.marshal`): Python's JSON encoder is
pure Python when it indents, and a plan of 1,000 steps took it 0.1 s, a fifth of a compile after
an edit.

What is kept is only used under the same compiler code and libraries (the fingerprint's `_code`),
and only when this user wrote it: target/ is part of the project, and a pull request can commit
a crafted one. The fingerprint is keyed and the marshal records are signed with the user's key
(compiler/cache_key.py); a record the key does not vouch for is ignored, undecoded."""

from __future__ import annotations

import contextlib
import hashlib
import json
import marshal
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from compiler import cache_key
from compiler.errors import Diagnostic, Location
from compiler.project import ProjectFiles

if TYPE_CHECKING:  # compiler.plan imports networkx, which an unchanged project's compile never needs
    from compiler.plan import Plan

RECORD_FILE = "partial_parse.json"
FORMAT = 1  # of the record and of what the fingerprint covers: bump when either changes
_COMPILER = Path(__file__).parent  # its *.py are part of every fingerprint
_LIBRARIES = ("yaml", "jinja2", "sqlglot", "networkx")


@dataclass(frozen=True)
class Summary:
    """What `pipe compile` says about a plan: its project, target and steps by kind."""

    project: str
    target: str
    sources: int
    actions: Mapping[str, int]  # write steps by the timeline action they complete, sorted
    tests: int
    seeds: int = 0  # of the write steps (counted in `actions` too)
    unit_tests: int = 0

    @classmethod
    def of(cls, plan: Plan) -> "Summary":
        actions: dict[str, int] = {}
        for s in plan.steps:
            if s.kind == "write":
                actions[s.action] = actions.get(s.action, 0) + 1
        return cls(project=plan.project, target=plan.target.name, sources=sum(1 for s in plan.steps if s.kind == "ingest"),
                   actions=dict(sorted(actions.items())), tests=sum(1 for s in plan.steps if s.kind == "test"),
                   seeds=sum(1 for s in plan.steps if s.kind == "write" and s.config.get("seed")),
                   unit_tests=sum(1 for s in plan.steps if s.kind == "unit"))

    @property
    def tables(self) -> int:
        return sum(self.actions.values())


@dataclass(frozen=True)
class Reused:
    """The previous compile of an unchanged project, whose plan.json is still in place."""

    warnings: tuple[Diagnostic, ...]
    summary: Summary


def fingerprint(files: ProjectFiles, target: str | None, cli_vars: Mapping[str, Any]) -> str | None:
    """The fingerprint of a compile of these files with these options, or None when a file
    could not be read (the compile reports it, and is not recorded) or there is no key to
    vouch for records (compiler/cache_key.py). Keyed, so a record committed to target/ by
    someone else never matches."""
    secret = cache_key.keyed("partial parse fingerprint")
    if secret is None:
        return None
    h = hashlib.sha256(code_digest().encode() + b"\0" + secret.encode() + b"\0")
    h.update(json.dumps([str(files.root), target, cli_vars], sort_keys=True, default=repr).encode() + b"\0")
    for rel, data in files.contents.items():
        if isinstance(data, OSError):
            return None
        h.update(f"{rel}\0{len(data)}\0".encode())
        h.update(data)
    h.update(json.dumps(files.skipped).encode())  # a file pipe does not read still gets its warning
    return h.hexdigest()


def code_digest() -> str:
    """The digest of the compiler's code, the libraries it uses and the Python running it."""
    h = hashlib.sha256(f"pipe partial parse {FORMAT}\0{sys.version}\0".encode())
    _code(h)
    return h.hexdigest()


def _code(h) -> None:
    """The compiler's source files by content, and the libraries by their `__init__.py` and settings."""
    from importlib.util import find_spec

    for path in sorted(_COMPILER.glob("*.py")):
        data = path.read_bytes()
        h.update(f"{path.name}\0{len(data)}\0".encode())
        h.update(data)
    h.update(json.dumps(sorted((k, v) for k, v in os.environ.items() if k.startswith("NETWORKX_"))).encode() + b"\0")
    for name in _LIBRARIES:
        spec = find_spec(name)
        origin = spec.origin if spec is not None else None
        try:
            st = os.stat(origin) if origin else None
        except OSError:
            st = None
        h.update(f"{name}\0{origin}\0{st and st.st_size}\0{st and st.st_mtime_ns}\0".encode())


def read_record(path: Path, fmt: int, fp: str | None) -> dict[str, Any] | None:
    """The JSON record at `path` when it is of format `fmt` and fingerprint `fp` (not None);
    OSError or ValueError when there is none or it is damaged."""
    if fp is None:
        return None
    with open(path, encoding="utf-8") as f:
        record = json.load(f)
    return record if isinstance(record, dict) and record.get("format") == fmt and record.get("fingerprint") == fp else None


def reuse(target_dir: Path, fp: str | None) -> Reused | None:
    """The recorded compile, when its fingerprint is `fp` and plan.json is as it wrote it."""
    try:
        record = read_record(target_dir / RECORD_FILE, FORMAT, fp)
        if record is None:
            return None
        with open(target_dir / "plan.json", "rb") as f:
            if hashlib.sha256(f.read()).hexdigest() != record["plan_sha256"]:
                return None
        warnings = warnings_from_json(record["warnings"])
        s = record["summary"]
        summary = Summary(project=s["project"], target=s["target"], sources=s["sources"], actions=dict(s["actions"]), tests=s["tests"],
                          seeds=s.get("seeds", 0), unit_tests=s.get("unit_tests", 0))
    except (OSError, ValueError, RecursionError, KeyError, TypeError):
        return None  # no record, or a damaged one: compile in full
    if not all(isinstance(n, int) for n in (summary.sources, summary.tests, summary.seeds, summary.unit_tests, *summary.actions.values())):
        return None
    return Reused(warnings, summary)


def warnings_to_json(warnings: Iterable[Diagnostic]) -> list[dict[str, Any]]:
    """A compile's warnings as a record keeps them, to print them again when it is reused."""
    return [{"file": w.location.file, "line": w.location.line, "col": w.location.col, "message": w.message, "hint": w.hint}
            for w in warnings]


def warnings_from_json(items: Iterable[Mapping[str, Any]]) -> tuple[Diagnostic, ...]:
    """The warnings of a record (KeyError or TypeError when it is damaged)."""
    return tuple(Diagnostic(Location(w["file"], w["line"], w["col"]), w["message"], w["hint"], "warning") for w in items)


def remember(target_dir: Path, fp: str | None, plan_json: str, warnings: Iterable[Diagnostic], summary: Summary) -> None:
    """Records a successful compile that wrote `plan_json` to target_dir/plan.json (best effort:
    a record that cannot be written only costs the next compile its time)."""
    if fp is None:
        return
    record = {
        "format": FORMAT,
        "fingerprint": fp,
        # the bytes as text mode wrote them
        "plan_sha256": hashlib.sha256(plan_json.replace("\n", os.linesep).encode("utf-8")).hexdigest(),
        "warnings": warnings_to_json(warnings),
        "summary": {"project": summary.project, "target": summary.target, "sources": summary.sources,
                    "actions": dict(summary.actions), "tests": summary.tests, "seeds": summary.seeds, "unit_tests": summary.unit_tests},
    }
    tmp = target_dir / f".{RECORD_FILE}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(record, f, indent=1, sort_keys=True)
        os.replace(tmp, target_dir / RECORD_FILE)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


FILES_RECORD = "partial_parse_files.marshal"
FILES_FORMAT = 2  # 2: signed


def _digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=20).digest()


class ParseCache:
    """What a compile made of each project file, by the file's digest: file-level partial
    parsing (see the module's docstring).

    Kept with marshal, which reads Python's plain values back several times faster than YAML is
    parsed and, unlike pickle, never runs code. A file whose result holds anything else (a YAML
    date) is parsed every time. Anything unreadable is an empty cache."""

    def __init__(self, code: str, files: dict[str, tuple[bytes, bytes]] | None = None):
        self._code = code  # code_digest(): what the record was and will be written under
        self._old_files = files or {}
        self._files: dict[str, tuple[bytes, bytes]] = {}  # what this compile used or made: the next record

    @classmethod
    def load(cls, target_dir: Path) -> "ParseCache":
        code = code_digest()
        try:
            fmt, recorded, files = _read_marshal(target_dir, FILES_RECORD)
        except (OSError, ValueError, EOFError, TypeError):
            return cls(code)  # none, a damaged one, or one this user's key does not vouch for
        if fmt != FILES_FORMAT or recorded != code or not isinstance(files, dict):
            return cls(code)
        return cls(code, files)

    def get(self, rel: str, data: bytes) -> Any | None:
        """What `put` kept for this file with these bytes, or None."""
        old = self._old_files.get(rel)
        if not isinstance(old, tuple) or len(old) != 2 or old[0] != _digest(data):
            return None
        try:
            payload = marshal.loads(old[1])
        except (ValueError, EOFError, TypeError):
            return None
        self._files[rel] = old
        return payload

    def put(self, rel: str, data: bytes, payload: Any) -> None:
        """Keeps what the compile made of the file with these bytes (a copy, taken now)."""
        try:
            blob = marshal.dumps(payload)
        except ValueError:  # a value marshal does not hold: this file is parsed every time
            return
        self._files[rel] = (_digest(data), blob)

    def save(self, target_dir: Path) -> None:
        """Writes the record for the next compile: the files this one used (best effort, and
        only when it differs from the one read)."""
        if self._files == self._old_files:
            return
        _write_marshal(target_dir, FILES_RECORD, (FILES_FORMAT, self._code, self._files))


def _read_marshal(target_dir: Path, name: str) -> Any:
    """The value `_write_marshal` kept in target_dir/name; ValueError when this user's key does
    not vouch for it (a file committed to target/, or written with another key): marshal is not
    meant for data it did not write, so nothing unsigned is even decoded."""
    with open(target_dir / name, "rb") as f:
        data = f.read()
    signature, blob = data[:_SIGNATURE], data[_SIGNATURE:]
    if not cache_key.verified(signature, blob):
        raise ValueError(f"{name} is not signed with this user's key")
    return marshal.loads(blob)


_SIGNATURE = 32  # bytes of HMAC-SHA256 before the marshalled value


def _write_marshal(target_dir: Path, name: str, value: Any) -> None:
    """target_dir/name holds `value` in marshal's format after its signature, whole or not at
    all (best effort: a record that cannot be written only costs the next compile its time)."""
    tmp = target_dir / f".{name}.{os.getpid()}.tmp"
    try:
        blob = marshal.dumps(value)
        signature = cache_key.sign(blob)
        if signature is None:
            return  # no key: nothing kept could be trusted
        target_dir.mkdir(exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(signature + blob)
        os.replace(tmp, target_dir / name)
    except (OSError, ValueError):
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


STEPS_RECORD = "plan_steps.marshal"
STEPS_FORMAT = 2  # 2: signed


def load_step_texts(target_dir: Path) -> dict[bytes, str]:
    """The JSON text of each step of the last plan.json written, by the digest of the step's
    canonical JSON (compiler.plan.Plan.to_json): empty when there is none, or when it was written
    by other compiler code, libraries or Python, or is damaged."""
    try:
        fmt, code, texts = _read_marshal(target_dir, STEPS_RECORD)
    except (OSError, ValueError, EOFError, TypeError):
        return {}
    if fmt != STEPS_FORMAT or code != code_digest() or not isinstance(texts, dict):
        return {}
    if not all(isinstance(k, bytes) and isinstance(v, str) for k, v in texts.items()):
        return {}
    return texts


def save_step_texts(target_dir: Path, texts: dict[bytes, str]) -> None:
    """Keeps the texts of the plan.json just written for the next compile (best effort)."""
    _write_marshal(target_dir, STEPS_RECORD, (STEPS_FORMAT, code_digest(), texts))

"""The Plan: the one contract between the compiler and the runtime.

A Plan is written as `target/plan.json` with sorted keys, relative paths and no timestamps, so
the same project gives the same bytes on any machine and plans can be committed and diffed.
`Plan.from_json` is what the runtime reads; it refuses plans of another schema version."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

from compiler.errors import PipeError

if TYPE_CHECKING:
    import networkx as nx

SCHEMA_VERSION = 1
_PLAN_JSON = {"sort_keys": True, "indent": 2, "ensure_ascii": False, "allow_nan": False}  # plan.json's layout

# The timeline action a write completes, by operation and table type (Hudi table version 6).
_REPLACING = ("insert_overwrite", "insert_overwrite_table", "delete_partition")


def timeline_action(operation: str, table_type: str) -> str:
    if operation in _REPLACING:
        return "replacecommit"
    return "deltacommit" if table_type == "merge_on_read" else "commit"


class PlanError(PipeError):
    """A plan.json that this version of pipe cannot run."""


@dataclass(frozen=True)
class TargetSpec:
    name: str
    lake: str
    spark_master: str
    spark_conf: Mapping[str, Any]
    env_vars: Mapping[str, str | None] = field(default_factory=dict)  # placeholders in the settings
    shared_paths: tuple[str, ...] = ()  # folders every node of a cluster mounts at the same path
    catalog: Mapping[str, Any] | None = None  # where tables are registered (kind, database, ...); None: nowhere

    def to_dict(self) -> dict[str, Any]:
        out = {
            "name": self.name,
            "lake": self.lake,
            "spark": {"master": self.spark_master, "conf": dict(self.spark_conf)},
            "env_vars": _env_list(self.env_vars),
        }
        if self.shared_paths:  # only when set: plans of projects without it stay as they were
            out["shared_paths"] = list(self.shared_paths)
        if self.catalog:  # likewise
            out["catalog"] = dict(self.catalog)
        return out

    def catalog_names(self, step: "Step") -> list[str]:
        """`database.table` of each catalog table a write step's table is registered as: one for
        copy-on-write, a read-optimized `_ro` and a real-time `_rt` for merge-on-read (as
        Hudi's sync names them); none without a catalog."""
        if not self.catalog or step.kind != "write":
            return []
        name = f"{self.catalog['database']}.{self.catalog.get('table_prefix', '')}{step.name}".lower()
        return [name + "_ro", name + "_rt"] if step.config.get("type") == "merge_on_read" else [name]

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "TargetSpec":
        return cls(name=d["name"], lake=d["lake"], spark_master=d["spark"]["master"], spark_conf=dict(d["spark"]["conf"]),
                   env_vars=_env_map(d.get("env_vars", ())), shared_paths=tuple(d.get("shared_paths", ())),
                   catalog=dict(d["catalog"]) if d.get("catalog") else None)


@dataclass(frozen=True)
class Step:
    """One node of the plan. `kind` is `ingest` (a source), `write` (a table) or `test` (a data
    test, whose `sql` returns its failing rows)."""

    id: str
    kind: str
    name: str
    depends_on: tuple[str, ...]
    config: Mapping[str, Any]
    file: str
    line: int | None
    description: str = ""
    tags: tuple[str, ...] = ()
    sql: str | None = None
    sql_full_refresh: str | None = None
    sql_file: str | None = None
    action: str | None = None
    env_vars: Mapping[str, str | None] = field(default_factory=dict)
    fingerprint: str = ""
    # a Python model's code and how model() is called (compiler/python_models.py); `sql_file`
    # then names its .py file
    python: Mapping[str, Any] | None = None

    @property
    def code(self) -> str:
        """The text that makes the step's rows, as a user wrote it or it rendered: the SQL, or
        a Python model's module."""
        return self.python["code"] if self.python is not None else (self.sql or "")

    @property
    def reads_table(self) -> str | None:
        """The pipe table a source reads: a `kind: table` source's `table`, an `s3_incremental`
        source's `metadata_table`; None for any other step."""
        if self.kind != "ingest" or self.config.get("kind") not in ("table", "s3_incremental"):
            return None
        return self.config.get("table") if self.config.get("kind") == "table" else self.config.get("metadata_table")

    def behaviour(self) -> dict[str, Any]:
        """What the step does; the fingerprint hashes exactly this. Descriptions, tags and
        source positions are left out: changing them changes nothing that runs."""
        out = {
            "kind": self.kind,
            "name": self.name,
            "config": self.config,
            "sql": self.sql,
            "sql_full_refresh": self.sql_full_refresh,
            "action": self.action,
        }
        if self.python is not None:  # only when set: the fingerprints of SQL tables stay as they were
            out["python"] = self.python
        return out

    def with_fingerprint(self) -> "Step":
        digest = hashlib.sha256(_canonical(self.behaviour()).encode("utf-8")).hexdigest()
        return Step(**{**self.__dict__, "fingerprint": digest})

    def to_dict(self) -> dict[str, Any]:
        d = {
            "id": self.id,
            "kind": self.kind,
            "name": self.name,
            "depends_on": list(self.depends_on),
            "config": self.config,
            "file": self.file,
            "line": self.line,
            "description": self.description,
            "tags": list(self.tags),
            "env_vars": _env_list(self.env_vars),
            "fingerprint": self.fingerprint,
        }
        if self.kind == "write":
            d.update(sql=self.sql, sql_full_refresh=self.sql_full_refresh, sql_file=self.sql_file, action=self.action)
            if self.python is not None:
                d["python"] = self.python
        elif self.kind == "test":
            d.update(sql=self.sql, sql_file=self.sql_file)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Step":
        return cls(
            id=d["id"],
            kind=d["kind"],
            name=d["name"],
            depends_on=tuple(d["depends_on"]),
            config=d["config"],
            file=d["file"],
            line=d["line"],
            description=d.get("description", ""),
            tags=tuple(d.get("tags", ())),
            sql=d.get("sql"),
            sql_full_refresh=d.get("sql_full_refresh"),
            sql_file=d.get("sql_file"),
            action=d.get("action"),
            env_vars=_env_map(d.get("env_vars", ())),
            fingerprint=d["fingerprint"],
            python=d.get("python"),
        )


@dataclass(frozen=True)
class Plan:
    project: str
    target: TargetSpec
    vars: Mapping[str, Any]
    steps: tuple[Step, ...]  # in topological order
    schema_version: int = SCHEMA_VERSION

    def step(self, step_id: str) -> Step:
        for s in self.steps:
            if s.id == step_id:
                return s
        raise KeyError(step_id)

    @property
    def step_ids(self) -> list[str]:
        return [s.id for s in self.steps]

    def graph(self) -> nx.DiGraph:
        from compiler.graph import build_graph, Edge
        from compiler.errors import Location

        nodes = {s.id: step_attributes(s) for s in self.steps}
        edges = [Edge(dep, s.id, Location(s.file, s.line)) for s in self.steps for dep in s.depends_on]
        return build_graph(nodes, edges)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "project": self.project,
            "target": self.target.to_dict(),
            "vars": dict(self.vars),
            "steps": [s.to_dict() for s in self.steps],
        }

    def to_json(self, step_texts: dict[bytes, str] | None = None) -> str:
        """plan.json's text: `json.dumps(self.to_dict(), sort_keys=True, indent=2,
        ensure_ascii=False)`, byte for byte. With an indent the standard library encodes in pure
        Python (about 0.1 s for 1,000 steps); `step_texts` holds the text of steps an earlier
        compile encoded, by the digest of their canonical JSON (which the C encoder writes in a
        sixth of that time), so only new and changed steps are encoded again. It is left holding
        this plan's steps (compiler/partial.py keeps it for the next compile)."""
        d = self.to_dict()
        if step_texts is None or not d["steps"]:
            return json.dumps(d, **_PLAN_JSON) + "\n"
        texts = []
        used: dict[bytes, str] = {}
        for step in d["steps"]:
            key = hashlib.blake2b(_canonical(step).encode("utf-8"), digest_size=16).digest()
            text = step_texts.get(key)
            if text is None:  # at the plan's depth: an item of the top-level "steps" list
                text = "    " + json.dumps(step, **_PLAN_JSON).replace("\n", "\n    ")
            used[key] = text
            texts.append(text)
        step_texts.clear()
        step_texts.update(used)
        d["steps"] = None
        head, tail = json.dumps(d, **_PLAN_JSON).split('\n  "steps": null', 1)  # top-level keys are unique
        return head + '\n  "steps": [\n' + ",\n".join(texts) + "\n  ]" + tail + "\n"

    @classmethod
    def from_json(cls, text: str, origin: str = "plan.json") -> "Plan":
        try:
            d = json.loads(text)
        except json.JSONDecodeError as exc:
            raise PlanError(f"{origin} is not valid JSON ({exc}); run `pipe compile` to write it again") from exc
        version = d.get("schema_version") if isinstance(d, dict) else None
        if version != SCHEMA_VERSION:
            raise PlanError(
                f"{origin} has plan schema version {version!r}; this pipe reads version {SCHEMA_VERSION}. "
                "Run `pipe compile` with this pipe to write it again"
            )
        try:
            return cls(
                project=d["project"],
                target=TargetSpec.from_dict(d["target"]),
                vars=d["vars"],
                steps=tuple(Step.from_dict(s) for s in d["steps"]),
                schema_version=version,
            )
        except (KeyError, TypeError) as exc:
            raise PlanError(f"{origin} is missing {exc}; run `pipe compile` to write it again") from exc


def step_attributes(step: Step) -> dict[str, Any]:
    """What selection looks at in a graph node."""
    files = {step.file} | ({step.sql_file} if step.sql_file else set())
    if step.config.get("seed"):  # path:seeds/x.csv selects the seed its YAML describes
        files.add(step.config["seed"]["file"])
    return {"kind": step.kind, "name": step.name, "tags": list(step.tags), "files": sorted(files), "config": dict(step.config)}


def _env_list(env_vars: Mapping[str, str | None]) -> list[dict[str, Any]]:
    return [{"name": k, "default": v} for k, v in sorted(env_vars.items())]


def _env_map(items) -> dict[str, str | None]:
    return {e["name"]: e["default"] for e in items}


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)

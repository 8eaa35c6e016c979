"""State selection, as dbt has it: `state:modified`, `state:new` and `result:<status>` compare the
project with a reference: the `plan.json` (and `run_results.json`) of another run, in the folder
`--state DIR` names (production's `target/`, kept as a CI artifact, say).

- `state:new`: steps the reference plan does not have.
- `state:modified`: new steps, and steps whose body, configs, contract or tests changed; each of
  these alone with `state:modified.body` (the rendered SQL: a macro's change shows here),
  `.configs` (any setting but the declared columns, tags included), `.contract` (the declared columns: a table's
  or source's `schema`, a captured table's `captured_schema`) and `.tests` (a table or source
  whose data tests were added, removed or changed).
- `result:error`, `result:fail`, `result:warn`, `result:skipped`, `result:success`,
  `result:no_input`, `result:cancelled`: steps with that outcome in the reference's
  run_results.json. `fail` is a data test that found failing rows past its threshold; `error`
  any other step that failed (a table's write, a test that could not run).

Graph operators apply as for any method: `state:modified+` is what a change reaches."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from compiler.plan import Plan, Step

MODIFIED_PARTS = ("body", "configs", "contract", "tests")
RESULTS = ("error", "fail", "warn", "skipped", "success", "no_input", "cancelled")
_CONTRACT_KEYS = ("schema", "captured_schema")


class StateError(Exception):
    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.hint = hint


@dataclass
class State:
    """The reference a selection compares the project with."""

    folder: str
    plan: Plan | None  # None: the folder has no plan.json (only result: selectors work)
    results: dict[str, dict[str, Any]] | None  # step id -> its entry of run_results.json

    @classmethod
    def load(cls, folder: str | Path) -> "State":
        path = Path(folder)
        if not path.is_dir():
            raise StateError(f"--state {folder}: no such folder",
                             "give the folder that holds the reference run's plan.json and run_results.json (its target/)")
        plan = results = None
        plan_file = path / "plan.json"
        if plan_file.is_file():
            try:
                plan = Plan.from_json(plan_file.read_text(encoding="utf-8"), origin=str(plan_file))
            except (ValueError, KeyError, TypeError) as exc:
                raise StateError(f"--state {folder}: {plan_file} is not a plan pipe can read ({exc})",
                                 "write it again with `pipe compile` on the reference branch") from exc
        results_file = path / "run_results.json"
        if results_file.is_file():
            try:
                doc = json.loads(results_file.read_text(encoding="utf-8"))
                results = {str(s["id"]): s for s in doc["steps"]}
            except (ValueError, KeyError, TypeError) as exc:
                raise StateError(f"--state {folder}: {results_file} is not a run_results.json pipe wrote ({exc})") from exc
        if plan is None and results is None:
            raise StateError(f"--state {folder}: the folder has neither plan.json nor run_results.json",
                             "point --state at the target/ folder of the reference run")
        return cls(str(folder), plan, results)

    def match(self, method: str, value: str, head: Mapping[str, Step]) -> set[str]:
        """The ids of `head`'s steps that `method:value` selects (method: state or result)."""
        if method == "result":
            if value not in RESULTS:
                raise StateError(f"unknown result '{value}' in 'result:{value}'", "results: " + ", ".join(RESULTS))
            if self.results is None:
                raise StateError(f"result:{value} needs {self.folder}/run_results.json, which is missing",
                                 "point --state at the target/ folder of the run whose results you select on")
            return {sid for sid, r in self.results.items() if sid in head and _outcome(r) == value}
        what, _, part = value.partition(".")
        if what not in ("new", "modified") or (part and (what == "new" or part not in MODIFIED_PARTS)):
            raise StateError(f"unknown state selector 'state:{value}'",
                             "state:new, state:modified, or state:modified." + ", state:modified.".join(MODIFIED_PARTS))
        if self.plan is None:
            raise StateError(f"state:{value} needs {self.folder}/plan.json, which is missing",
                             "compile the reference branch (`pipe compile`) and keep its target/plan.json")
        base = {s.id: s for s in self.plan.steps}
        new = {sid for sid in head if sid not in base}
        if what == "new":
            return new
        parts = (part,) if part else MODIFIED_PARTS
        tests_of = _tests_by_subject(head), _tests_by_subject(base)
        return new | {sid for sid, step in head.items() if sid in base and any(_changed(p, base[sid], step, sid, tests_of) for p in parts)}


def _outcome(result: Mapping[str, Any]) -> str:
    state = result.get("state")
    if state == "error" and result.get("kind") == "test" and result.get("failures"):
        return "fail"
    return str(state)


def _tests_by_subject(steps: Mapping[str, Step]) -> dict[str, dict[str, str]]:
    """Step id -> {test id: fingerprint} of the data tests declared on it."""
    out: dict[str, dict[str, str]] = {}
    for sid, step in steps.items():
        if step.kind == "test" and step.config.get("model"):
            subject = ("table." if step.config.get("model_kind") == "table" else "source.") + step.config["model"]
            out.setdefault(subject, {})[sid] = step.fingerprint
    return out


def _changed(part: str, before: Step, after: Step, sid: str, tests_of) -> bool:
    if part == "body":
        return (before.code, before.sql_full_refresh) != (after.code, after.sql_full_refresh)
    if part == "configs":
        strip = lambda c: {k: v for k, v in c.items() if k not in _CONTRACT_KEYS}  # noqa: E731
        return strip(before.config) != strip(after.config) or before.action != after.action or before.tags != after.tags
    if part == "contract":
        return any(before.config.get(k) != after.config.get(k) for k in _CONTRACT_KEYS)
    head_tests, base_tests = tests_of
    return head_tests.get(sid, {}) != base_tests.get(sid, {})

"""The command-line side of a team's daily loop (docs/dev-loop.md): `--defer TARGET` and its pins,
`--state DIR` for state and result selectors, and `pipe retry`. The work itself is done in
runtime/defer.py (pins, pinned reads) and compiler/state.py (what changed, what failed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from compiler.errors import Diagnostic, Location, ProjectError
from pipe import output

RESULTS_FILE = "run_results.json"


def _cli(message: str, hint: str | None = None) -> ProjectError:
    return ProjectError([Diagnostic(Location("<command line>"), message, hint)])


def state_matcher(state_dir: str | None, plan):
    """The `state:`/`result:` matcher of compiler/graph.select for `--state DIR` (None without
    it); a mistake in the folder or a selector is an error at the command line."""
    if state_dir is None:
        return None
    from compiler.state import State, StateError

    try:
        state = State.load(state_dir)
    except StateError as exc:
        raise _cli(str(exc), exc.hint) from exc
    head = {s.id: s for s in plan.steps}

    def match(method: str, value: str) -> set[str]:
        try:
            return state.match(method, value, head)
        except StateError as exc:
            raise _cli(str(exc), exc.hint) from exc

    return match


def deferral(root: Path, plan, chosen: list[str], defer_target: str, as_of: str | None, vars_text: str | None):
    """The run's Deferral to `defer_target`: its lake from the project compiled for that
    target (nothing written to target/), the pins chosen now."""
    from runtime.defer import plan_deferral

    lake, options = _lake_of(root, defer_target, vars_text, plan)
    return plan_deferral(plan, chosen, defer_target, lake, options, as_of)


def _lake_of(root: Path, target: str, vars_text: str | None, plan) -> tuple[str, tuple]:
    from compiler.api import compile_project
    from compiler.project import parse_cli_vars
    from runtime.steps.context import RunContext
    from runtime.errors import RunError

    if target == plan.target.name:
        raise _cli(f"--defer {target} names the target this run builds", "defer to another target: `--target dev --defer prod`")
    other = compile_project(root, target=target, cli_vars=parse_cli_vars(vars_text), cache_dir=root / "target", cache_write=False,
                            check_sql=False).plan
    output.hide_secrets(other)  # its lake's and settings' values from env_var() are masked wherever pipe prints them
    try:
        where = RunContext(other, root)
    except RunError as exc:
        raise _cli(f"--defer {target}: {exc}", exc.hint) from exc
    return where.lake, where.storage_options


def last_results(root: Path) -> dict[str, Any]:
    """The last run's target/run_results.json, for `pipe retry`."""
    path = root / "target" / RESULTS_FILE
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise _cli(f"no run to retry: {path} does not exist", "`pipe retry` re-runs what failed in the last `pipe run`, `build` or `test`") from exc
    except ValueError as exc:
        raise _cli(f"cannot read {path}: {exc}", "run the command again instead of retrying it") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("steps"), list) or not isinstance(doc.get("args"), dict):
        raise _cli(f"{path} is not a run_results.json pipe wrote", "run the command again instead of retrying it")
    return doc


RETRIED = ("error", "skipped", "cancelled")


def retried_steps(doc: dict[str, Any], plan) -> tuple[list[str], list[str]]:
    """The steps of the last run to run again (those that failed, were skipped or cancelled,
    in the plan's order), and those gone from the project since."""
    ids = [str(s.get("id")) for s in doc["steps"] if s.get("state") in RETRIED]
    known = set(plan.step_ids)
    return [i for i in plan.step_ids if i in set(ids)], sorted(set(ids) - known)


def retry_deferral(doc: dict[str, Any], root: Path, plan, vars_text: str | None, again: list[str]):
    """The deferral of the run retried, with its very pins; None when it deferred nothing. A
    table the retried steps read now (the fix added a ref()) that the run neither built nor
    deferred is pinned as that run would have pinned it (at its cut)."""
    from runtime.defer import Deferral, deferred_tables, plan_deferral

    stored = doc.get("defer")
    if not stored:
        return None
    lake, options = _lake_of(root, str(stored.get("target")), vars_text, plan)
    deferral = Deferral.again(stored, lake, options)
    built = {str(s.get("name")) for s in doc["steps"] if s.get("kind") == "write"}
    missing = [n for n in deferred_tables(plan, again) if n not in deferral.pins and n not in built]
    if not missing:
        return deferral
    more = plan_deferral(plan, again, deferral.target, lake, options, deferral.as_of or "latest", names=missing)
    return deferral.with_pins(more.pins)

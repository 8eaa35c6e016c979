"""`pipe test --record TABLE`: a unit test written from real tables (runtime/steps/unit.py
`record`), saved as tests/unit/<name>.yml, and compiled again at once so that what was written is
known to be a valid test."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from compiler.errors import Diagnostic, Location, ProjectError
from pipe import output


def record(cli_ctx, table: str, as_of: str | None, rows: int, with_this: bool, name: str | None, target, vars_text,
           compile_fn, spark_factory_fn) -> None:
    from runtime.defer import parse_as_of
    from runtime.steps.context import RunContext
    from runtime.steps.unit import FOLDER_UNIT, record as record_rows

    plan = compile_fn(cli_ctx, target, vars_text).plan
    root = cli_ctx.root()
    if f"table.{table}" not in plan.step_ids:
        raise ProjectError([_cli(f"--record {table}: no table named {table}", "name a table of the project (`pipe ls --select resource_type:table`)")])
    try:
        at = parse_as_of(as_of) if as_of else None
    except ValueError:
        raise ProjectError([_cli(f"--as-of {as_of!r} is not an instant or a time", "an instant (20260105103000123), an ISO time, or latest")]) from None
    name = name or f"{table}_recorded"
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise ProjectError([_cli(f"--name {name!r} is not a name", "use letters, digits and _")])
    path = root / FOLDER_UNIT / f"{name}.yml"
    if path.exists():
        raise ProjectError([_cli(f"{FOLDER_UNIT}/{name}.yml exists already", "choose another --name, or delete the file first")])
    ctx = RunContext(plan, root, (), spark_factory=spark_factory_fn(plan, root))
    test = record_rows(ctx, table, at, rows, name, with_this)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump({"unit_tests": [test]}, allow_unicode=True, sort_keys=False, default_flow_style=None, width=200)
    path.write_text(f"# recorded by `pipe test --record {table}`: read it, trim it, keep what matters\n" + text, encoding="utf-8")
    compile_fn(cli_ctx, target, vars_text)  # the file written is a valid unit test
    given = ", ".join(f"{len(g['rows'])} of {g['input']}" for g in test["given"])
    output.out.print(f"recorded unit test {name} in {FOLDER_UNIT}/{name}.yml: given {given or 'nothing'}; "
                     f"expects the {len(test['expect']['rows'])} rows {table} holds after its step runs on them")
    output.out.print(f"run it: pipe test --unit --select unit:{name}")


def _cli(message: str, hint: str) -> Diagnostic:
    return Diagnostic(Location("<command line>"), message, hint)

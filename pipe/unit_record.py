"""`pipe test --record TABLE`: a unit test written from real tables (runtime/steps/unit.py
`record` reads the rows and runs the table's step on them), shaped as YAML a person reads, saved
as tests/unit/<name>.yml and compiled again at once: a file that would not compile is removed,
so a recording never leaves the project broken."""

from __future__ import annotations

import os
import re

import yaml

from compiler.errors import Diagnostic, Location, ProjectError
from compiler.unit_tests import FOLDER, input_said
from pipe import output

_INTEGRAL = ("tinyint", "smallint", "int", "bigint")


def record(cli_ctx, table: str, as_of: str | None, rows: int, with_this: bool, name: str | None, target, vars_text,
           compile_fn, spark_factory_fn) -> None:
    from runtime.defer import parse_as_of
    from runtime.steps.context import RunContext
    from runtime.steps.unit import record as record_rows

    plan = compile_fn(cli_ctx, target, vars_text).plan
    root = cli_ctx.root()
    if f"table.{table}" not in plan.step_ids:
        raise ProjectError([_cli(f"--record {table}: no table named {table}", "name a table of the project (`pipe ls --select resource_type:model`)")])
    try:
        at = parse_as_of(as_of) if as_of else None
    except ValueError:
        raise ProjectError([_cli(f"--as-of {as_of!r} is not an instant or a time", "an instant (20260105103000123), an ISO time, or latest")]) from None
    name = name or f"{table}_recorded"
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise ProjectError([_cli(f"--name {name!r} is not a name", "use letters, digits and _")])
    rel = f"{FOLDER}/{name}.yml"
    path = root / rel
    if os.path.lexists(path):
        raise ProjectError([_cli(f"{rel} exists already", "choose another --name, or delete the file first")])
    ctx = RunContext(plan, root, (), spark_factory=spark_factory_fn(plan, root))
    given, expect = record_rows(ctx, table, at, rows, name, with_this)
    test = {"name": name, "model": table,
            "description": f"recorded from the lake of target {plan.target.name}" + (f" as of {as_of}" if as_of else "")
            + "; the expected rows are what the table's step made of the given rows then",
            "given": [_yaml_given(g) for g in given], "expect": {"rows": _yaml_rows(expect)}}
    text = yaml.safe_dump({"unit_tests": [test]}, allow_unicode=True, sort_keys=False, default_flow_style=None, width=100_000)  # a row a line
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(f"# recorded by `pipe test --record {table}`: read it, trim it, keep what matters\n" + text)
    try:
        compile_fn(cli_ctx, target, vars_text)  # the file written is a valid unit test
    except ProjectError:
        path.unlink()
        raise
    said = ", ".join(f"{len(g['rows'])} of {input_said(g['input'], g['name'])}" for g in given)
    output.out.print(f"recorded unit test {name} in {rel}: given {said or 'nothing'}; "
                     f"expects the {len(expect['rows'])} row{'s' if len(expect['rows']) != 1 else ''} {table} holds after its step runs on them")
    output.out.print(f"run it: pipe test --unit --select unit:{name}")


def _yaml_given(g: dict) -> dict:
    out = {"input": input_said(g["input"], g["name"])}
    if not g["declared"]:  # the types Spark had, where the project declares none
        out["column_types"] = {c["name"]: c["type"] for c in g["columns"]}
    out["rows"] = _yaml_rows(g)
    return out


def _yaml_rows(rows: dict) -> list[dict]:
    """`{columns, rows}` (values as text) as YAML mappings a person reads: whole numbers and
    booleans as YAML's, the rest (decimals, times, text) as the text Spark wrote, which the
    test casts back exactly."""
    types = {c["name"]: c["type"] for c in rows["columns"]}
    return [_yaml_row(dict(zip(types, r)), types) for r in rows["rows"]]


def _yaml_row(row: dict, types: dict) -> dict:
    out = {}
    for k, v in row.items():
        typ = types.get(k, "")
        if v is not None and typ in _INTEGRAL:
            v = int(v)
        elif v is not None and typ == "boolean":
            v = v == "true"
        out[k] = v
    return out


def _cli(message: str, hint: str) -> Diagnostic:
    return Diagnostic(Location("<command line>"), message, hint)

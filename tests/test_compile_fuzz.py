"""Fuzzing `pipe compile`: hundreds of mutated copies of the example project (project_template/)
must each compile or fail with diagnostics, never with an internal error, never hang, and every
diagnostic must say where (file:line).

Bounded and seeded: the same cases every run (SEED), each compile in-process under a deadline
(SIGALRM). A failure prints the case number and its mutations; `FUZZ_CASE=N pytest -k fuzz`
replays one case."""

from __future__ import annotations

import os
import random
import signal
import traceback
from contextlib import contextmanager
from pathlib import Path

import pytest

from compiler.api import compile_project
from compiler.errors import ProjectError
from tests.conftest import TEMPLATE

SEED = 19
CASES = 400  # random cases; every junk value is also tried once on its own (TARGETED)
DEADLINE_S = 10.0  # per compile; a healthy one takes milliseconds

YAML_JUNK = [
    "", "~", "null", "[]", "{}", "[[]]", "{a: 1}", "[1, [2, {x: y}]]", "1e309", "-1e309", ".nan", ".inf", "-1", "0",
    "99999999999999999999999999999999", "-99999999999999999999", "3.5", "yes", "no", "true", "2024-01-01",
    "2024-01-01T00:00:00Z", "0x1F", "0o17", "'{{ env_var(\"X\") }}'", "'{{ var(\"nope\") }}'", "'{% if %}'",
    "'{{ 10**10**10 }}'", "'{{ ref(\"orders\") }}'", "*nope", "&a x", "!!binary aGVsbG8=", "!!python/object/apply:os.system ['true']",
    "!!set {a, b}", "!!omap [a: 1]", "!!timestamp 2001-12-14", "!!float abc", "!!int 1.5", "ünïcødé ☃ 𝔘", "\"\\u0000\"",
    "\"\\x00\\t\"", "x" * 5000, "[" + ", ".join(["x"] * 2000) + "]", "|\n  multi\n  line", ">-", "? complex", "- a",
    "a: b: c", "'unclosed", "\"unclosed", "[unclosed", "{unclosed", "@reserved", "`reserved", "%TAG", "---", "...",
    "\t\ttabbed", "id BIGINT, name STRNG", "a INT, a INT", "struct<a:int", "decimal(10,", "0777", "+1", "1_000",
    "order_id", "[order_id, order_id]", "[_hoodie_record_key]", "region=EU", "/abs", "s3://b/x", "gs://b/x",
    "keep_latest_commits", "merge_on_read", "insert_overwrite_table", "delete_partition", "bootstrap", "{path: x}",
]

YAML_KEYS = [
    "name", "lake", "default_target", "targets", "vars", "kind", "path", "format", "schema", "options", "table",
    "queue_url", "metadata_table", "key", "precombine", "partition_by", "operation", "type", "delete_when", "index",
    "insert_duplicates", "combine_before_insert", "bulk_insert_sort_mode", "partitions_to_delete", "max_file_size",
    "small_file_limit", "clean", "archive", "compaction", "bootstrap", "tags", "description", "retain", "policy",
    "min_instants", "max_instants", "spark", "master", "conf", "on_checkpoint_lost", "max_files_per_run", "nope", "Key",
]

SQL_JUNK = [
    "(", ")", "'", "`", '"', ",", ";", "--", "/*", "*/", "select", "from", "where", "join", "on", "group by", "order by",
    "union", "*", "a.", ".b", "1e999", "99999999999999999999999999999", "\x00", "ünï☃", "\t", "\\",
    "{{", "}}", "{%", "%}", "{#", "#}", "{{ }}", "{% if is_incremental() %}", "{% endif %}", "{% else %}",
    "{{ ref( }}", "{{ ref('nope') }}", "{{ ref('orders') }}", "{{ ref('customers') }}", "{{ source('raw_orders') }}",
    "{{ source('nope') }}", "{{ source('raw_orders', 'x') }}", "{{ var('x') }}", "{{ var('min_amount') }}", "{{ var() }}",
    "{{ 1/0 }}", "{{ 10**10**10 }}", "{{ 2**100000000 }}", "{{ 'a' * 10**10 }}", "{{ [1] * 10**10 }}",
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "{{ this }}", "{{ this.x }}", "{{ target.nope }}", "{{ target.name }}", "{{ env_var(1) }}", "{{ env_var('X') }}",
    "{{ env_var('X') == 'y' }}", "{{ is_incremental }}", "{{ is_incremental(1) }}", "{% macro x() %}", "{% endmacro %}",
    "{{ money() }}", "{{ money(1, 2, 3) }}", "{{ money('a') }}", "{% include 'nope.sql' %}", "{% include 'macros/money.sql' %}",
    "{% import 'macros/money.sql' as m %}{{ m.money('a') }}", "{% extends 'tables/orders.sql' %}", "{{ ''.__class__ }}",
    "{{ ref }}", "{{ range(10) }}", "{% set x = x %}", "{{ x }}", "{{ lipsum(5) }}", "{% raw %}", "{% endraw %}",
    "{{ 'x' | nofilter }}", "{{ {'a': 1}['b'] }}", "{{ none.x }}", "{% filter upper %}", "{% call money('a') %}{% endcall %}",
    "(" * 3000, "select " + ", ".join(f"c{i}" for i in range(3000)), "case when", "end", "over (", "lateral view",
    "select * from (select 1) t", "x -> x", "::", "${env:X}", "${x}", "?", ":param",
]


def _template_files() -> dict[str, str]:
    files = {}
    for path in sorted(TEMPLATE.rglob("*")):
        rel = path.relative_to(TEMPLATE).as_posix()
        if path.is_file() and not rel.startswith(("data/", ".github/", "lake/", "target/")):
            files[rel] = path.read_text(encoding="utf-8")
    return files


def _pick_line(rng: random.Random, text: str) -> tuple[list[str], int]:
    lines = text.split("\n")
    return lines, rng.randrange(len(lines))


def _yaml_mutation(rng: random.Random, text: str) -> tuple[str, str]:
    lines, i = _pick_line(rng, text)
    op = rng.choice(["delete", "duplicate", "truncate", "retype", "rename", "indent", "insert", "unicode", "nest",
                     "alias_bomb", "self_alias", "deep_block", "tab", "swap"])
    if op == "delete":
        del lines[i]
    elif op == "duplicate":
        lines.insert(i, lines[i])
    elif op == "truncate":
        return text[: rng.randrange(len(text) + 1)], op
    elif op == "retype":
        if ":" in lines[i]:
            head = lines[i].split(":", 1)[0]
            lines[i] = f"{head}: {rng.choice(YAML_JUNK)}"
        else:
            lines[i] = lines[i][: rng.randrange(len(lines[i]) + 1)] + rng.choice(YAML_JUNK)
    elif op == "rename":
        if ":" in lines[i]:
            head, rest = lines[i].split(":", 1)
            j = rng.randrange(len(head) + 1)
            lines[i] = head[:j] + rng.choice("xé_ -:") + head[j:] + ":" + rest
    elif op == "indent":
        lines[i] = (" " * rng.choice([1, 2, 4])) + lines[i] if rng.random() < 0.5 else lines[i].lstrip()
    elif op == "insert":
        indent = len(lines[i]) - len(lines[i].lstrip())
        lines.insert(i + 1, " " * indent + f"{rng.choice(YAML_KEYS)}: {rng.choice(YAML_JUNK)}")
    elif op == "unicode":
        j = rng.randrange(len(lines[i]) + 1)
        lines[i] = lines[i][:j] + rng.choice(["é", "☃", "\u200b", "\ufeff", "𝔘", "\u0085", "\u2028", "\x7f"]) + lines[i][j:]
    elif op == "nest":
        depth = rng.choice([50, 500, 5000, 50000, 200000])
        lines.insert(i, f"deep{i}: " + "[" * depth + "]" * depth)
    elif op == "alias_bomb":
        bomb = ["bomb_a: &a [x, x, x, x, x, x, x, x, x, x]"]
        for k, name in enumerate("bcdefghij"):
            prev = "abcdefghij"[k]
            bomb.append(f"bomb_{name}: &{name} [" + ", ".join([f"*{prev}"] * 10) + "]")
        lines[i:i] = bomb
    elif op == "self_alias":
        lines.insert(i, "loop: &loop [*loop]" if rng.random() < 0.5 else "loop: &loop {a: *loop}")
    elif op == "deep_block":
        depth = rng.choice([100, 1000, 4000])
        lines.insert(i, "\n".join(" " * d + f"k{d}:" for d in range(depth)) + " x")
    elif op == "tab":
        lines[i] = "\t" + lines[i]
    elif op == "swap" and len(lines) > 1:
        j = rng.randrange(len(lines))
        lines[i], lines[j] = lines[j], lines[i]
    return "\n".join(lines), op


def _sql_mutation(rng: random.Random, text: str) -> tuple[str, str]:
    op = rng.choice(["delete_word", "insert", "insert", "insert", "truncate", "duplicate_line", "unicode", "replace_word", "empty"])
    words = text.split(" ")
    if op == "delete_word" and len(words) > 1:
        del words[rng.randrange(len(words))]
        return " ".join(words), op
    if op == "insert":
        j = rng.randrange(len(text) + 1)
        return text[:j] + rng.choice(SQL_JUNK) + text[j:], op
    if op == "truncate":
        return text[: rng.randrange(len(text) + 1)], op
    if op == "duplicate_line":
        lines, i = _pick_line(rng, text)
        lines.insert(i, lines[i])
        return "\n".join(lines), op
    if op == "unicode":
        j = rng.randrange(len(text) + 1)
        return text[:j] + rng.choice(["é", "☃", "\u200b", "\ufeff", "\u0000", "\u2028"]) + text[j:], op
    if op == "replace_word":
        i = rng.randrange(len(words))
        words[i] = rng.choice(["amount", "amout", "o.amount", "c.nme", "x.y", "*", "order_id", "customer_idd", "lower(", "'a'"])
        return " ".join(words), op
    return "", op


def _mutate(rng: random.Random, files: dict[str, str]) -> tuple[dict[str, str | bytes], list[str]]:
    files: dict[str, str | bytes] = dict(files)
    done = []
    for _ in range(rng.choice([1, 1, 2, 3])):
        what = rng.random()
        if what < 0.08:  # whole files
            op = rng.choice(["remove", "empty", "binary", "extra_table", "extra_sql", "orphan_yml"])
            rel = rng.choice(sorted(files))
            if op == "remove":
                files.pop(rel)
            elif op == "empty":
                files[rel] = ""
            elif op == "binary":
                files[rel] = b"select \xff\xfe\x00 from x\n"
            elif op == "extra_table":
                files["tables/zz.yml"] = f"tables:\n  zz:\n    key: [{rng.choice(['id', 'order_id', ''])}]\n    {rng.choice(YAML_KEYS)}: {rng.choice(YAML_JUNK)}\n"
                files["tables/zz.sql"] = "select * from {{ ref('orders') }}" + rng.choice(["", " where", "\n{{ ref('zz') }}"])
            elif op == "extra_sql":
                files["tables/sub/x.sql"] = rng.choice(["select 1 as id", "{{ ref('x') }}", "select * from {{ ref('customer_revenue') }}"])
            else:
                files["tables/orphan.yml"] = "tables:\n  orphan:\n    key: [id]\n"
            done.append(f"{op} {rel}")
            continue
        rel = rng.choice([r for r in sorted(files) if isinstance(files[r], str)] or ["pipe_project.yml"])
        text = files.get(rel, "")
        if not isinstance(text, str):
            continue
        if rel.endswith((".yml", ".yaml")):
            files[rel], op = _yaml_mutation(rng, text)
        else:
            files[rel], op = _sql_mutation(rng, text)
        done.append(f"{op} {rel}")
    return files, done


class _Deadline(Exception):
    pass


@contextmanager
def _deadline(seconds: float):
    def alarm(signum, frame):
        raise _Deadline()

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _write(root: Path, files: dict[str, str | bytes]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(text, bytes):
            path.write_bytes(text)
        else:
            path.write_text(text, encoding="utf-8")


def _problem(root: Path) -> tuple[str | None, bool]:
    """(what is wrong with compiling `root` or None when it compiled or failed properly,
    whether it compiled)."""
    compiled = False
    try:
        with _deadline(DEADLINE_S):
            result = compile_project(root)
            result.plan.to_json()
            diagnostics = list(result.warnings)
            compiled = True
    except _Deadline:
        return f"hang: no result within {DEADLINE_S} s", False
    except ProjectError as exc:
        diagnostics = exc.diagnostics
        if not diagnostics:
            return "ProjectError without diagnostics", False
    except BaseException:  # noqa: BLE001 - an internal error: exactly what the fuzzing hunts
        return "internal error:\n" + traceback.format_exc(limit=-6), False
    for d in diagnostics:
        loc = d.location
        if loc.file != "<command line>" and (not loc.file or loc.line is None):
            return f"diagnostic without file:line: {d}", compiled
        if not d.message.strip():
            return f"diagnostic without message at {loc}", compiled
    return None, compiled


def _targeted(base: dict[str, str]):
    """Each SQL junk item inserted into tables/orders.sql, and each YAML junk value given to a
    key of tables/orders.yml (keys taken in turn), once."""
    for i, junk in enumerate(SQL_JUNK):
        files = dict(base)
        files["tables/orders.sql"] = base["tables/orders.sql"].replace("from {{", junk + "\nfrom {{", 1)
        yield files, [f"sql junk {junk[:40]!r} in tables/orders.sql"]
    for i, junk in enumerate(YAML_JUNK):
        files = dict(base)
        key = YAML_KEYS[i % len(YAML_KEYS)]
        files["tables/orders.yml"] = base["tables/orders.yml"].replace("    key: [order_id]\n", f"    key: [order_id]\n    {key}: {junk}\n", 1)
        yield files, [f"yaml junk {key}: {junk[:40]!r} in tables/orders.yml"]


def _cases(base: dict[str, str]):
    yield from _targeted(base)
    for case in range(CASES):
        yield _mutate(random.Random(f"{SEED}:{case}"), base)


def test_mutated_example_projects_compile_or_fail_with_located_errors(tmp_path):
    base = _template_files()
    assert "    key: [order_id]\n" in base["tables/orders.yml"] and "from {{" in base["tables/orders.sql"]
    only = os.environ.get("FUZZ_CASE")
    failures = []
    outcomes = {"compiled": 0, "errors": 0}
    for case, (files, done) in enumerate(_cases(base)):
        if only is not None and str(case) != only:
            continue
        root = tmp_path / f"case{case}"
        _write(root, files)
        problem, compiled = _problem(root)
        if problem is not None:
            failures.append(f"case {case} ({'; '.join(done)}): {problem}")
        outcomes["compiled" if compiled else "errors"] += 1
    assert not failures, f"{len(failures)} of {case + 1} cases failed:\n\n" + "\n\n".join(failures[:15])
    if only is None:  # the mutations are strong enough to break most copies, mild enough to leave some whole
        assert outcomes["errors"] > case // 2 and outcomes["compiled"] > 10, outcomes


# --- what the fuzzing found, one case each ---------------------------------------------------------


def _one(project, files):
    from tests.conftest import compile_errors

    diags = compile_errors(project(files))
    return [(str(d.location), d.message) for d in diags]


def test_deeply_nested_yaml_is_refused_before_it_can_crash_the_parser(project):
    deep = "[" * 100_000 + "]" * 100_000
    assert _one(project, {"pipe_project.yml": f"name: shop\nvars:\n  x: {deep}\n"}) == [
        ("pipe_project.yml:3:104", "YAML nested more than 100 levels deep")]


def test_yaml_aliases_that_expand_without_bound_or_loop(project):
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{n}: &{n} [" + ", ".join([f"*{p}"] * 10) + "]\n" for p, n in zip("abcdefgh", "bcdefghi"))
    assert _one(project, {"pipe_project.yml": "name: shop\nvars:\n  " + bomb.replace("\n", "\n  ")})[0][1] == \
        "the file expands to more than 200,000 values"
    assert _one(project, {"pipe_project.yml": "name: shop\nvars:\n  loop: &l [*l]\n"}) == [
        ("pipe_project.yml:3:9", "a YAML alias (*name) here refers to a value that contains it")]


def test_unreadable_characters_are_located(project):
    root = project({"tables/t.sql": "select 1 as id\n"})
    (root / "tables" / "t.sql").write_bytes(b"select 1\nfrom \xff x\n")
    (root / "pipe_project.yml").write_text("name: shop\nvars: {a: \"x\x7f\"}\n", encoding="utf-8")
    from tests.conftest import compile_errors

    assert [(str(d.location), d.message) for d in compile_errors(root)] == [
        ("pipe_project.yml:2:13", "YAML error: character U+007F is not allowed here (control characters are not allowed)"),
        ("tables/t.sql:2:6", "file is not UTF-8 text (invalid start byte at byte 14)"),
    ]


def test_a_tag_its_text_does_not_fit(project):
    assert _one(project, {"pipe_project.yml": "name: shop\nvars: {n: !!int 1.5}\n"}) == [
        ("pipe_project.yml:2:11", "cannot read value '1.5' as int: invalid literal for int() with base 10: '1.5'")]


@pytest.mark.parametrize("expression, message", [
    ("{{ 2**100000000 }}", "2 ** 100000000 is too large a number for a template"),
    ("{{ 'a' * 10**10 }}", "repeating a value 10000000000 times makes more than 1,000,000 items"),
    ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "loops go over more than 1,000,000 items"),
])
def test_templates_that_would_stall_stop_with_a_message(project, expression, message):
    [(where, text)] = _one(project, {"tables/t.sql": "select 1 as id\n" + expression + "\n"})
    assert where == "tables/t.sql:2" and message in text

"""Seeds as a user meets them: CSV files in seeds/ (quoted values with commas, quotes and
newlines, accents, a BOM, CRLF), described in seeds/*.yml, checked at compile time with file:line,
written by `pipe seed`, `pipe run` and `pipe build` only when the file changed (a changed file
replaces the table whole), read by tables through ref(), tested like tables, and read back with
pipe's reader and hudi-rs. Plus the parser and the type inference without Spark."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal
from pathlib import Path

import pytest

from compiler import compile_project
from compiler.seeds import SeedFileError, infer_type, parse
from tests.conftest import compile_errors
from tests.test_run import assert_clean, commits, hudi_rows, pipe, pipe_rows, project, run_results, steps, timeline

SEEDS_YML = """
    seeds:
      fx_rates:
        description: Daily exchange rates, kept by finance.
        tags: [finance]
        key: [currency, day]
        partition_by: [currency]
        column_types: {rate: "DECIMAL(12,6)"}
        columns:
          - name: currency
            description: ISO 4217 code.
            tests: [not_null]
          - name: rate
            tests: [not_null]
        tests:
          - unique:
              columns: [currency, day]
      country_codes:
        key: [code]
        columns:
          - name: code
            tests: [unique, not_null]
    """

ORDERS_SQL = """
    select c.code, c.name, f.rate, f.day
    from {{ ref('country_codes') }} c
    join {{ ref('fx_rates') }} f on f.currency = c.currency
    where f.day = date '2024-03-01'
    """

CURRENCIES = ["EUR", "USD", "GBP", "CHF", "SEK", "NOK", "DKK", "PLN", "CZK", "HUF", "JPY", "CNY"]


def csv_field(value) -> str:
    if value is None:
        return ""
    text = str(value)
    return '"' + text.replace('"', '""') + '"' if any(c in text for c in ',"\n') else text


def write_csv(path: Path, header: list[str], rows: list[tuple], bom: bool = False, crlf: bool = True) -> None:
    end = "\r\n" if crlf else "\n"
    text = end.join(",".join(csv_field(v) for v in row) for row in [tuple(header), *rows]) + end
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(("\ufeff" if bom else "").encode() + text.encode("utf-8"))


COUNTRY_HEADER = ["code", "name", "currency", "population", "joined", "updated_at", "updated_ms", "notes"]


def countries(n: int) -> list[tuple]:
    """n countries: accents, commas, quotes, newlines in names and notes; nulls; dates and
    timestamps; epoch millis."""
    out = [("FR", "France, République", "EUR", 68_042_591, "1958-01-01", "2024-03-01T09:30:00", 1709285400000, 'says "bonjour"'),
           ("DE", "Deutschland", "EUR", 84_358_845, "1958-01-01", "2024-03-01 09:30:00.125", 1709285400125, "two\nlines"),
           ("CH", "Schweiz / Suisse / Svizzera", "CHF", 8_815_385, None, "2024-03-02T00:00:00", 1709337600000, None)]
    for i in range(n - len(out)):
        out.append((f"X{i:04d}", f"Ĺand {i}, ñ", CURRENCIES[i % len(CURRENCIES)], 1000 + i * 7, f"20{i % 24:02d}-0{1 + i % 9}-1{i % 10}",
                    f"2024-03-0{1 + i % 9}T1{i % 10}:0{i % 6}:00", 1709285400000 + i, None if i % 5 else f"note {i}"))
    return out


def fx(days: int) -> list[tuple]:
    return [(c, f"2024-03-{d:02d}", f"{1 + (i + 1) * 0.0123456 + d / 1000:.6f}") for i, c in enumerate(CURRENCIES) for d in range(1, days + 1)]


def seeded_project(tmp_path: Path, n: int = 3000) -> Path:
    root = project(tmp_path, {"seeds/seeds.yml": SEEDS_YML, "tables/eu_orders.sql": ORDERS_SQL})
    write_csv(root / "seeds/geo/country_codes.csv", COUNTRY_HEADER, countries(n), bom=True)
    write_csv(root / "seeds/fx_rates.csv", ["currency", "day", "rate"], fx(28), crlf=False)
    return root


def ok(capsys, root: Path, *args: str) -> str:
    code, out, err = pipe(capsys, root, *args)
    assert code == 0, f"pipe {' '.join(args)} exited {code}\n{out}\n{err}"
    assert_clean(out, err)
    return out


def instants(capsys, root: Path, table: str) -> list[str]:
    return [i["instant"] for i in commits(timeline(capsys, root, table))]


# --- reading a CSV (no Spark) ------------------------------------------------------------------


def test_parse_reads_rfc4180_quotes_newlines_and_tells_null_from_empty():
    text = 'id,name,note\n1,"Paris, France","say ""hi""\nthere"\n\n2,,""\n3,Zürich,x'
    p = parse(text)
    assert [n for n, _ in p.header] == ["id", "name", "note"]
    assert p.rows == [(2, ["1", "Paris, France", 'say "hi"\nthere']), (5, ["2", None, ""]), (6, ["3", "Zürich", "x"])]
    assert parse("a;b\n1;2,5\n", ";").rows == [(2, ["1", "2,5"])]
    with pytest.raises(SeedFileError) as info:
        parse('a,b\n1,"open\n2,3\n')
    assert (info.value.line, info.value.col) == (2, 3)
    with pytest.raises(SeedFileError, match="quote inside an unquoted value"):
        parse('a,b\n1,ab"c\n')


@pytest.mark.parametrize("values, expected", [
    (["1", "-42", "1709285400000", None], "bigint"),
    (["007", "12"], "string"),  # a code with a leading zero keeps it
    (["1.25", "12", "-0.5"], "decimal(4,2)"),
    (["1.5e3", "2"], "double"),
    (["true", "False", None], "boolean"),
    (["2024-03-01", "1999-12-31"], "date"),
    (["2024-02-30"], "string"),
    (["2024-03-01T09:30:00", "2024-03-01 09:30:00.125Z", "2024-03-02"], "timestamp"),
    ([None, None], "string"),
    (["1", "yes"], "string"),
    (["9" * 40], "double"),
])
def test_undeclared_column_types_are_inferred_from_the_values(values, expected):
    assert infer_type(values) == expected


# --- compile ------------------------------------------------------------------------------------


def test_a_seed_is_a_table_step_whose_fingerprint_holds_the_files_sha256(tmp_path):
    root = seeded_project(tmp_path, n=50)
    plan = compile_project(root).plan
    step = plan.step("table.country_codes")
    assert step.kind == "write" and step.action == "replacecommit" and step.sql is None
    seed = step.config["seed"]
    assert seed["file"] == "seeds/geo/country_codes.csv" and seed["rows"] == 50
    assert {c["name"]: c["type"] for c in seed["columns"]} == {
        "code": "string", "name": "string", "currency": "string", "population": "bigint", "joined": "date",
        "updated_at": "timestamp", "updated_ms": "bigint", "notes": "string"}
    assert plan.step("table.fx_rates").config["seed"]["columns"][2] == {"name": "rate", "type": "decimal(12,6)"}
    assert plan.step("table.eu_orders").depends_on == ("table.country_codes", "table.fx_rates")
    assert {s.id for s in plan.steps if s.kind == "test"} >= {"test.unique_country_codes_code", "test.not_null_fx_rates_rate"}
    # an edit of the file changes the fingerprint; an edit of the description does not
    before = step.fingerprint
    (root / "seeds/seeds.yml").write_text((root / "seeds/seeds.yml").read_text().replace("kept by finance", "kept by treasury"))
    assert compile_project(root).plan.step("table.country_codes").fingerprint == before
    with (root / "seeds/geo/country_codes.csv").open("ab") as f:
        f.write(b"ZZ,Zed,EUR,1,2024-01-01,2024-01-01T00:00:00,1,\r\n")
    assert compile_project(root).plan.step("table.country_codes").fingerprint != before


def test_mistakes_in_seeds_are_reported_at_file_and_line_with_a_hint(tmp_path):
    root = project(tmp_path, {
        "sources/s.yml": """
            sources:
              rates:
                kind: files
                path: data/r
                format: json
            """,
        "tables/orders.sql": "select 1 as id",
        "seeds/seeds.yml": """
            seeds:
              typed:
                key: [id]
                column_types: {id: INT, amount: "DECIMAL(5,2)", day: DATE, nope: INT, tags: "ARRAY<STRING>"}
              ghost:
                description: no file
              events:
                key: [at]
            """,
    })
    files = {
        "typed.csv": b"id,amount,day,tags\n1,1.50,2024-01-01,a\n2,1.239,2024-01-02,b\n3,12345.1,2024-13-01,c\n01,2.00,2024-01-03,d\n",
        "events.csv": b"at,what\n2024-03-01T10:00:00Z,a\n2024-03-01 10:00:00+00:00,b\n",
        "ragged.csv": b'a,b,c\n1,2,3\n4,5\n"x, y",6,7\n',
        "empty.csv": b"",
        "dup_header.csv": b"id,Name,name\n1,a,b\n",
        "bad_header.csv": b"id,unit price\n1,2\n",
        "orders.csv": b"id\n1\n",
        "rates.csv": b"id\n1\n",
        "latin1.csv": "id,name\n1,Zürich\n".encode("latin-1"),
        "bad_quote.csv": b'id,name\n1,"never closed\n',
    }
    for name, data in files.items():
        (root / "seeds" / name).write_bytes(data)
    (root / "seeds/big.csv").write_bytes(b"id,text\n" + b"1,xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\n" * (1_100_000))
    said = compile_errors(root)
    text = "\n".join(str(d) for d in said)

    def at(file, line, *words):
        found = [d for d in said if (d.location.file, d.location.line) == (file, line) and all(w in str(d) for w in words)]
        assert found, f"nothing at {file}:{line} saying {words}\n{text}"
        assert found[0].hint, found[0]

    at("seeds/typed.csv", 3, "'1.239'", "amount", "decimal(5,2)", "more than 2 digits after the point")
    at("seeds/typed.csv", 4, "'2024-13-01'", "day", "date")
    at("seeds/seeds.yml", 4, "column_types", "'nope'")
    at("seeds/typed.csv", 5, "duplicate key", "id='01'", "line 2")  # 01 and 1 are one INT
    at("seeds/events.csv", 3, "duplicate key", "line 2")  # one instant, written two ways
    at("seeds/ragged.csv", 3, "2 fields", "header has 3")
    at("seeds/empty.csv", 1, "empty", "header")
    at("seeds/dup_header.csv", 1, "'name' twice")
    at("seeds/bad_header.csv", 1, "'unit price' is not a valid column name")
    at("seeds/seeds.yml", 5, "ghost", "no seeds/**/ghost.csv")
    at("seeds/latin1.csv", 2, "not UTF-8")
    at("seeds/bad_quote.csv", 2, "never closed")
    at("seeds/big.csv", 1, "larger than 50 MB", "kind: files")
    at("seeds/orders.csv", 1, "seed 'orders'", "table 'orders'")
    at("seeds/rates.csv", 1, "seed 'rates'", "source 'rates'")
    at("seeds/seeds.yml", 4, "'tags'", "array<string>", "cannot hold")
    at("seeds/typed.csv", 4, "'12345.1'", "more than 3 digits before the point")


def test_a_seed_file_that_is_a_link_is_refused(tmp_path):
    root = project(tmp_path, {"tables/t.sql": "select 1 as id"})
    (root / "seeds").mkdir()
    secret = tmp_path / "secret.csv"
    secret.write_text("token\nabc\n")
    (root / "seeds/leak.csv").symlink_to(secret)
    errors = compile_errors(root)
    assert any(d.location.file == "seeds/leak.csv" and "symbolic link" in d.message for d in errors), errors


# --- run ----------------------------------------------------------------------------------------


def test_seeds_load_only_when_changed_and_a_change_replaces_the_table_whole(spark, tmp_path, capsys):
    root = seeded_project(tmp_path)
    rows = countries(3000)

    # round 1: pipe build loads both seeds, runs their tests, then the table reading them
    out = ok(capsys, root, "build")
    s = steps(root)
    assert s["table.country_codes"]["state"] == "success" and s["table.country_codes"]["rows_written"] == 3000
    assert s["test.unique_country_codes_code"]["state"] == "success" and s["test.unique_fx_rates_currency_day"]["state"] == "success"
    assert s["table.eu_orders"]["state"] == "success"
    first = instants(capsys, root, "country_codes")
    assert len(first) == 1 and commits(timeline(capsys, root, "country_codes"))[0]["action"] == "replacecommit"
    cols = ["code", "name", "currency", "population", "joined", "updated_at", "updated_ms", "notes"]
    stored = pipe_rows(spark, root, "country_codes", cols)
    assert len(stored) == 3000
    fr = next(r for r in stored if r[0] == "FR")
    assert fr[1] == "France, République" and fr[3] == 68_042_591 and fr[4] == dt.date(1958, 1, 1)
    assert fr[5] == dt.datetime(2024, 3, 1, 9, 30) and fr[6] == 1709285400000 and fr[7] == 'says "bonjour"'
    de = next(r for r in stored if r[0] == "DE")
    assert de[5] == dt.datetime(2024, 3, 1, 9, 30, 0, 125000) and de[7] == "two\nlines"
    assert next(r for r in stored if r[0] == "CH")[4] is None
    # hudi-rs reads the same rows
    hrs = hudi_rows(root, "country_codes", ["code", "name", "population", "updated_ms", "notes"])
    assert hrs == sorted((r[0], r[1], r[3], r[6], r[7]) for r in stored)
    rates = {(c, d): Decimal(r) for c, d, r in fx(28)}
    assert hudi_rows(root, "fx_rates", ["currency", "day", "rate"]) == sorted((c, dt.date.fromisoformat(d), r) for (c, d), r in rates.items())
    assert sorted(p.name for p in (root / "lake/fx_rates").glob("currency=*")) == sorted(f"currency={c}" for c in CURRENCIES)
    eu = pipe_rows(spark, root, "eu_orders", ["code", "rate"])
    assert ("FR", rates["EUR", "2024-03-01"]) in eu and ("CH", rates["CHF", "2024-03-01"]) in eu and len(eu) == 3000

    # round 2: nothing changed: nothing written, and the step says since which commit
    out = ok(capsys, root, "run")
    assert steps(root)["table.country_codes"]["state"] == "no_input"
    assert f"unchanged since commit {first[0]}" in out
    assert instants(capsys, root, "country_codes") == first

    # round 3: rows edited, added and removed: one replacecommit, the removed rows are gone
    rows = [r for r in rows if not r[0].startswith("X00")]  # 100 rows removed
    rows = [("FR", "France", *r[2:]) if r[0] == "FR" else r for r in rows]
    rows += [("NZ", "Aotearoa, New Zealand", "NZD", 5_223_100, "2024-01-01", "2024-03-03T00:00:00", 1709424000000, "kia ora")]
    write_csv(root / "seeds/geo/country_codes.csv", COUNTRY_HEADER, rows)
    out = ok(capsys, root, "seed")
    assert set(steps(root)) == {"table.country_codes", "table.fx_rates"}  # pipe seed: only the seeds
    assert steps(root)["table.fx_rates"]["state"] == "no_input"
    assert "seeds/geo/country_codes.csv changed since commit" in out
    third = instants(capsys, root, "country_codes")
    assert len(third) == 2 and third[0] == first[0]
    now = hudi_rows(root, "country_codes", ["code", "name"])
    assert len(now) == 2901 and ("FR", "France") in now and ("NZ", "Aotearoa, New Zealand") in now
    assert not any(code.startswith("X00") for code, _ in now)

    # round 4: a declared type and the key change: the table is written again with them
    (root / "seeds/seeds.yml").write_text((root / "seeds/seeds.yml").read_text().replace(
        "key: [code]", "key: [code, currency]\n    column_types: {population: DOUBLE}"))
    ok(capsys, root, "seed", "--select", "seed:country_codes")
    assert set(steps(root)) == {"table.country_codes"}
    assert steps(root)["table.country_codes"]["state"] == "success"
    assert pipe_rows(spark, root, "country_codes", ["code", "population"])[0] == ("CH", 8_815_385.0)

    # round 5: unchanged again: no write
    before = instants(capsys, root, "country_codes")
    ok(capsys, root, "seed")
    assert instants(capsys, root, "country_codes") == before


def test_a_seed_edited_after_compile_is_refused_until_compiled_again(spark, tmp_path, capsys):
    root = project(tmp_path, {"seeds/tiny.csv": "id,label\n1,one\n2,two\n"})
    ok(capsys, root, "compile")
    (root / "seeds/tiny.csv").write_text("id,label\n1,uno\n")
    code, out, err = pipe(capsys, root, "seed", "--plan", str(root / "target/plan.json"))
    assert code == 1
    assert_clean(out, err)
    text = out + err
    assert "seeds/tiny.csv changed after the plan was compiled" in text and "compile again" in text
    assert not (root / "lake/tiny/.hoodie").exists() or not commits(timeline(capsys, root, "tiny"))
    ok(capsys, root, "seed")
    assert pipe_rows(spark, root, "tiny", ["id", "label"]) == [(1, "uno")]
    # loaded, then edited after a compile: the plan's table is there, but the file is not the plan's
    ok(capsys, root, "compile")
    (root / "seeds/tiny.csv").write_text("id,label\n1,un\n")
    code, out, err = pipe(capsys, root, "seed", "--plan", str(root / "target/plan.json"))
    assert code == 1 and "seeds/tiny.csv changed after the plan was compiled" in out + err, out + err
    ok(capsys, root, "seed")
    assert pipe_rows(spark, root, "tiny", ["id", "label"]) == [(1, "un")]


def test_seeds_show_in_ls_docs_and_diff(tmp_path, capsys):
    root = seeded_project(tmp_path, n=20)
    out = ok(capsys, root, "ls", "--select", "resource_type:seed", "--exclude", "resource_type:test")
    assert out.split() == ["table.country_codes", "table.fx_rates"]
    out = ok(capsys, root, "ls", "--select", "path:seeds/geo/country_codes.csv", "--output", "json")
    assert json.loads(out.splitlines()[0])["id"] == "table.country_codes"
    ok(capsys, root, "compile")
    (root / "base").mkdir()
    (root / "target/plan.json").rename(root / "base/plan.json")
    with (root / "seeds/geo/country_codes.csv").open("ab") as f:
        f.write("ZZ,Zèd,EUR,1,2024-01-01,2024-01-01T00:00:00,1,\r\n".encode())
    code, out, err = pipe(capsys, root, "diff", str(root / "base/plan.json"))
    assert code == 1, out + err
    assert_clean(out, err)
    assert "table.country_codes  modified destructive" in out, out
    assert "seeds/geo/country_codes.csv (20 rows, sha256" in out and "(21 rows, sha256" in out and "replaces its table whole" in out
    assert "table.eu_orders  indirect" in out
    # pipe docs: a page for the seed with its description and columns
    ok(capsys, root, "docs", "generate", "--no-lake")
    pages = {p.name: p.read_text(encoding="utf-8") for p in (root / "target").rglob("*.html")}
    page = next(text for name, text in pages.items() if "fx_rates" in name)
    assert "Daily exchange rates, kept by finance." in page and "ISO 4217 code." in page
    assert "rows from the seed seeds/fx_rates.csv (336 rows" in page

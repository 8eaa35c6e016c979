"""Strict sources: a value that does not fit the declared schema stops the step before anything is
written, naming file, line, column and value; `on_bad_record: drop` leaves such records out and
counts them; a null precombine value is refused."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from tests.test_run import assert_clean, assert_rows, commits, pipe, project, run_ok, run_results, steps, timeline, write_jsonl

ORDERS = """
    sources:
      raw_orders:
        kind: files
        path: data/orders
        format: json
        schema: "order_id BIGINT, amount DOUBLE, order_date DATE, updated_at TIMESTAMP"
    """
ORDERS_TABLE = {
    "tables/orders.yml": "tables:\n  orders:\n    key: [order_id]\n    partition_by: [order_date]\n    precombine: updated_at\n",
    "tables/orders.sql": "select * from {{ source('raw_orders') }}\n",
}


def _orders(tmp_path: Path, source: str = ORDERS) -> Path:
    return project(tmp_path, {"sources/orders.yml": source, **ORDERS_TABLE})


def _fails(capsys, root: Path, step: str = "table.orders") -> dict:
    code, out, err = pipe(capsys, root, "run")
    assert code == 1, out + err
    assert_clean(out, err)
    result = steps(root)[step]
    assert result["state"] == "error"
    assert result["message"] in err
    return result


def test_values_that_do_not_fit_their_json_type_stop_the_step_with_file_line_column_and_value(spark, tmp_path, capsys):
    root = _orders(tmp_path)
    write_jsonl(root / "data/orders/orders-0001.json", [
        {"order_id": 1, "amount": 10.5, "order_date": "2024-01-01", "updated_at": "2024-01-01T10:00:00"},
        {"order_id": 2, "amount": None, "order_date": "2024-01-01", "updated_at": "2024-01-01T10:00:00"},  # a null is a null
    ], mtime=1_700_000_000)
    run_ok(capsys, root)
    before = timeline(capsys, root, "orders")
    (root / "data/orders/orders-0002.json").write_text("\n".join([
        '{"order_id": 3, "amount": 1.0, "order_date": "2024-01-02", "updated_at": "2024-01-02T10:00:00"}',
        '{"order_id": 4, "amount": "abc", "order_date": "2024-01-02", "updated_at": "2024-01-02T10:00:00"}',
        '',
        '{"order_id": 5, "amount": 2.0, "order_date": "2024-13-45", "updated_at": "2024-01-02T10:00:00"}',
        '{"order_id": 6, "amount": 3.0, "order_date": "2024-01-02", "updated_at": "yesterday"}',
        '[{"order_id": 8, "amount": 8.0, "order_date": "2024-01-02", "updated_at": "2024-01-02T10:00:00"}, '
        '{"order_id": 9, "amount": "x", "order_date": "2024-01-02", "updated_at": "2024-01-02T10:00:00"}]',  # an array: two records
    ]) + "\n", encoding="utf-8")

    step = _fails(capsys, root)
    where = "data/orders/orders-0002.json"
    assert step["message"] == (f"source raw_orders: 4 records of the new files do not fit the declared schema: "
                               f'{where} line 2: column amount: "abc" is not a DOUBLE; '
                               f'{where} line 4: column order_date: "2024-13-45" is not a DATE; '
                               f'{where} line 5: column updated_at: "yesterday" is not a TIMESTAMP; '
                               f'{where} line 6 record 2: column amount: "x" is not a DOUBLE')
    assert "checkpoint did not move" in step["hint"] and "dateFormat" in step["hint"] and "on_bad_record: drop" in step["hint"]
    assert timeline(capsys, root, "orders") == before  # no instant, the checkpoint where it was
    assert not any("HIVE_DEFAULT" in p.name for p in (root / "lake/orders").iterdir())
    assert_rows(spark, root, "orders", ["order_id", "amount"], [(1, 10.5), (2, None)])

    # drop: the bad records are left out and counted, the good one of the same file is written
    (root / "sources/orders.yml").write_text(textwrap.dedent(ORDERS).replace("    schema:", "    on_bad_record: drop\n    schema:"), encoding="utf-8")
    out, err = run_ok(capsys, root)
    step = steps(root)["table.orders"]
    assert step["rows_read"] == 2
    assert step["inputs"]["raw_orders"]["bad_records_dropped"] == 4
    assert step["inputs"]["raw_orders"]["bad_record_samples"][0] == f'{where} line 2: column amount: "abc" is not a DOUBLE'
    assert f'raw_orders: 4 bad record(s) dropped (on_bad_record: drop), e.g. {where} line 2: column amount: "abc" is not a DOUBLE' in step["message"]
    assert_rows(spark, root, "orders", ["order_id", "amount"], [(1, 10.5), (2, None), (3, 1.0), (8, 8.0)])


CSV_SOURCE = """
    sources:
      raw_products:
        kind: files
        path: data/products
        format: csv
        options: {header: true}
        schema: "product_id BIGINT, name STRING, price DOUBLE"
    """


def test_csv_bad_values_and_short_or_long_rows_stop_an_overwrite_before_it_replaces_the_table(spark, tmp_path, capsys):
    root = project(tmp_path, {
        "sources/products.yml": CSV_SOURCE,
        "tables/products.yml": "tables:\n  products:\n    key: [product_id]\n    operation: insert_overwrite_table\n",
        "tables/products.sql": "select * from {{ source('raw_products') }}\n",
    })
    (root / "data/products").mkdir(parents=True)
    (root / "data/products/p1.csv").write_text("product_id,name,price\n1,Desk,100.0\n2,Lamp,\n", encoding="utf-8")  # an empty field is a null
    run_ok(capsys, root)
    assert_rows(spark, root, "products", ["product_id", "name", "price"], [(1, "Desk", 100.0), (2, "Lamp", None)])
    before = timeline(capsys, root, "products")

    (root / "data/products/p2.csv").write_text("product_id,name,price\n6,Chair,abc\n7,Short\n8,Long,1.0,extra\n9,Stool,5\n", encoding="utf-8")
    step = _fails(capsys, root, "table.products")
    assert step["message"] == ("source raw_products: 3 records of the new files do not fit the declared schema: "
                               'data/products/p2.csv line 2: column price: "abc" is not a DOUBLE; '
                               "data/products/p2.csv line 3: fewer fields than the 3 declared; quoting is the likely cause: 7,Short; "
                               "data/products/p2.csv line 4: more fields than the 3 declared; quoting is the likely cause: 8,Long,1.0,extra")
    assert timeline(capsys, root, "products") == before
    assert_rows(spark, root, "products", ["product_id", "name", "price"], [(1, "Desk", 100.0), (2, "Lamp", None)])


def test_one_bad_record_among_many_files_names_its_own_file_and_line(spark, tmp_path, capsys):
    root = _orders(tmp_path)
    good = {"order_id": 1, "amount": 1.0, "order_date": "2024-01-01", "updated_at": "2024-01-01T10:00:00"}
    for i in range(6):
        rows = [{**good, "order_id": i * 100 + j} for j in range(50)]
        if i == 4:
            rows[37]["amount"] = "12,5"
        write_jsonl(root / f"data/orders/orders-{i:04d}.json", rows)
    step = _fails(capsys, root)
    assert step["message"] == 'source raw_orders: data/orders/orders-0004.json line 38: column amount: "12,5" is not a DOUBLE'
    assert not (root / "lake/orders/.hoodie").exists() or commits(timeline(capsys, root, "orders")) == []


def test_multiline_json_names_the_record_and_parquet_type_mismatch_names_file_and_column(spark, tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = project(tmp_path, {
        "sources/s.yml": """
            sources:
              raw_docs: {kind: files, path: data/docs, format: json, options: {multiLine: true}, schema: "doc_id BIGINT, pages INT"}
              pq: {kind: files, path: data/pq, format: parquet, schema: "k BIGINT, amount BIGINT"}
              quoted: {kind: files, path: data/quoted, format: csv, options: {multiLine: true}, schema: "q_id BIGINT, note STRING, n INT"}
            """,
        "tables/notes.yml": "tables:\n  notes:\n    key: [q_id]\n",
        "tables/notes.sql": "select q_id, note from {{ source('quoted') }}\n",  # n is checked although the SQL does not read it
        "tables/docs.yml": "tables:\n  docs:\n    key: [doc_id]\n",
        "tables/docs.sql": "select * from {{ source('raw_docs') }}\n",
        "tables/pqt.yml": "tables:\n  pqt:\n    key: [k]\n",
        "tables/pqt.sql": "select * from {{ source('pq') }}\n",
    })
    (root / "data/docs").mkdir(parents=True)
    (root / "data/docs/many.json").write_text('[{"doc_id": 1, "pages": 3},\n {"doc_id": 2, "pages": "many"}]\n', encoding="utf-8")
    (root / "data/pq").mkdir(parents=True)
    pq.write_table(pa.table({"k": pa.array([1], pa.int32()), "amount": pa.array([5], pa.int32())}), root / "data/pq/ok.parquet")  # widened: fine
    pq.write_table(pa.table({"k": pa.array([2], pa.int64()), "amount": ["abc"]}), root / "data/pq/bad.parquet")
    (root / "data/quoted").mkdir(parents=True)  # multiLine CSV: a record spans lines, and is named by its first
    (root / "data/quoted/q.csv").write_text('1,"two\nlines",3\n2,plain,many\n', encoding="utf-8")
    code, out, err = pipe(capsys, root, "run")
    assert code == 1, out + err
    assert_clean(out, err)
    by_id = steps(root)
    assert by_id["table.docs"]["message"] == 'source raw_docs: data/docs/many.json record 2: column pages: "many" is not an INT'
    assert by_id["table.pqt"]["message"] == "source pq: data/pq/bad.parquet: column amount holds STRING values, but the source declares BIGINT"
    assert by_id["table.notes"]["message"] == 'source quoted: data/quoted/q.csv line 3: column n: "many" is not an INT'  # the record's first line
    assert not (root / "lake/docs").exists() and not (root / "lake/pqt").exists() and not (root / "lake/notes").exists()

    (root / "data/pq/bad.parquet").unlink()
    (root / "data/quoted/q.csv").write_text('1,"two\nlines",3\n2,plain,\n', encoding="utf-8")
    (root / "data/docs/many.json").write_text('[{"doc_id": 1, "pages": 3},\n {"doc_id": 2, "pages": null}]\n', encoding="utf-8")
    run_ok(capsys, root)
    assert_rows(spark, root, "docs", ["doc_id", "pages"], [(1, 3), (2, None)])
    assert_rows(spark, root, "pqt", ["k", "amount"], [(1, 5)])
    assert_rows(spark, root, "notes", ["q_id", "note"], [(1, "two\nlines"), (2, "plain")])


def test_a_null_precombine_value_is_refused_before_anything_is_committed(spark, tmp_path, capsys):
    root = _orders(tmp_path)
    write_jsonl(root / "data/orders/orders-0001.json", [
        {"order_id": 1, "amount": 1.0, "order_date": "2024-01-01", "updated_at": "2024-01-01T10:00:00"}], mtime=1_700_000_000)
    run_ok(capsys, root)
    before = commits(timeline(capsys, root, "orders"))
    write_jsonl(root / "data/orders/orders-0002.json", [
        {"order_id": 1, "amount": 2.0, "order_date": "2024-01-01", "updated_at": None},
        {"order_id": 7, "amount": 2.0, "order_date": "2024-01-01", "updated_at": "2024-01-02T10:00:00"}])
    step = _fails(capsys, root)
    assert "table orders: 1 row(s) have a null precombine value (column updated_at), e.g. key 1" in step["message"]
    assert "coalesce(updated_at, ...)" in step["message"]
    assert commits(timeline(capsys, root, "orders")) == before
    assert_rows(spark, root, "orders", ["order_id", "amount"], [(1, 1.0)])
    assert run_results(root)["success"] is False

    # the table says how to treat it: a null orders lowest, so it loses to the stored version
    (root / "tables/orders.yml").write_text(ORDERS_TABLE["tables/orders.yml"] + "    precombine_nulls: lowest\n", encoding="utf-8")
    run_ok(capsys, root)
    assert_rows(spark, root, "orders", ["order_id", "amount"], [(1, 1.0), (7, 2.0)])


def test_on_bad_record_and_precombine_nulls_are_checked_by_compile(project):
    from tests.conftest import compile_errors

    root = project({
        "sources/s.yml": "sources:\n  s: {kind: files, path: d, format: json, on_bad_record: skip}\n",
        "tables/t.yml": "tables:\n  t:\n    key: [id]\n    precombine_nulls: lowest\n",
        "tables/t.sql": "select * from {{ source('s') }}\n",
    })
    errors = [str(e) for e in compile_errors(root)]
    assert any("sources/s.yml:2" in e and "on_bad_record" in e and "drop" in e for e in errors), errors
    assert any("tables/t.yml:4" in e and "precombine_nulls but has no precombine" in e for e in errors), errors


def test_lines_are_numbered_as_an_editor_counts_them_whatever_the_line_ends_and_compression():
    import gzip

    from runtime.sources.records import split_text

    def lines(body: bytes, name: str = "f.csv", header: bool = False, line_sep: str | None = None):
        nums, texts, heads = split_text(body, name, False, header, None, line_sep)
        return list(zip(nums.to_pylist(), texts.to_pylist(), heads.to_pylist()))

    text = "\ufeffid,name\r\n1,a\r\n\r\n  \r\n2,b"
    assert lines(text.encode()) == [(1, "id,name", False), (2, "1,a", False), (5, "2,b", False)]
    assert lines(gzip.compress(text.encode()), "f.csv.gz", header=True) == [(1, "id,name", True), (2, "1,a", False), (5, "2,b", False)]
    assert lines(b"a|b||c", line_sep="|") == [(1, "a", False), (2, "b", False), (4, "c", False)]


def test_a_file_read_in_small_pieces_is_numbered_as_when_read_at_once():
    """Large files are read in pieces (memory stays bounded): a piece may end inside a line,
    between \\r and \\n, or inside a multi-byte character, and the lines stay the same."""
    import gzip
    import io

    from runtime.sources.records import split_stream

    text = "\ufeffid,name\r\n" + "".join(f"{i},caf\u00e9 \u2603 {i}\r\n" + ("\r\n" if i % 7 == 0 else "") for i in range(1, 400)) + "400,last"
    for body, name, sep in ((text.encode(), "f.csv", None), (gzip.compress(text.encode()), "f.csv.gz", None),
                            (text.replace("\r\n", "|").encode(), "f.csv", "|")):
        expected = None
        for chunk in (1 << 20, 7, 64, 1000):
            parts = list(split_stream(io.BytesIO(body), name, False, True, None, sep, chunk_bytes=chunk))
            got = [(n, t, h) for nums, texts, heads in parts for n, t, h in zip(nums.to_pylist(), texts.to_pylist(), heads.to_pylist())]
            expected = expected or got
            assert got == expected, (name, sep, chunk)
        assert expected[0] == (1, "id,name", True) and expected[-1][1] == "400,last"
        assert [h for *_, h in expected].count(True) == 1
        assert expected[-1][0] == 1 + 399 + 399 // 7 + 1  # header, data lines, blank lines (counted), the last line


PLANS_SOURCE = """
    sources:
      raw_plans:
        kind: files
        path: data/plans
        format: csv
        options: {header: true%s}
        schema: "plan_id BIGINT, customer STRING, note STRING, monthly_fee DECIMAL(10,2), updated_at BIGINT"
    """
PLANS_TABLE = {
    "tables/plans.yml": "tables:\n  plans:\n    key: [plan_id]\n    precombine: updated_at\n",
    "tables/plans.sql": "select * from {{ source('raw_plans') }}\n",
}


def _write_csv(path: Path, rows: list[tuple]) -> None:
    """As Python's csv module (and Excel) write it: \\r\\n line ends, `"` quotes, `""` inside them."""
    import csv

    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["plan_id", "customer", "note", "monthly_fee", "updated_at"])
        writer.writerows(rows)


def test_a_csv_written_by_pythons_csv_module_is_read_exactly_quotes_commas_line_breaks_and_accents(spark, tmp_path, capsys):
    from decimal import Decimal

    root = project(tmp_path, {"sources/plans.yml": PLANS_SOURCE % "", **PLANS_TABLE})
    one_line = [
        (1001, 'Zoë "the books" Müller', 'likes "books", maps', Decimal("12.50"), 1_700_000_000_123),
        (1002, "Ana, Inc.", "", Decimal("0.99"), 1_700_000_000_456),  # an empty field is a null
        (1003, 'Ōtsuka ""Café""', 'a lone " quote', Decimal("-3.10"), 1_700_000_001_000),
        (1004, "plain", "naïve façade", Decimal("99999999.99"), 1_700_000_002_000),
    ]
    _write_csv(root / "data/plans/plans-0001.csv", one_line)
    run_ok(capsys, root)
    expected = [(r[0], r[1], r[2] or None, r[3]) for r in one_line]
    assert_rows(spark, root, "plans", ["plan_id", "customer", "note", "monthly_fee"], expected)

    # line breaks inside quoted fields: `multiLine: true`, lines still numbered for messages
    (root / "sources/plans.yml").write_text(textwrap.dedent(PLANS_SOURCE % ", multiLine: true"), encoding="utf-8")
    multi = [
        (2001, 'Renée "RJ" Jones', 'first line\nsecond, with comma\r\n\nfourth "quoted"', Decimal("10.00"), 1_700_000_100_000),
        (2002, "Łukasz", "one line", Decimal("7.25"), 1_700_000_100_001),
        (1001, 'Zoë "the books" Müller', 'moved\nto "gold"', Decimal("15.75"), 1_700_000_100_002),  # an update of round 1's row
    ]
    _write_csv(root / "data/plans/plans-0002.csv", multi)
    run_ok(capsys, root)
    expected = [e for e in expected if e[0] != 1001] + [r[:4] for r in multi]
    assert_rows(spark, root, "plans", ["plan_id", "customer", "note", "monthly_fee"], expected)


def test_a_csv_with_broken_quoting_names_file_and_line_and_blames_the_quoting_not_the_values(spark, tmp_path, capsys):
    root = project(tmp_path, {"sources/plans.yml": PLANS_SOURCE % "", **PLANS_TABLE})
    _write_csv(root / "data/plans/plans-0001.csv", [(1, "Ann", "ok", "1.00", 1_700_000_000_000)])
    run_ok(capsys, root)
    before = timeline(capsys, root, "plans")
    (root / "data/plans/plans-0002.csv").write_text(
        "plan_id,customer,note,monthly_fee,updated_at\r\n"
        "2,Bob,fine,2.00,1700000000001\r\n"
        '3,"Kim ""books"" Lee",note,3.00,1700000000002\r\n'
        '4,"Lou, unclosed,4.00,1700000000003\r\n'
        "5,Max,a,b,5.00,1700000000004\r\n", encoding="utf-8")
    step = _fails(capsys, root, "table.plans")
    where = "data/plans/plans-0002.csv"
    assert step["message"] == (
        "source raw_plans: 2 records of the new files do not fit the declared schema: "
        f'{where} line 4: unbalanced quotes (a quoted field is not closed); quoting is the likely cause: 4,"Lou, unclosed,4.00,1700000000003; '
        f"{where} line 5: more fields than the 5 declared; quoting is the likely cause: 5,Max,a,b,5.00,1700000000004")
    assert "RFC 4180" in step["hint"] and "escape" in step["hint"] and "multiLine" in step["hint"]
    assert "on_bad_record" not in step["hint"]  # dropping would leave out every quoted record
    assert timeline(capsys, root, "plans") == before


def test_a_files_source_refuses_symbolic_links_to_files_or_folders_naming_the_link(spark, tmp_path, capsys):
    root = _orders(tmp_path)
    good = {"order_id": 1, "amount": 10.5, "order_date": "2024-01-01", "updated_at": "2024-01-01T10:00:00"}
    write_jsonl(root / "data/orders/orders-0001.json", [good])
    outside = tmp_path / "elsewhere"
    write_jsonl(outside / "secret.json", [{**good, "order_id": 666}])
    link = root / "data/orders/orders-0002.json"
    link.symlink_to(outside / "secret.json")
    code, out, err = pipe(capsys, root, "run")
    assert code == 1, out + err
    assert_clean(out, err)
    assert f"source raw_orders: {link} is a symbolic link (to {outside / 'secret.json'})" in err
    assert "copy or move the file" in err
    assert not (root / "lake/orders/.hoodie").exists() or commits(timeline(capsys, root, "orders")) == []

    link.unlink()  # a linked folder, even one whose files are inside the project, is refused the same way
    (root / "data/orders/more").symlink_to(outside)
    code, out, err = pipe(capsys, root, "run")
    assert code == 1 and f"{root / 'data/orders/more'} is a symbolic link" in err, out + err

    (root / "data/orders/more").unlink()
    run_ok(capsys, root)
    assert_rows(spark, root, "orders", ["order_id", "amount"], [(1, 10.5)])


def test_bytes_that_are_not_valid_utf8_make_a_bad_record_named_by_file_and_line_and_drop_leaves_it_out(spark, tmp_path, capsys):
    root = _orders(tmp_path)
    good = '{"order_id": %d, "amount": %s, "order_date": "2024-01-0%d", "updated_at": "2024-01-01T10:00:00"}'
    body = "\n".join([good % (1, "10.5", 1), good % (2, "20.25", 2)]).encode() + b"\n"
    body += b'{"order_id": 3, "amount": 1.0, "order_date": "2024-01-03", "updated_at": "2024-01-01T10:00:00", "note": "Zo\xeb"}\n'
    body += (good % (4, "-3.5", 4)).encode() + b"\n"
    path = root / "data/orders/orders-0001.json"
    path.parent.mkdir(parents=True)
    path.write_bytes(body)
    step = _fails(capsys, root)
    assert step["message"].startswith('source raw_orders: data/orders/orders-0001.json line 3: bytes that are not valid UTF-8: {"order_id": 3,')
    assert "`encoding`" in step["hint"]

    (root / "sources/orders.yml").write_text(textwrap.dedent(ORDERS).replace("    schema:", "    on_bad_record: drop\n    schema:"), encoding="utf-8")
    run_ok(capsys, root)
    inputs = steps(root)["table.orders"]["inputs"]["raw_orders"]
    assert inputs["bad_records_dropped"] == 1 and "line 3: bytes that are not valid UTF-8" in inputs["bad_record_samples"][0]
    assert_rows(spark, root, "orders", ["order_id", "amount"], [(1, 10.5), (2, 20.25), (4, -3.5)])


def test_a_latin1_csv_is_refused_as_utf8_and_read_exactly_once_its_encoding_is_declared(spark, tmp_path, capsys):
    from decimal import Decimal

    root = project(tmp_path, {"sources/plans.yml": PLANS_SOURCE % "", **PLANS_TABLE})
    path = root / "data/plans/plans-0001.csv"
    path.parent.mkdir(parents=True)
    path.write_bytes("plan_id,customer,note,monthly_fee,updated_at\r\n7,Zoë Müller,\"café, crème\",12.50,1700000000123\r\n"
                     "8,Ana,plain,3.00,1700000000124\r\n".encode("latin-1"))
    step = _fails(capsys, root, "table.plans")
    assert step["message"] == ("source raw_plans: data/plans/plans-0001.csv line 2: bytes that are not valid UTF-8: "
                               '7,Zo\ufffd M\ufffdller,"caf\ufffd, cr\ufffdme",12.50,1700000000123')
    (root / "sources/plans.yml").write_text(textwrap.dedent(PLANS_SOURCE % ", encoding: latin1"), encoding="utf-8")
    run_ok(capsys, root)
    assert_rows(spark, root, "plans", ["plan_id", "customer", "note", "monthly_fee"],
                [(7, "Zoë Müller", "café, crème", Decimal("12.50")), (8, "Ana", "plain", Decimal("3.00"))])


def test_a_json_line_with_a_string_longer_than_sparks_limit_says_so_and_how_to_raise_it(spark, tmp_path, capsys):
    source = ORDERS.replace('updated_at TIMESTAMP"', 'updated_at TIMESTAMP, note STRING"')
    root = _orders(tmp_path, source)
    rows = [{"order_id": 1, "amount": 1.25, "order_date": "2024-01-01", "updated_at": "2024-01-01T10:00:00"},
            {"order_id": 2, "amount": 2.5, "order_date": "2024-01-02", "updated_at": "2024-01-02T10:00:00", "note": "x" * 25_000_000}]
    write_jsonl(root / "data/orders/orders-0001.json", rows)
    step = _fails(capsys, root)
    length = len(json.dumps(rows[1]))
    assert step["message"].startswith(
        f"source raw_orders: data/orders/orders-0001.json line 2: a line of {length} characters that Spark's JSON parser refuses: "
        "a string value longer than 20000000 characters (its maxStringLen) is too long; set `maxStringLen` in the source's options "
        'to read longer ones: {"order_id": 2,'), step["message"]

    (root / "sources/orders.yml").write_text(textwrap.dedent(source).replace("    schema:", "    options: {maxStringLen: 30000000}\n    schema:"),
                                             encoding="utf-8")
    run_ok(capsys, root)
    assert_rows(spark, root, "orders", ["order_id", "amount"], [(1, 1.25), (2, 2.5)])


def test_parquet_numbers_too_wide_for_the_declared_type_name_file_and_column_not_an_internal_error(spark, tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq
    from decimal import Decimal

    root = project(tmp_path, {
        "sources/pay.yml": """
            sources:
              raw_payments:
                kind: files
                path: data/payments
                format: parquet
                schema: "payment_id BIGINT, paid_ms BIGINT, fee DECIMAL(12,2), units INT"
            """,
        "tables/payments.yml": "tables:\n  payments:\n    key: [payment_id]\n    precombine: paid_ms\n",
        "tables/payments.sql": "select * from {{ source('raw_payments') }}\n",
    })
    folder = root / "data/payments"
    folder.mkdir(parents=True)
    pq.write_table(pa.table({"payment_id": pa.array([10, 11], pa.int64()), "paid_ms": pa.array([1_700_000_000_123, 1_700_000_000_456], pa.int64()),
                             "fee": pa.array([Decimal("12.50"), None], pa.decimal128(10, 2)), "units": pa.array([3, 4], pa.int16())}),
                   folder / "p-0001.parquet")  # narrower than declared: read
    run_ok(capsys, root)
    assert_rows(spark, root, "payments", ["payment_id", "fee", "units"], [(10, Decimal("12.50"), 3), (11, None, 4)])

    pq.write_table(pa.table({"payment_id": pa.array([12], pa.int64()), "paid_ms": pa.array([1_700_000_001_000], pa.int64()),
                             "fee": pa.array([1250], pa.int64()), "units": pa.array([5], pa.int32())}), folder / "p-0002.parquet")
    step = _fails(capsys, root, "table.payments")
    assert step["message"] == "source raw_payments: data/payments/p-0002.parquet: column fee holds BIGINT values, but the source declares DECIMAL(12,2)"
    (folder / "p-0002.parquet").unlink()
    pq.write_table(pa.table({"payment_id": pa.array([13], pa.int64()), "paid_ms": pa.array([1_700_000_002_000], pa.int64()),
                             "fee": pa.array([Decimal("1.00")], pa.decimal128(12, 2)), "units": pa.array([6], pa.int64())}), folder / "p-0003.parquet")
    step = _fails(capsys, root, "table.payments")
    assert step["message"] == "source raw_payments: data/payments/p-0003.parquet: column units holds BIGINT values, but the source declares INT"
    assert "internal error" not in step["message"] and "bug" not in step["hint"]

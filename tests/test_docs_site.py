"""`pipe docs`: the site generated for the example project and for a generated 1,000-table
project (its graph data, its pages, column lineage), opened in headless Chromium (a node clicked,
its page read, a screenshot kept), and its commits read from a real timeline without Spark."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from compiler.lineage import table_lineage
from pipe.cli import main
from pipe.docs.layout import layered_layout
from tests.chromium import Chromium
from tests.conftest import REPO, TEMPLATE, write_project


def pipe(capsys, root: Path, *args: str) -> tuple[int, str, str]:
    code = main([*args, "--project-dir", str(root)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def generate(capsys, root: Path, *args: str) -> str:
    code, out, err = pipe(capsys, root, "docs", "generate", *args)
    assert code == 0, out + err
    assert "Traceback" not in out + err
    return out


def graph(root: Path) -> dict:
    text = (root / "target/docs/static/graph-data.js").read_text()
    return json.loads(text.removeprefix("window.PIPE_GRAPH = ").rstrip().rstrip(";"))


def page(root: Path, step_id: str) -> str:
    return (root / f"target/docs/nodes/{step_id}.html").read_text()


def text_of(html: str, element_id: str) -> str:
    """The text of the element with that id (tags dropped, blanks squeezed)."""
    m = re.search(rf'<(\w+)[^>]* id="{re.escape(element_id)}"[^>]*>(.*?)</\1>', html, re.S)
    assert m, f"no #{element_id}"
    return " ".join(re.sub(r"<[^>]+>", " ", m.group(2)).split())


def lineage_cell(html: str, column: str) -> str:
    m = re.search(rf'<tr id="col-{column}">(.*?)</tr>', html, re.S)
    assert m, f"no column {column}"
    cell = re.search(r'<td class="lineage">(.*?)</td>', m.group(1), re.S).group(1)
    return " ".join(re.sub(r"<[^>]+>", " ", cell).split())


@pytest.fixture
def shop(tmp_path):
    root = tmp_path / "shop"
    shutil.copytree(TEMPLATE, root, ignore=shutil.ignore_patterns("lake", "target"))
    return root


def _bench_module():
    spec = importlib.util.spec_from_file_location("compile_bench", REPO / "bench" / "compile_bench.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """bench/compile_bench.py's 1,000-table project, its site generated once."""
    root = tmp_path_factory.mktemp("big") / "p"
    stats = _bench_module().generate_project(root, 1000)
    code = main(["docs", "generate", "--project-dir", str(root)])
    assert code == 0
    return root, stats


# --- the example project ---------------------------------------------------------------------------


def test_example_site_has_every_source_and_table_with_its_edges(shop, capsys):
    out = generate(capsys, shop)
    assert "Wrote the docs of shop: 4 tables, 2 sources -> target/docs/index.html" in out
    assert "nothing has been written to the lake yet" in out  # no run yet: the pages say so
    g = graph(shop)
    ids = [n[0] for n in g["nodes"]]
    assert sorted(ids) == ["source.raw_customers", "source.raw_orders", "table.customer_revenue", "table.customers", "table.orders",
                           "table.regions"]
    edges = {(ids[a], ids[b]) for a, b in g["edges"]}
    assert edges == {("source.raw_orders", "table.orders"), ("source.raw_customers", "table.customers"),
                     ("table.orders", "table.customer_revenue"), ("table.customers", "table.customer_revenue")}
    kinds = {n[0]: (n[2], n[3]) for n in g["nodes"]}
    assert kinds["source.raw_orders"] == ("source", "files") and kinds["table.customer_revenue"] == ("table", "insert_overwrite_table")
    x = {n[0]: n[4] for n in g["nodes"]}
    assert x["source.raw_orders"] < x["table.orders"] < x["table.customer_revenue"]  # left to right
    assert all((shop / f"target/docs/nodes/{i}.html").is_file() for i in ids)


def test_the_graph_has_beside_it_a_list_of_every_table_and_source_sorted_by_name(shop, capsys):
    generate(capsys, shop)
    index = (shop / "target/docs/index.html").read_text()
    nav = re.search(r'<nav id="all-nodes".*?</nav>', index, re.S).group(0)
    assert "All 6 sources and tables" in nav and 'id="list-filter"' in nav
    items = re.findall(r'<li data-name="([^"]+)" class="(\w+)"><a href="([^"]+)">', nav)
    assert items == [("customer_revenue", "table", "nodes/table.customer_revenue.html"), ("customers", "table", "nodes/table.customers.html"),
                     ("orders", "table", "nodes/table.orders.html"), ("raw_customers", "source", "nodes/source.raw_customers.html"),
                     ("raw_orders", "source", "nodes/source.raw_orders.html"), ("regions", "table", "nodes/table.regions.html")]
    assert "upsert, copy-on-write" in text_of(index, "node-list")
    assert index.index('<nav id="all-nodes"') < index.index('<svg id="graph"')  # beside the graph, not below it


def _mor_with_quarantine(shop: Path) -> None:
    orders = shop / "tables/orders.yml"
    orders.write_text(orders.read_text().replace("    operation: upsert\n", "    operation: upsert\n    type: merge_on_read\n", 1)
                      .replace("has_customer: {expression: \"customer_id is not null\", action: drop}",
                               "has_customer: {expression: \"customer_id is not null\", action: quarantine}\n"
                               "      amount_known: {expression: \"amount is not null\", action: quarantine}", 1))


def test_merge_on_read_tables_are_drawn_apart_and_quarantine_tables_are_fed_by_their_table(shop, capsys):
    _mor_with_quarantine(shop)
    assert "4 tables, 2 sources" in generate(capsys, shop, "--no-lake")
    g = graph(shop)
    by_id = {n[0]: n for n in g["nodes"]}
    assert by_id["table.orders"][6] == "merge_on_read" and by_id["table.customers"][6] == "copy_on_write"
    assert by_id["source.raw_orders"][6] == ""
    q = by_id["quarantine.orders"]
    assert q[1:4] == ["orders__quarantine", "quarantine", "quarantine"] and q[7] == "nodes/table.orders.html#quarantine"
    ids = [n[0] for n in g["nodes"]]
    assert [ids[b] for a, b in g["edges"] if ids[a] == "table.orders"] == ["table.customer_revenue", "quarantine.orders"]
    assert q[4] > by_id["table.orders"][4]  # right of its table
    index = (shop / "target/docs/index.html").read_text()
    legend = " ".join(re.sub(r"<[^>]+>", " ", re.search(r'<aside class="panel legend">(.*?)</aside>', index, re.S).group(1)).split())
    assert "copy-on-write solid outline" in legend and "merge-on-read dashed outline, marked MOR" in legend and "quarantine" in legend
    assert "All 7 sources and tables" in index and 'href="nodes/table.orders.html#quarantine">orders__quarantine</a>' in index
    assert text_of(page(shop, "table.orders"), "quarantine") == (
        "Rows failing has_customer, amount_known are written to the quarantine table orders__quarantine "
        "(a Hudi table beside this one in the lake, with the column _pipe_failed_expectations ), not to this table.")


def test_a_table_page_shows_its_settings_columns_tests_and_sql(shop, capsys):
    generate(capsys, shop)
    orders = page(shop, "table.orders")
    assert text_of(orders, "key") == "order_id"
    assert text_of(orders, "partitioning") == "region"
    assert text_of(orders, "upstream") == "raw_orders"
    assert text_of(orders, "downstream") == "customer_revenue"
    assert "upsert" in text_of(orders, "operation") and "copy_on_write" in orders
    assert "has_customer" in orders and "customer_id is not null" in orders  # the expectation
    tests = text_of(orders, "tests")
    assert "unique_orders_order_id" in tests and "relationships_orders_customer_id" in tests and "orders_amount_positive" in tests
    assert "from `raw_orders`" in orders  # the rendered SQL
    assert "<code>order_id</code></td>\n    <td>bigint</td>" in orders  # declared types
    assert "Commits are not shown" in orders


def test_column_lineage_of_the_example_follows_columns_through_expressions_and_joins(shop, capsys):
    generate(capsys, shop)
    revenue = page(shop, "table.customer_revenue")
    assert lineage_cell(revenue, "customer_id") == "= customers.customer_id"
    assert lineage_cell(revenue, "orders") == "from orders.order_id"
    assert lineage_cell(revenue, "revenue") == "from orders.amount"
    assert 'href="table.customers.html#col-customer_id"' in revenue
    assert lineage_cell(page(shop, "table.orders"), "amount") == "from raw_orders.amount"
    assert lineage_cell(page(shop, "table.customers"), "email") == "from raw_customers.email"


def test_a_column_that_cannot_be_traced_says_so(tmp_path, capsys):
    root = write_project(tmp_path / "p", {
        "sources/s.yml": """
            sources:
              a: {kind: files, path: data/a, format: json, schema: "id BIGINT, v STRING"}
              b: {kind: files, path: data/b, format: json}
            """,
        "tables/t.yml": "tables:\n  t: {key: [id]}\n",
        # `w` may be a column of b (whose columns are unknown): Spark decides, we do not guess
        "tables/t.sql": "select a.id, a.v, w, (select max(id) from {{ source('a') }}) as top, 1 as one\n"
                        "from {{ source('a') }} a join {{ source('b') }} b on a.id = b.id",
    })
    generate(capsys, root)
    t = page(root, "table.t")
    assert lineage_cell(t, "id") == "= a.id"
    assert lineage_cell(t, "w") == "not traced"
    assert lineage_cell(t, "top") == "not traced"  # a scalar subquery is not followed
    assert lineage_cell(t, "one") == "computed from no column"


@pytest.mark.parametrize("sql, expected", [
    # through a CTE and a rename
    ("with x as (select id as k, v from s) select k, upper(v) as v2 from x", {"k": ([("s", "id")], True), "v2": ([("s", "v")], False)}),
    # a union: each branch at the same position
    ("select id from s union all select id2 from u", {"id": ([("s", "id"), ("u", "id2")], False)}),
    # `*` over known columns, and a qualified star
    ("select * from s", {"id": ([("s", "id")], True), "v": ([("s", "v")], True)}),
    ("select s.*, u.id2 from s join u on s.id = u.id2", {"id": ([("s", "id")], True), "v": ([("s", "v")], True), "id2": ([("u", "id2")], True)}),
    # unqualified over two inputs: found in the one that has it
    ("select v from s join u on s.id = u.id2", {"v": ([("s", "v")], True)}),
    # unqualified over an input of unknown columns and another: not certain
    ("select v from s join x on true", {"v": (None, False)}),
    # an input of unknown columns alone: the name is its own
    ("select q, q + 1 as r from x", {"q": ([("x", "q")], True), "r": ([("x", "q")], False)}),
])
def test_lineage_follows_what_the_sql_says_for_certain(sql, expected):
    got = table_lineage(sql, {"s": ["id", "v"], "u": ["id2"], "x": None})
    assert {c.column: (list(c.inputs) if c.inputs is not None else None, c.direct) for c in got.columns} == expected


def test_lineage_of_a_star_over_unknown_columns_or_bad_sql_is_unknown():
    assert table_lineage("select * from x", {"x": None}).names is None
    assert table_lineage("selec nothing", {}).columns == ()


def test_layout_puts_each_node_one_layer_after_its_longest_path_and_uncrosses_edges():
    nodes = ["a", "b", "c", "d", "x", "y"]
    edges = [("a", "y"), ("b", "x"), ("a", "c"), ("c", "d"), ("b", "d")]
    pos = layered_layout(nodes, edges)
    assert {n: p.layer for n, p in pos.items()} == {"a": 0, "b": 0, "c": 1, "x": 1, "y": 1, "d": 2}
    # in the input order a's children c and y have b's child x between them (a->y crosses b->x);
    # after the sweeps both are on a's side of x
    above = pos["a"].row < pos["b"].row
    assert all((pos[n].row < pos["x"].row) == above for n in ("c", "y"))


def test_select_draws_a_part_and_links_outside_it_are_plain_names(shop, capsys):
    generate(capsys, shop)  # the whole site first: the pages of what is not selected go
    out = generate(capsys, shop, "--select", "+orders")
    assert "1 table, 1 source" in out
    assert sorted(n[0] for n in graph(shop)["nodes"]) == ["source.raw_orders", "table.orders"]
    assert not (shop / "target/docs/nodes/table.customers.html").exists()
    orders = page(shop, "table.orders")
    assert text_of(orders, "downstream") == "customer_revenue"
    assert 'href="table.customer_revenue.html"' not in orders and "--select +orders" in orders


def test_an_unchanged_project_keeps_its_site_and_any_change_makes_it_again(shop, capsys):
    """Without commits (--no-lake), a site made from the same files, selection and pipe is up to
    date: nothing is parsed or written, and the compile's warnings are said again."""
    revenue = shop / "tables/customer_revenue.yml"
    revenue.write_text(revenue.read_text() + "    precombine: customer_id\n")  # a warning: no effect on insert_overwrite_table
    out = generate(capsys, shop, "--no-lake")
    assert out.startswith("Wrote the docs of shop: 4 tables, 2 sources")
    pages = {p.name: p.stat().st_mtime_ns for p in (shop / "target/docs/nodes").iterdir()}

    code, out, err = pipe(capsys, shop, "docs", "generate", "--no-lake")
    assert code == 0 and out.startswith("The docs of shop are up to date (4 tables, 2 sources; the project has not changed)"), out
    assert "precombine has no effect on table 'customer_revenue'" in err
    assert {p.name: p.stat().st_mtime_ns for p in (shop / "target/docs/nodes").iterdir()} == pages

    orders = shop / "tables/orders.yml"
    orders.write_text(orders.read_text().replace("description: >", "description: >\n      Changed for the docs test.", 1))
    assert generate(capsys, shop, "--no-lake").startswith("Wrote the docs")
    assert "Changed for the docs test." in page(shop, "table.orders")
    assert "up to date" in generate(capsys, shop, "--no-lake")

    assert generate(capsys, shop, "--no-lake", "--select", "+orders").startswith("Wrote the docs of shop: 1 table, 1 source")
    assert "up to date (1 table, 1 source" in generate(capsys, shop, "--no-lake", "--select", "+orders")
    (shop / "target/docs/nodes/table.orders.html").unlink()  # a page gone: made again
    assert generate(capsys, shop, "--no-lake", "--select", "+orders").startswith("Wrote the docs")
    assert "Changed for the docs test." in page(shop, "table.orders")
    # with commits, the tables' timelines may have moved without the project changing
    assert generate(capsys, shop).startswith("Wrote the docs")
    assert generate(capsys, shop).startswith("Wrote the docs")


def test_mistakes_are_clear_messages_without_tracebacks(shop, capsys):
    code, out, err = pipe(capsys, shop, "docs", "serve")
    assert code == 2 and "no site in" in err and "pipe docs generate" in err and "Traceback" not in out + err
    code, out, err = pipe(capsys, shop, "docs", "generate", "--select", "ordres")
    assert code == 2 and "orders" in err and "Traceback" not in out + err  # did you mean
    (shop / "tables/orders.yml").write_text("tables:\n  orders:\n    operation: upsrt\n")
    code, out, err = pipe(capsys, shop, "docs", "generate")
    assert code == 2 and "tables/orders.yml" in err and "Traceback" not in out + err
    assert not (shop / "target/docs").exists()


def test_serve_prints_its_url_serves_the_site_and_stops_on_ctrl_c(shop, capsys):
    generate(capsys, shop)
    proc = subprocess.Popen([sys.executable, "-m", "pipe", "docs", "serve", "--port", "0", "--project-dir", str(shop)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**__import__("os").environ, "PYTHONPATH": str(REPO)})
    try:
        line = proc.stdout.readline()
        url = re.search(r"http://127\.0\.0\.1:\d+/", line).group(0)
        with urllib.request.urlopen(url + "nodes/table.orders.html", timeout=10) as r:
            assert b'id="key">order_id<' in r.read()
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    assert "Stopped" in out and "Traceback" not in err


def test_serve_answers_only_requests_addressed_to_localhost(shop, capsys):
    """A page of another site whose name resolves to 127.0.0.1 (DNS rebinding) sends that name
    as Host: it gets 403 and no page."""
    import http.client

    generate(capsys, shop)
    proc = subprocess.Popen([sys.executable, "-m", "pipe", "docs", "serve", "--port", "0", "--project-dir", str(shop)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**__import__("os").environ, "PYTHONPATH": str(REPO)})
    try:
        port = int(re.search(r"http://127\.0\.0\.1:(\d+)/", proc.stdout.readline()).group(1))

        def get(host: str, method: str = "GET") -> tuple[int, bytes]:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.putrequest(method, "/nodes/table.orders.html", skip_host=True)
            conn.putheader("Host", host)
            conn.endheaders()
            r = conn.getresponse()
            body = r.read()
            conn.close()
            return r.status, body

        for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"LocalHost:{port}", f"[::1]:{port}"):
            status, body = get(host)
            assert status == 200 and b'id="key">order_id<' in body, host
        for host in (f"attacker.example:{port}", "attacker.example", f"127.0.0.1.nip.io:{port}", "localhost", f"localhost:{port + 1}", ""):
            status, body = get(host)
            assert status == 403 and b"order_id" not in body, host
        assert get("attacker.example", "HEAD")[0] == 403
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=10)


# --- 1,000 tables ------------------------------------------------------------------------------------


def test_a_thousand_tables_give_a_thousand_pages_and_a_layered_graph(big):
    root, stats = big
    g = graph(root)
    assert len(g["nodes"]) == 1006
    assert len(g["edges"]) == stats.refs + stats.source_calls
    x = [n[4] for n in g["nodes"]]
    assert all(x[a] < x[b] for a, b in g["edges"])  # every edge points right
    assert len({x_ for x_ in x}) == stats.max_depth + 2  # sources, then one column per layer of tables
    assert len(list((root / "target/docs/nodes").glob("*.html"))) == 1006
    sql = (root / "tables/t500.sql").read_text()
    t500 = page(root, "table.t500")
    assert text_of(t500, "key") == "id"
    assert text_of(t500, "upstream").split() == sorted(re.findall(r"ref\('(t\d+)'\)", sql))
    assert lineage_cell(t500, "id") == "= t462.id"


FORKED_DOCS = """
import faulthandler, os, signal, sys
# SIGUSR1 prints every thread's stack on stderr (C's handler, which forked children inherit and
# which answers in a deadlock too, from whichever thread takes the signal): _run_or_dump sends it
# to this process and its children when they hang (one did, in CI at f35b5eb)
faulthandler.register(signal.SIGUSR1, all_threads=True)
from pipe.docs import site
from pipe.cli import main
assert site._single_threaded(), "a process with one thread"
site._workers = lambda: 2
site._FORK_FROM = int(sys.argv[2])
calls, render, parent = [], site._render, os.getpid()

def counted(*args):  # counts the renders of this process (a child's count stays in the child)
    if os.getpid() != parent and sys.argv[3] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)  # a page writer killed (by the OOM killer, say)
    calls.append(1)
    return render(*args)

site._render = counted
code = main(["docs", "generate", "--no-lake", "--project-dir", sys.argv[1]])
print(f"rendered here: {len(calls)}")
sys.exit(code)
"""


def _descendants(pid: int) -> list[int]:
    """The processes `pid` forked, and theirs (Linux' /proc)."""
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children = [int(c) for c in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue
        for child in children:
            out += [child, *_descendants(child)]
    return out


def _run_or_dump(args: list[str], timeout: float, env: dict):
    """subprocess.run(args, capture_output=True, text=True); a process that has not ended after
    `timeout` s (with its children) is asked for every thread's stack (SIGUSR1, which the child
    code gives to faulthandler), then killed: the test fails with the stacks, saying where it hung."""
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for pid in [proc.pid, *_descendants(proc.pid)]:
            try:
                os.kill(pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
            time.sleep(0.5)
        for pid in [*_descendants(proc.pid), proc.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        out, err = proc.communicate()
        pytest.fail(f"hung for {timeout} s; every thread's stack, the parent's and its children's:\n{err[-20000:]}\n{out[-2000:]}")
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def test_pages_written_by_a_process_per_core_equal_those_written_by_one(big, tmp_path):
    """A site of 1,000 pages is rendered by forked processes (site._write_pages) in a `pipe docs
    generate` of one thread; one process writes the same files, byte for byte, and the manifest
    lists each once; so does a generate whose forked children are killed. A process with more
    threads (this test's: pytest's, py4j's) never forks: a child forked while another thread holds
    a lock hangs (one did, in a CI run)."""
    from pipe.docs import site as docs_site

    root, _ = big
    assert docs_site._FORK_FROM <= 1006  # so the first generate below forks, on any number of cores
    assert not docs_site._single_threaded()
    sites = {}
    # forked; forked, its children killed as they start rendering (this process then renders
    # every page itself: no wait for a child that died); one process
    for how, fork_from, renders_here in (("forked", docs_site._FORK_FROM, 0), ("kill", docs_site._FORK_FROM, 1), ("one", 10**9, 1)):
        copy = tmp_path / how
        shutil.copytree(root, copy, ignore=shutil.ignore_patterns("target"))
        done = _run_or_dump([sys.executable, "-c", FORKED_DOCS, str(copy), str(fork_from), how], 240, {**os.environ, "PIPE_NO_FORKSERVER": "1"})
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"rendered here: {renders_here}" in done.stdout, done.stdout
        sites[how] = copy / "target/docs"
    forked, killed, alone = (json.loads((sites[h] / ".pages.json").read_text()) for h in ("forked", "kill", "one"))
    assert alone == forked == killed and len([k for k in alone if k.startswith("nodes/")]) == 1006
    for rel in ("nodes/table.t500.html", "nodes/table.t0.html", "nodes/source.raw_0.html"):
        assert (sites["one"] / rel).read_bytes() == (sites["forked"] / rel).read_bytes() == (sites["kill"] / rel).read_bytes()


# --- in a real browser ----------------------------------------------------------------------------


def test_in_chromium_clicking_a_node_opens_its_page_with_key_and_upstream(shop, capsys, tmp_path):
    generate(capsys, shop)
    with Chromium() as browser:
        tab = browser.open((shop / "target/docs/index.html").as_uri())
        assert tab.wait_for("document.body.getAttribute('data-graph-nodes')") == "6"  # with the seed regions

        def centre_of(step_id):
            return tab.evaluate(f"(() => {{ const r = document.querySelector('.node[href=\"nodes/{step_id}.html\"]').getBoundingClientRect();"
                                " return [r.x + r.width / 2, r.y + r.height / 2]; })()")

        tab.move(*centre_of("table.orders"))  # pointing at orders lights its upstream and downstream only
        lit = tab.wait_for("[...document.querySelectorAll('.node.hl')].map(e => e.getAttribute('href').slice(6, -5)).sort()")
        assert lit == ["source.raw_orders", "table.customer_revenue", "table.orders"]
        tab.screenshot(tmp_path / "graph-hover.png")
        tab.click(*centre_of("table.orders"))
        tab.wait_for("location.pathname.endsWith('/nodes/table.orders.html') && document.readyState === 'complete'")
        assert tab.evaluate("document.getElementById('key').textContent") == "order_id"
        assert tab.evaluate("[...document.querySelectorAll('#upstream a')].map(a => a.textContent)") == ["raw_orders"]
        shot = tab.screenshot(tmp_path / "orders-page.png")
    assert shot.stat().st_size > 10_000
    print(f"screenshot: {shot}")


def test_in_chromium_the_list_filters_by_name_and_merge_on_read_and_quarantine_nodes_look_apart(shop, capsys, tmp_path):
    _mor_with_quarantine(shop)
    generate(capsys, shop, "--no-lake")
    with Chromium() as browser:
        tab = browser.open((shop / "target/docs/index.html").as_uri())
        assert tab.wait_for("document.body.getAttribute('data-graph-nodes')") == "7"
        shown = "[...document.querySelectorAll('#node-list li')].filter(li => !li.hidden && li.offsetParent).map(li => li.dataset.name)"
        assert tab.evaluate(shown) == ["customer_revenue", "customers", "orders", "orders__quarantine", "raw_customers", "raw_orders", "regions"]
        tab.evaluate("const f = document.getElementById('list-filter'); f.value = 'ORD'; f.dispatchEvent(new Event('input')); true")
        assert tab.evaluate(shown) == ["orders", "orders__quarantine", "raw_orders"]
        dash = "(h => getComputedStyle(document.querySelector(`.node[href=\"${h}\"] rect`)).strokeDasharray)"
        assert tab.evaluate(f"{dash}('nodes/table.orders.html')") not in ("", "none")  # merge-on-read: dashed
        assert tab.evaluate(f"{dash}('nodes/table.customers.html')") in ("", "none")  # copy-on-write: solid
        assert tab.evaluate("document.querySelector('.node[href=\"nodes/table.orders.html\"] .badge').textContent") == "MOR"
        box = tab.evaluate("(() => { const r = document.querySelector('.node.quarantine').getBoundingClientRect();"
                           " return [r.x + r.width / 2, r.y + r.height / 2, r.width]; })()")
        assert box[2] > 0
        tab.screenshot(tmp_path / "graph-mor-quarantine.png")
        tab.click(box[0], box[1])
        tab.wait_for("location.pathname.endsWith('/nodes/table.orders.html') && document.readyState === 'complete'")
        assert tab.evaluate("location.hash") == "#quarantine"
        assert "orders__quarantine" in tab.evaluate("document.getElementById('quarantine').textContent")


def test_in_chromium_search_finds_a_node_among_a_thousand_and_highlights_its_lineage(big, tmp_path):
    root, _ = big
    with Chromium() as browser:
        tab = browser.open((root / "target/docs/index.html").as_uri())
        assert tab.wait_for("document.body.getAttribute('data-graph-nodes')") == "1006"
        tab.evaluate("document.getElementById('search-box').value = 't500';"
                     "document.getElementById('search').requestSubmit(); true")
        assert tab.evaluate("location.hash") == "#table.t500"
        focus = tab.evaluate("(() => { const el = document.querySelector('.node.focus'); const r = el.getBoundingClientRect();"
                             " const g = document.getElementById('graph').getBoundingClientRect();"
                             " return [el.getAttribute('href'), r.x + r.width / 2, r.y + r.height / 2, g.x + g.width / 2, innerHeight]; })()")
        href, x, y, middle, height = focus
        assert href == "nodes/table.t500.html" and abs(x - middle) < 2  # centred in the graph (the list is on its left)
        lit = tab.evaluate("[...document.querySelectorAll('.node.hl')].map(e => e.getAttribute('href'))")
        assert "nodes/table.t462.html" in lit and "nodes/table.t473.html" in lit  # its upstream, highlighted
        tab.screenshot(tmp_path / "thousand-search.png")
        tab.press("Escape", 27)  # lets go of it
        assert tab.evaluate("document.querySelectorAll('.node.hl').length") == 0 and tab.evaluate("location.hash") == ""
        tab.click(x, y)
        tab.wait_for("location.pathname.endsWith('/nodes/table.t500.html') && document.readyState === 'complete'")
        assert tab.evaluate("document.getElementById('key').textContent") == "id"


# --- commits, from a real timeline -------------------------------------------------------------------

PROJECT_YML = """\
name: shop
targets:
  dev:
    spark:
      master: "local[2]"
      conf:
        spark.sql.shuffle.partitions: 4
vars:
  min_amount: 0
"""


@pytest.mark.spark
def test_pages_show_the_latest_commits_and_the_committed_schema_read_without_spark(spark, shop, capsys):
    (shop / "pipe_project.yml").write_text(PROJECT_YML)  # the shared session's settings
    code, out, err = pipe(capsys, shop, "run")
    assert code == 0, out + err
    # a fresh process: reading the timelines must start no JVM
    code = ("import sys, pipe.cli; rc = pipe.cli.main(['docs', 'generate', '--project-dir', sys.argv[1]]);"
            "from pyspark import SparkContext; print('RC', rc, 'JVM', SparkContext._gateway is not None)")
    proc = subprocess.run([sys.executable, "-c", code, str(shop)], capture_output=True, text=True, env={**__import__("os").environ, "PYTHONPATH": str(REPO)})
    assert "RC 0 JVM False" in proc.stdout, proc.stdout + proc.stderr
    assert "commits of 4 tables" in proc.stdout
    orders = page(shop, "table.orders")
    assert re.search(r'id="last-write">\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \(UTC\)<', orders)
    commits = text_of(orders, "commits")
    assert "commit completed UPSERT" in commits and "raw_orders : files up to" in commits
    assert "expectation has_customer: 1 drop" in commits  # orders-0002.json has an order without a customer
    revenue = page(shop, "table.customer_revenue")
    assert "replacecommit completed INSERT_OVERWRITE_TABLE" in text_of(revenue, "commits")
    assert "the latest commit" in revenue and "<code>revenue</code></td>\n    <td>double</td>" in revenue  # types from the commit

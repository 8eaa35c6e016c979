"""The `pipe` command as a user meets it: exit codes, messages, files written, no tracebacks."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

from pipe.cli import main
from tests.conftest import REPO, TEMPLATE, write_project


def run(capsys, *args):
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_compile_writes_plan_and_prints_a_summary(tmp_path, capsys):
    shutil.copytree(TEMPLATE, tmp_path / "shop")
    code, out, err = run(capsys, "--project-dir", str(tmp_path / "shop"), "compile")
    assert code == 0, err
    assert "Compiled shop for target dev: 2 sources, 4 tables (2 commit, 2 replacecommit) of which 1 seed, 13 tests, 1 unit test -> target/plan.json" in out
    plan = json.loads((tmp_path / "shop/target/plan.json").read_text())
    assert plan["project"] == "shop"


def test_project_errors_exit_2_without_traceback_and_write_nothing(tmp_path, capsys):
    root = write_project(tmp_path / "p", {
        "tables/t.yml": "tables:\n  t:\n    operation: upsrt\n    partiton_by: [x]\n",
        "tables/t.sql": "select * from {{ ref('missing') }}",
    })
    code, out, err = run(capsys, "--project-dir", str(root), "compile")
    assert code == 2
    assert "Traceback" not in err and "Traceback" not in out
    assert "tables/t.yml:3:16: error: unknown value 'upsrt' for 'operation' in table 't'" in err
    assert "hint: did you mean 'upsert'?" in err
    assert "tables/t.yml:4:5: error: unknown key 'partiton_by' in table 't'" in err
    assert "hint: did you mean 'partition_by'?" in err
    assert "tables/t.sql:1: error: ref('missing'): no table named 'missing'" in err
    assert "3 errors found; nothing was written." in err
    assert not (root / "target" / "plan.json").exists()


def test_debug_shows_the_traceback(tmp_path):
    root = write_project(tmp_path / "p", {"tables/t.sql": "select * from {{ ref('missing') }}"})
    proc = subprocess.run([sys.executable, "-m", "pipe", "--debug", "--project-dir", str(root), "compile"], capture_output=True, text=True)
    assert proc.returncode != 0
    assert "Traceback" in proc.stderr and "ProjectError" in proc.stderr


def test_debug_may_follow_the_command_and_keeps_exit_2(tmp_path):
    root = write_project(tmp_path / "p", {"tables/t.sql": "select * from {{ ref('missing') }}"})
    proc = subprocess.run([sys.executable, "-m", "pipe", "compile", "--debug", "--project-dir", str(root)], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "Traceback" in proc.stderr
    assert "tables/t.sql:1: error: ref('missing')" in proc.stderr


def test_ls_errors_do_not_claim_a_write(tmp_path, capsys):
    root = write_project(tmp_path / "p", {"tables/t.sql": "select * from {{ ref('missing') }}"})
    code, _, err = run(capsys, "--project-dir", str(root), "ls")
    assert code == 2 and "1 error found." in err and "nothing was written" not in err


def test_console_script_exit_code_and_no_traceback(tmp_path):
    root = write_project(tmp_path / "p", {"pipe_project.yml": "name: shop\ntargets: {dev: {spark: {master: 3}}}\n"})
    pipe = shutil.which("pipe", path=os.path.dirname(sys.executable)) or shutil.which("pipe")
    assert pipe, "the pipe console script is installed beside the interpreter"
    proc = subprocess.run([pipe, "compile"], cwd=root, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr  # an int master is accepted as text
    (root / "pipe_project.yml").write_text("name: shop\ntargets: {dev: {spark: {master: [a]}}}\n")
    proc = subprocess.run([pipe, "compile"], cwd=root / "", capture_output=True, text=True)
    assert proc.returncode == 2
    assert "pipe_project.yml:2:33: error: 'master' in 'spark' of target 'dev' must be a string, not a list" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_compile_finds_the_project_from_a_subfolder(tmp_path, monkeypatch, capsys):
    shutil.copytree(TEMPLATE, tmp_path / "shop")
    monkeypatch.chdir(tmp_path / "shop" / "tables")
    code, out, _ = run(capsys, "compile")
    assert code == 0
    assert (tmp_path / "shop/target/plan.json").is_file()


def test_no_project_is_a_clear_error(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, _, err = run(capsys, "compile")
    assert code == 2
    assert "no pipe_project.yml in" in err and "pipe init NAME" in err


def test_bad_vars_and_unknown_target_exit_2(tmp_path, capsys):
    shutil.copytree(TEMPLATE, tmp_path / "shop")
    code, _, err = run(capsys, "--project-dir", str(tmp_path / "shop"), "compile", "--vars", "[1, 2]")
    assert code == 2 and "--vars must be a mapping" in err
    code, _, err = run(capsys, "--project-dir", str(tmp_path / "shop"), "compile", "--vars", "{a: [")
    assert code == 2 and "--vars is not valid YAML or JSON" in err
    code, _, err = run(capsys, "--project-dir", str(tmp_path / "shop"), "compile", "--vars", "{x: .nan}")
    assert code == 2 and "var 'x' holds nan, which plan.json cannot hold" in err
    code, _, err = run(capsys, "--project-dir", str(tmp_path / "shop"), "compile", "--target", "prd")
    assert code == 2 and "unknown target 'prd'" in err and "did you mean 'prod'?" in err
    code, out, err = run(capsys, "--project-dir", str(tmp_path / "shop"), "compile", "--target", "prod", "--vars", '{"min_amount": 7}')
    assert code == 0, err
    plan = json.loads((tmp_path / "shop/target/plan.json").read_text())
    assert plan["vars"]["min_amount"] == 7 and plan["target"]["name"] == "prod"
    assert "where amount >= 7" in next(s["sql"] for s in plan["steps"] if s["id"] == "table.orders")


def test_ls_selects_like_dbt(tmp_path, capsys):
    shutil.copytree(TEMPLATE, tmp_path / "shop")
    base = ("--project-dir", str(tmp_path / "shop"), "ls")
    code, out, _ = run(capsys, *base, "--exclude", "test:*")
    assert code == 0
    assert out.split() == ["source.raw_customers", "source.raw_orders", "table.customers", "table.orders", "table.customer_revenue",
                           "table.regions", "unit.orders_keep_the_latest_version"]
    _, out, _ = run(capsys, *base, "--select", "+customer_revenue", "--exclude", "source:* test:* unit:*")
    assert out.split() == ["table.customers", "table.orders", "table.customer_revenue"]
    # selecting a table brings its unit tests along, as its data tests
    _, out, _ = run(capsys, *base, "-s", "orders+", "--exclude", "test:*")
    assert out.split() == ["table.orders", "table.customer_revenue", "unit.orders_keep_the_latest_version"]
    _, out, _ = run(capsys, *base, "-s", "test:*")
    assert len(out.split()) == 13 and all(i.startswith("test.") for i in out.split())
    _, out, _ = run(capsys, *base, "-s", "resource_type:unit_test")
    assert out.split() == ["unit.orders_keep_the_latest_version"]
    _, out, _ = run(capsys, *base, "-s", "path:tables/orders.yml", "--exclude", "test:* unit:*", "--output", "json")
    row = json.loads(out)
    assert row["id"] == "table.orders" and row["action"] == "commit" and row["depends_on"] == ["source.raw_orders"]
    code, out, err = run(capsys, *base, "-s", "nothing_here")
    assert code == 2 and out == "" and "--select 'nothing_here' matches no step" in err
    code, _, err = run(capsys, *base, "-s", "colour:red")
    assert code == 2 and "unknown selector method 'colour'" in err


def test_init_creates_a_project_that_compiles(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "init", "acme")
    assert code == 0, err
    root = tmp_path / "acme"
    assert (root / "pipe_project.yml").read_text().splitlines()[2] == "name: acme"
    assert sorted(p.name for p in (root / "data/orders").iterdir()) == ["orders-0001.json", "orders-0002.json"]
    assert (root / "data/customers/customers-0001.json").is_file()
    assert not (root / "target").exists() and not (root / "lake").exists()
    code, out, err = run(capsys, "--project-dir", str(root), "compile")
    assert code == 0, err
    assert "Compiled acme" in out
    # a second init refuses to overwrite
    code, _, err = run(capsys, "init", "acme")
    assert code == 2 and "already exists" in err
    code, _, err = run(capsys, "init", "9lives")
    assert code == 2 and "invalid project name" in err


def test_compile_never_imports_pyspark_or_boto3(tmp_path):
    shutil.copytree(TEMPLATE, tmp_path / "shop")
    code = (
        "import sys\n"
        "from pipe.cli import main\n"
        f"rc = main(['--project-dir', {str(tmp_path / 'shop')!r}, 'compile'])\n"
        "rc2 = main(['--project-dir', " + repr(str(tmp_path / "shop")) + ", 'ls'])\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('pyspark', 'py4j', 'boto3', 'botocore', 'pyarrow', 'pandas')\n"
        "               or m in ('compiler.lineage', 'pipe.docs'))  # pipe docs' own modules too\n"
        "print('RC', rc, rc2, 'HEAVY', heavy)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "RC 0 0 HEAVY []" in proc.stdout, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(REPO)], check=True, capture_output=True)
    [whl] = list(out.glob("pipe-*.whl"))
    return whl


def test_wheel_ships_the_template_and_init_works_from_it(wheel, tmp_path):
    names = zipfile.ZipFile(wheel).namelist()
    for rel in ("pipe_project.yml", "tables/orders.yml", "tables/orders.sql", "macros/money.sql", "data/orders/orders-0001.json", "data/customers/customers-0001.json"):
        assert f"pipe/project_template/{rel}" in names
    assert "compiler/api.py" in names and "runtime/__init__.py" in names
    for rel in ("templates/node.html", "templates/graph.html", "static/graph.js", "static/style.css"):  # pipe docs
        assert f"pipe/docs/{rel}" in names
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)], check=True, capture_output=True)
    work = tmp_path / "work"
    work.mkdir()
    code = (
        f"import sys; sys.path.insert(0, {str(site)!r})\n"
        "import pipe, pipe.cli\n"
        f"assert pipe.__file__.startswith({str(site)!r}), pipe.__file__\n"
        "rc = pipe.cli.main(['init', 'fromwheel'])\n"
        "rc2 = pipe.cli.main(['--project-dir', 'fromwheel', 'compile'])\n"
        "rc3 = pipe.cli.main(['--project-dir', 'fromwheel', 'docs', 'generate'])\n"
        "print('RC', rc, rc2, rc3)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=work, capture_output=True, text=True)
    assert "RC 0 0 0" in proc.stdout, proc.stdout + proc.stderr
    assert (work / "fromwheel/target/plan.json").is_file()
    assert (work / "fromwheel/target/docs/static/graph.js").is_file()


@pytest.mark.parametrize("text", [
    "Compiled [bold]shop[/] for target [bold]dev[/]: 2 sources, 4 tables (2 commit, 2 replacecommit) of which 1 seed, 13 tests, 1 unit test -> target/plan.json in 0.12s",
    "[bold red]2 errors[/] found; nothing was written." + " and a line far longer than eighty columns" * 4,
    "",
    "plain text, no markup",
    "[dim]-[/] t: not built yet (nothing at [link])",  # markup rich would read: left to rich
    "a :smile: emoji code",
    "a \\[ backslash",
    "[green]✓[/] non-ASCII",
    "a\ttab",
])
def test_lines_printed_without_rich_read_as_rich_prints_them(text, monkeypatch):
    """pipe.output writes a line with only style tags to a pipe itself (rich is not imported
    for `pipe compile` in CI); whatever it writes is what rich would have written there."""
    from rich.console import Console

    from pipe.output import _plain

    for var in ("FORCE_COLOR", "TTY_COMPATIBLE"):
        monkeypatch.delenv(var, raising=False)
    stream = io.StringIO()
    Console(file=stream, highlight=False, soft_wrap=True).print(text)
    plain = _plain(text, io.StringIO())
    assert plain is None or plain == stream.getvalue()
    if "[link]" not in text and not any(c in text for c in ":\\✓\t"):
        assert plain is not None  # style tags alone do not need rich
    monkeypatch.setenv("FORCE_COLOR", "1")  # rich would colour even a pipe
    assert _plain(text, io.StringIO()) is None


def test_every_command_that_compiles_leaves_the_plan_it_used_in_target(spark, tmp_path, capsys):
    from compiler import compile_project
    from tests.test_run import ONE_SOURCE, project, write_jsonl

    root = project(tmp_path, {"sources/s.yml": ONE_SOURCE, "tables/t.sql": "select id, v from {{ source('s') }}\n"})
    write_jsonl(root / "data/s/1.json", [{"id": 1_700_000_000_123, "v": "Zoë"}, {"id": 1_700_000_000_456, "v": None}])
    code, out, err = run(capsys, "--project-dir", str(root), "compile")
    assert code == 0, err
    compiled = (root / "target/plan.json").read_text()

    (root / "tables/t.sql").write_text("select id, upper(v) as v from {{ source('s') }}\n")
    code, out, err = run(capsys, "--project-dir", str(root), "run")
    assert code == 0, out + err
    ran = (root / "target/plan.json").read_text()
    assert ran != compiled and ran == compile_project(root).plan.to_json()
    code, out, err = run(capsys, "--project-dir", str(root), "diff", str(root / "target/plan.json"))
    assert code == 0 and "No changes" in out, out + err

    (root / "tables/t.sql").write_text("select id, lower(v) as v from {{ source('s') }}\n")
    code, out, err = run(capsys, "--project-dir", str(root), "ls")
    assert code == 0, err
    assert (root / "target/plan.json").read_text() == compile_project(root).plan.to_json()
    assert not [p.name for p in (root / "target").iterdir() if p.name.endswith(".tmp")]


def test_a_spark_setting_whose_variable_is_unset_at_run_names_it_and_starts_no_spark(tmp_path, capsys, monkeypatch):
    """The plan keeps `env_var()` of a Spark setting as a placeholder; a run without the variable
    says which one, for every step that needs Spark, and no other KeyError reads as a variable."""
    shutil.copytree(TEMPLATE, tmp_path / "shop")
    project = tmp_path / "shop/pipe_project.yml"
    project.write_text(project.read_text().replace(
        '      master: "local[*]"\n', '      master: "local[*]"\n      conf:\n        spark.pipe.note: "{{ env_var(\'PIPE_T_NOTE\') }}"\n', 1))
    monkeypatch.setenv("PIPE_T_NOTE", "x")
    code, _, err = run(capsys, "--project-dir", str(tmp_path / "shop"), "compile")
    assert code == 0, err
    assert '"spark.pipe.note": "${env:PIPE_T_NOTE}"' in (tmp_path / "shop/target/plan.json").read_text()
    monkeypatch.delenv("PIPE_T_NOTE")
    code, out, err = run(capsys, "--project-dir", str(tmp_path / "shop"), "run", "--plan", str(tmp_path / "shop/target/plan.json"))
    assert code == 1
    assert "✗ table.orders  error" in out
    assert "environment variable PIPE_T_NOTE is not set; the Spark settings of target dev need it" in out + err
    assert "export PIPE_T_NOTE=... before `pipe run`" in out + err
    assert "Traceback" not in out + err
    assert not (tmp_path / "shop/lake/orders").exists()

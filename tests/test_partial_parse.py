"""Partial parsing (compiler/partial.py): `pipe compile` of a project unchanged since its last
compile reuses the plan.json that compile wrote and says what it said; anything the plan
depends on that changes (a file, --vars, --target, the compiler, plan.json itself) compiles the
project in full again."""

from __future__ import annotations

import builtins
import io
import json
import marshal
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from compiler import api, cache_key, partial
from compiler import project as project_module
from compiler.api import compile_project  # the real one: `full_compiles` counts calls through api
from compiler.project import ProjectFiles
from compiler.simple_template import SimpleTemplate
from pipe.cli import main
from tests.conftest import TEMPLATE


@pytest.fixture
def shop(tmp_path) -> Path:
    root = tmp_path / "shop"
    shutil.copytree(TEMPLATE, root)
    return root


@pytest.fixture
def full_compiles(monkeypatch) -> list[Path]:
    """The compiles that ran in full (compile_project called), by project root."""
    calls: list[Path] = []
    real = api.compile_project

    def counting(root, *args, **kwargs):
        calls.append(Path(root))
        return real(root, *args, **kwargs)

    monkeypatch.setattr(api, "compile_project", counting)
    return calls


def pipe_compile(capsys, root: Path, *args: str) -> tuple[int, str, str]:
    code = main(["--project-dir", str(root), "compile", *args])
    captured = capsys.readouterr()
    return code, re.sub(r" in \d+\.\d\ds$", " in Ns", captured.out.strip()), captured.err


def plan_text(root: Path) -> str:
    return (root / "target" / "plan.json").read_text(encoding="utf-8")


def fresh_plan(root: Path, *args, **kwargs) -> str:
    """What a compile in full, without any record, writes for the project as it is now."""
    return compile_project(root, *args, **kwargs).plan.to_json()


def test_an_unchanged_project_reuses_its_plan_and_says_the_same(shop, full_compiles, capsys):
    yml = shop / "tables" / "customer_revenue.yml"  # a setting that draws a warning
    yml.write_text(yml.read_text().replace("    operation: insert_overwrite_table\n",
                                           "    operation: insert_overwrite_table\n    precombine: customer_id\n"))
    first = pipe_compile(capsys, shop)
    plan = plan_text(shop)
    assert first[0] == 0 and "warning: precombine has no effect on table 'customer_revenue'" in first[2]
    assert first[1] == "Compiled shop for target dev: 2 sources, 4 tables (2 commit, 2 replacecommit) of which 1 seed, 13 tests, 1 unit test -> target/plan.json in Ns"

    again = pipe_compile(capsys, shop)
    assert again == first  # exit code, summary line and warnings
    assert plan_text(shop) == plan
    assert full_compiles == [shop]  # the second compile parsed nothing


CHANGES = {
    "a SQL file edited, same size": lambda root: _edit(root / "tables/orders.sql", "lower(status)", "upper(status)"),
    "a YAML file edited": lambda root: _edit(root / "tables/customers.yml", "latest state", "newest state"),
    "a macro edited": lambda root: _edit(root / "macros/money.sql", "as double), 2)", "as double), 3)"),
    "a singular test edited": lambda root: _edit(root / "tests/revenue_adds_up.sql", "> 0.005", "> 0.006"),
    "the project file edited": lambda root: _edit(root / "pipe_project.yml", "lake: lake ", "lake: lakes"),
    "a table added": lambda root: (root / "tables/extra.sql").write_text("select 1 as x\n"),
    "a test removed": lambda root: (root / "tests/revenue_adds_up.sql").unlink(),
    "a test renamed": lambda root: (root / "tests/revenue_adds_up.sql").rename(root / "tests/revenue_sums.sql"),
    "a table moved to a subfolder": lambda root: [_move(root, f"tables/customers.{ext}", f"tables/crm/customers.{ext}") for ext in ("yml", "sql")],
}


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def _move(root: Path, old: str, new: str) -> None:
    (root / new).parent.mkdir(parents=True, exist_ok=True)
    (root / old).rename(root / new)


@pytest.mark.parametrize("change", CHANGES)
def test_a_changed_file_compiles_the_project_in_full(shop, full_compiles, capsys, change):
    assert pipe_compile(capsys, shop)[0] == 0
    before = plan_text(shop)
    CHANGES[change](shop)
    code, out, err = pipe_compile(capsys, shop)
    assert code == 0, err
    assert len(full_compiles) == 2
    assert plan_text(shop) == fresh_plan(shop) != before
    assert pipe_compile(capsys, shop) == (code, out, err)
    assert len(full_compiles) == 2  # and is reused after


def test_vars_and_target_are_part_of_what_is_reused(shop, full_compiles, capsys):
    runs = [(), ("--vars", "{min_amount: 7}"), ("--vars", "{min_amount: 7}"), (), ("--target", "prod"), ("--target", "prod"), ("--target", "dev")]
    for args in runs:
        code, _, err = pipe_compile(capsys, shop, *args)
        assert code == 0, err
        options = dict(zip(args[::2], args[1::2]))
        cli_vars = {"min_amount": 7} if "--vars" in options else None
        assert plan_text(shop) == fresh_plan(shop, target=options.get("--target"), cli_vars=cli_vars), args
    # reused only when the options were those of the compile just before
    assert len(full_compiles) == 5


def test_a_plan_json_changed_or_removed_is_written_again(shop, full_compiles, capsys):
    assert pipe_compile(capsys, shop)[0] == 0
    plan = plan_text(shop)
    (shop / "target/plan.json").write_text(plan.replace('"shop"', '"shoq"'))
    assert pipe_compile(capsys, shop)[0] == 0
    assert plan_text(shop) == plan
    (shop / "target/plan.json").unlink()
    assert pipe_compile(capsys, shop)[0] == 0
    assert plan_text(shop) == plan
    assert len(full_compiles) == 3


def test_a_damaged_record_compiles_in_full(shop, full_compiles, capsys):
    assert pipe_compile(capsys, shop)[0] == 0
    record = shop / "target" / partial.RECORD_FILE
    good = json.loads(record.read_text())
    damaged_records = ("{not json", "[]", json.dumps({**good, "summary": {"project": "shop"}}), json.dumps({**good, "format": 0}),
                       json.dumps({**good, "summary": {**good["summary"], "tests": "11"}}))
    for damaged in damaged_records:
        record.write_text(damaged)
        code, out, err = pipe_compile(capsys, shop)
        assert code == 0 and out.startswith("Compiled shop for target dev: 2 sources, 4 tables"), err
    assert len(full_compiles) == 1 + len(damaged_records)


def test_a_failed_compile_leaves_the_last_plan_and_its_record(shop, full_compiles, capsys):
    assert pipe_compile(capsys, shop)[0] == 0
    plan = plan_text(shop)
    sql = shop / "tables/orders.sql"
    good = sql.read_text()
    sql.write_text(good.replace("source('raw_orders')", "source('raw_ordrs')"))
    code, _, err = pipe_compile(capsys, shop)
    assert code == 2 and "no source named 'raw_ordrs'" in err and "nothing was written" in err
    assert plan_text(shop) == plan
    sql.write_text(good)  # back as it was compiled: the plan in target/ is that of these files
    assert pipe_compile(capsys, shop)[0] == 0
    assert plan_text(shop) == plan
    assert len(full_compiles) == 2


def test_environment_variables_are_no_input_of_the_plan(shop, monkeypatch):
    """env_var() leaves a placeholder the runtime resolves: the plan is the same whatever the
    environment holds, which is why the fingerprint leaves the environment out."""
    monkeypatch.setenv("SHOP_LAKE_BUCKET", "one")
    one = fresh_plan(shop, target="prod")
    monkeypatch.setenv("SHOP_LAKE_BUCKET", "two")
    assert fresh_plan(shop, target="prod") == one
    assert "${env:SHOP_LAKE_BUCKET:-acme-lake}" in one


def test_the_compilers_code_and_libraries_are_part_of_the_fingerprint(shop, tmp_path, monkeypatch):
    compiler_copy = tmp_path / "compiler"
    shutil.copytree(partial._COMPILER, compiler_copy, ignore=shutil.ignore_patterns("__pycache__"))
    library = tmp_path / "libs" / "somelib"
    library.mkdir(parents=True)
    (library / "__init__.py").write_text("version = 1\n")
    monkeypatch.setattr(partial, "_COMPILER", compiler_copy)
    monkeypatch.setattr(partial, "_LIBRARIES", (*partial._LIBRARIES, "somelib"))
    monkeypatch.syspath_prepend(str(tmp_path / "libs"))
    files = ProjectFiles.read(shop)

    def fingerprint():
        return partial.fingerprint(files, None, {})

    first = fingerprint()
    assert fingerprint() == first
    with open(compiler_copy / "render.py", "a") as f:
        f.write("\n# a change\n")
    changed_code = fingerprint()
    assert changed_code != first
    (library / "__init__.py").write_text("version = 22\n")  # a reinstall
    changed_library = fingerprint()
    assert changed_library != changed_code
    monkeypatch.setenv("NETWORKX_BACKEND_PRIORITY", "other")
    assert fingerprint() != changed_library


def test_a_compile_reads_the_project_only_through_its_files(shop, monkeypatch):
    """Everything a compile reads of the project comes from ProjectFiles, the bytes partial
    parsing fingerprints: no stage opens a project file of its own."""
    files = ProjectFiles.read(shop)
    opened: list[str] = []
    real_open = builtins.open

    def recording_open(file, *args, **kwargs):
        opened.append(str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", recording_open)
    monkeypatch.setattr(io, "open", recording_open)
    compile_project(shop, files=files)
    compile_project(shop, target="prod", files=files)
    assert [p for p in opened if Path(p).resolve().is_relative_to(shop.resolve())] == []


def test_an_unchanged_projects_compile_imports_no_compiler_stage(shop):
    """Nor rich when the summary goes to a pipe: a compile in full imports what it needs."""
    code = (
        "import sys\n"
        "from pipe.cli import main\n"
        f"rc = main(['--project-dir', {str(shop)!r}, 'compile'])\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('networkx', 'jinja2', 'sqlglot', 'rich'))\n"
        "print('RC', rc, 'HEAVY', heavy)\n"
    )
    first = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "RC 0 HEAVY [" in first.stdout and "'rich" not in first.stdout and "'jinja2'" in first.stdout, first.stdout + first.stderr
    again = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "RC 0 HEAVY []" in again.stdout, again.stdout + again.stderr


# --- file-level partial parsing: a changed project reuses what its unchanged files gave -----------

STEPS_OF_EDITS = [  # applied one after the other, each compiled with what the compile before kept
    ("a SQL body edited", lambda root: _edit(root / "tables/orders.sql", "lower(status)", "upper(status)")),
    ("a ref added", lambda root: _edit(root / "tables/customers.sql", "from {{ source('raw_customers') }}",
                                       "from {{ source('raw_customers') }}\nwhere customer_id in (select customer_id from {{ ref('orders') }})")),
    ("a key changed", lambda root: _edit(root / "tables/customers.yml", "key: [customer_id]", "key: [customer_id, email]")),
    ("a source's schema changed", lambda root: _edit(root / "sources/shop.yml", "region STRING, updated_at", "region STRING, note STRING, updated_at")),
    ("the ref removed again", lambda root: _edit(root / "tables/customers.sql", "\nwhere customer_id in (select customer_id from {{ ref('orders') }})", "")),
    ("a table added", lambda root: (root / "tables/extra.sql").write_text("select customer_id from {{ ref('customers') }}\n")),
    ("a table with settings added", lambda root: (root / "tables/extra.yml").write_text("tables:\n  extra:\n    key: [customer_id]\n")),
    ("the table's YAML removed", lambda root: (root / "tables/extra.yml").unlink()),
]


def test_each_edit_gives_the_plan_a_compile_from_nothing_gives(shop, capsys):
    """The differential check of file-level partial parsing: after every edit, the plan compiled
    with what the previous compile kept is byte for byte the plan of a compile without it."""
    assert pipe_compile(capsys, shop)[0] == 0
    assert (shop / "target" / partial.FILES_RECORD).is_file()
    for what, edit in STEPS_OF_EDITS:
        before = plan_text(shop)
        edit(shop)
        code, _, err = pipe_compile(capsys, shop)
        assert code == 0, (what, err)
        assert plan_text(shop) == fresh_plan(shop) != before, what


def test_an_edit_reparses_only_its_file(shop, monkeypatch):
    """What the unchanged YAML and SQL files gave is reused; the edited file is read again."""
    target = shop / "target"
    compile_project(shop, cache_dir=target)
    parsed: list[str] = []
    real_load = project_module.load_yaml
    monkeypatch.setattr(project_module, "load_yaml", lambda text, file, errors: parsed.append(file) or real_load(text, file, errors))
    split: list[str] = []
    real_parse = SimpleTemplate.parse
    monkeypatch.setattr(SimpleTemplate, "parse", lambda name, text: split.append(name) or real_parse(name, text))

    _edit(shop / "tables/customers.yml", "latest state", "newest state")
    result = compile_project(shop, cache_dir=target)
    assert parsed == ["pipe_project.yml", "tables/customers.yml"]  # not sources/shop.yml, tables/orders.yml, ...
    assert split == []
    assert result.plan.to_json() == fresh_plan(shop)
    assert sorted(result.graph.nodes) == sorted(result.plan.step_ids)  # built from the plan when asked for

    parsed.clear(), split.clear()
    _edit(shop / "tables/orders.sql", "where amount >= {{ var('min_amount') }}",
          "where amount >= {{ var('min_amount') }} and upper(region) in (select region from {{ ref('regions') }})")
    result = compile_project(shop, cache_dir=target)
    assert parsed == ["pipe_project.yml"] and split == ["tables/orders.sql"]
    assert result.plan.to_json() == fresh_plan(shop)
    assert result.plan.step_ids.index("table.regions") < result.plan.step_ids.index("table.orders")


def test_a_compile_without_a_cycle_imports_no_networkx(shop, capsys):
    code = (
        "import sys\n"
        "from pipe.cli import main\n"
        f"rc = main(['--project-dir', {str(shop)!r}, 'compile'])\n"
        "print('RC', rc, 'NETWORKX', 'networkx' in sys.modules)\n"
    )
    first = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "RC 0 NETWORKX False" in first.stdout, first.stdout + first.stderr
    _edit(shop / "tables/orders.sql", "from {{ source('raw_orders') }}",
          "from {{ source('raw_orders') }} where customer_id in (select customer_id from {{ ref('customer_revenue') }})")
    cycle = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "RC 2 NETWORKX True" in cycle.stdout and "dependency cycle" in cycle.stderr, cycle.stdout + cycle.stderr


def test_a_file_with_a_warning_is_read_again_and_warns_again(shop, capsys):
    yml = shop / "tables" / "customer_revenue.yml"
    yml.write_text(yml.read_text().replace("    operation: insert_overwrite_table\n",
                                           "    operation: insert_overwrite_table\n    precombine: customer_id\n"))
    warning = "warning: precombine has no effect on table 'customer_revenue'"
    assert warning in pipe_compile(capsys, shop)[2]
    _edit(shop / "tables/orders.sql", "lower(status)", "upper(status)")  # another file: the project changed
    code, _, err = pipe_compile(capsys, shop)
    assert code == 0 and warning in err


def test_a_cycle_made_by_an_edit_is_reported_though_the_order_was_kept(shop, capsys):
    assert pipe_compile(capsys, shop)[0] == 0
    _edit(shop / "tables/orders.sql", "from {{ source('raw_orders') }}",
          "from {{ source('raw_orders') }} where customer_id in (select customer_id from {{ ref('customer_revenue') }})")
    code, _, err = pipe_compile(capsys, shop)
    assert code == 2 and "dependency cycle: table.customer_revenue -> table.orders -> table.customer_revenue" in err, err


def signed(blob: bytes) -> bytes:
    """A marshal record as this user's compile signs it (compiler/cache_key.py)."""
    return cache_key.sign(blob) + blob


def unsigned(data: bytes) -> bytes:
    assert cache_key.verified(data[:32], data[32:])
    return data[32:]


DAMAGED_FILE_RECORDS = {
    "not marshal": b"\x00garbage",
    "truncated": None,  # the first half of the good record
    "another shape": marshal.dumps([1, 2, 3]),
    "another format": None,  # the good record with format 0
    "payloads of another shape": None,  # every file's payload replaced by a list
}


@pytest.mark.parametrize("damage", DAMAGED_FILE_RECORDS)
def test_a_damaged_file_record_is_no_record(shop, capsys, damage):
    assert pipe_compile(capsys, shop)[0] == 0
    record = shop / "target" / partial.FILES_RECORD
    good = unsigned(record.read_bytes())
    fmt, code, files = marshal.loads(good)
    damaged = {
        "truncated": good[: len(good) // 2],
        "another format": marshal.dumps((0, code, files)),
        "payloads of another shape": marshal.dumps((fmt, code, {rel: (digest, marshal.dumps([1])) for rel, (digest, _) in files.items()})),
    }.get(damage, DAMAGED_FILE_RECORDS[damage])
    record.write_bytes(signed(damaged))  # damaged, yet signed with this user's key
    _edit(shop / "tables/customers.yml", "latest state", "newest state")
    code, out, err = pipe_compile(capsys, shop)
    assert code == 0 and out.startswith("Compiled shop for target dev: 2 sources, 4 tables"), err
    assert plan_text(shop) == fresh_plan(shop)
    assert marshal.loads(unsigned(record.read_bytes()))[0] == partial.FILES_FORMAT  # written good again


def test_a_value_marshal_cannot_keep_leaves_its_file_parsed_every_time(tmp_path):
    import datetime

    cache = partial.ParseCache("code")
    cache.put("tables/a.yml", b"a: 2024-01-01\n", ({"a": datetime.date(2024, 1, 1)},))
    cache.put("tables/b.yml", b"b: 1\n", ({"b": 1},))
    cache.save(tmp_path)
    again = partial.ParseCache.load(tmp_path)
    assert again.get("tables/a.yml", b"a: 2024-01-01\n") is None  # the record is under another code digest
    kept = partial.ParseCache(partial.code_digest())
    kept.put("tables/a.yml", b"a: 2024-01-01\n", ({"a": datetime.date(2024, 1, 1)},))
    kept.put("tables/b.yml", b"b: 1\n", ({"b": 1},))
    kept.save(tmp_path)
    again = partial.ParseCache.load(tmp_path)
    assert again.get("tables/a.yml", b"a: 2024-01-01\n") is None
    assert again.get("tables/b.yml", b"b: 1\n") == ({"b": 1},)
    assert again.get("tables/b.yml", b"b: 2\n") is None  # other bytes


# --- plan.json written with the text of the steps the last compile encoded -------------------------


def test_plan_json_reuses_the_text_of_unchanged_steps_and_is_the_same_as_encoded_whole(shop, capsys, monkeypatch):
    import json

    from compiler import plan as plan_module

    assert pipe_compile(capsys, shop)[0] == 0
    texts = partial.load_step_texts(shop / "target")
    assert len(texts) == len(json.loads(plan_text(shop))["steps"])  # one text per step of plan.json
    encoded = []
    real_dumps = json.dumps

    def counting(value, *args, **kwargs):
        if kwargs.get("indent") and isinstance(value, dict) and "kind" in value and "id" in value:
            encoded.append(value["id"])
        return real_dumps(value, *args, **kwargs)

    monkeypatch.setattr(plan_module.json, "dumps", counting)
    _edit(shop / "tables/orders.sql", "lower(status)", "upper(status)")
    assert pipe_compile(capsys, shop)[0] == 0
    assert encoded == ["table.orders"]  # the others' text came from the record
    monkeypatch.setattr(plan_module.json, "dumps", real_dumps)
    assert plan_text(shop) == fresh_plan(shop)
    # what Python's own encoder writes for the whole plan, byte for byte: unicode, an empty plan too
    plan = plan_module.Plan.from_json(plan_text(shop))
    texts = {}
    assert plan.to_json(texts) == plan.to_json() == real_dumps(plan.to_dict(), sort_keys=True, indent=2, ensure_ascii=False) + "\n"
    assert plan.to_json(texts) == plan.to_json()  # from the texts just kept
    empty = plan_module.Plan(project="ä", target=plan.target, vars={"steps": None, "x": "ü"}, steps=())
    assert empty.to_json({}) == real_dumps(empty.to_dict(), sort_keys=True, indent=2, ensure_ascii=False) + "\n"


@pytest.mark.parametrize("damage", ["truncated", "another code", "texts of another shape"])
def test_a_damaged_record_of_step_texts_is_no_record(shop, capsys, damage):
    assert pipe_compile(capsys, shop)[0] == 0
    record = shop / "target" / partial.STEPS_RECORD
    good = unsigned(record.read_bytes())
    fmt, code, texts = marshal.loads(good)
    record.write_bytes(signed({"truncated": good[: len(good) // 2],
                               "another code": marshal.dumps((fmt, "another", {k: "{}" for k in texts})),
                               "texts of another shape": marshal.dumps((fmt, code, {k: 1 for k in texts}))}[damage]))
    _edit(shop / "tables/orders.sql", "lower(status)", "upper(status)")
    assert pipe_compile(capsys, shop)[0] == 0
    assert plan_text(shop) == fresh_plan(shop)
    assert marshal.loads(unsigned(record.read_bytes()))[:2] == (partial.STEPS_FORMAT, code)  # written good again


# --- target/ committed by someone else (a pull request) ----------------------------------------------


def test_a_committed_record_and_plan_json_are_not_taken_for_this_users_compile(shop, tmp_path, capsys, monkeypatch):
    """The author of a pull request compiles the project, puts SQL of their own into plan.json,
    fixes the record's hash and commits target/: the reviewer's compile writes the project's plan."""
    import hashlib

    monkeypatch.setenv("PIPE_CACHE_DIR", str(tmp_path / "author-cache"))
    assert pipe_compile(capsys, shop)[0] == 0
    crafted = plan_text(shop).replace("lower(status)", "(select secret from prod.credentials)")
    assert crafted != plan_text(shop)
    (shop / "target/plan.json").write_text(crafted, encoding="utf-8")
    record = json.loads((shop / "target" / partial.RECORD_FILE).read_text())
    record["plan_sha256"] = hashlib.sha256(crafted.encode()).hexdigest()
    (shop / "target" / partial.RECORD_FILE).write_text(json.dumps(record))

    monkeypatch.setenv("PIPE_CACHE_DIR", str(tmp_path / "reviewer-cache"))
    code, out, err = pipe_compile(capsys, shop)
    assert code == 0 and out.startswith("Compiled shop for target dev: 2 sources, 4 tables"), out + err
    assert "prod.credentials" not in plan_text(shop)
    assert plan_text(shop) == fresh_plan(shop)


def test_a_crafted_file_record_is_not_used(shop, capsys):
    """A partial-parse record written by hand for the project's own bytes, holding a table whose
    settings were never checked (an operation pipe does not have): nothing from it is used."""
    from compiler.errors import Collector

    assert pipe_compile(capsys, shop)[0] == 0
    rel = "tables/orders.yml"
    files = ProjectFiles.read(shop)
    doc, entries = project_module._read_entries(files, rel, "tables", "sources", Collector(), project_module._check_table)
    entries = [(name, path, {**config, "operation": "truncate_everything", "description": "INJECTED"}) for name, path, config in entries]
    payload = marshal.dumps((doc.value, doc.key_pos, doc.value_pos, doc.has_templates, entries))
    crafted = marshal.dumps((partial.FILES_FORMAT, partial.code_digest(), {rel: (partial._digest(files.contents[rel]), payload)}))
    (shop / "target" / partial.FILES_RECORD).write_bytes(crafted)
    _edit(shop / "tables/customers.yml", "latest state", "newest state")  # the project changed: compiled file by file
    code, out, err = pipe_compile(capsys, shop)
    assert code == 0, out + err
    assert "INJECTED" not in plan_text(shop) and "truncate_everything" not in plan_text(shop)
    assert plan_text(shop) == fresh_plan(shop)


def test_crafted_step_texts_are_not_written_into_plan_json(shop, capsys):
    from compiler import plan as plan_module

    assert pipe_compile(capsys, shop)[0] == 0
    texts: dict[bytes, str] = {}
    plan_module.Plan.from_json(plan_text(shop)).to_json(texts)  # the digest of every step, as a compile keys them
    crafted = {k: v.replace('"sql": "', '"sql": "/* from the committed target/ */ ') for k, v in texts.items()}
    (shop / "target" / partial.STEPS_RECORD).write_bytes(marshal.dumps((partial.STEPS_FORMAT, partial.code_digest(), crafted)))
    _edit(shop / "tables/orders.sql", "lower(status)", "upper(status)")
    assert pipe_compile(capsys, shop)[0] == 0
    assert "committed target" not in plan_text(shop)
    assert plan_text(shop) == fresh_plan(shop)


def test_the_key_is_private_to_its_user_and_a_readable_one_is_not_trusted(tmp_path, monkeypatch):
    import os
    import stat

    monkeypatch.setenv("PIPE_CACHE_DIR", str(tmp_path / "cache"))
    assert cache_key.sign(b"plan") is not None
    key_file = tmp_path / "cache" / cache_key.KEY_FILE
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "cache").stat().st_mode) == 0o700
    monkeypatch.setenv("PIPE_CACHE_DIR", str(tmp_path / "shared"))
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / cache_key.KEY_FILE).write_bytes(os.urandom(32))
    os.chmod(tmp_path / "shared" / cache_key.KEY_FILE, 0o644)  # anyone could sign with it
    assert cache_key.key() is None and cache_key.sign(b"plan") is None


def test_without_a_usable_key_every_compile_is_in_full_and_nothing_is_kept(shop, tmp_path, capsys, monkeypatch, full_compiles):
    (tmp_path / "not-a-folder").write_text("a file where the cache folder would be\n")
    monkeypatch.setenv("PIPE_CACHE_DIR", str(tmp_path / "not-a-folder" / "pipe"))
    for _ in range(2):
        code, out, err = pipe_compile(capsys, shop)
        assert code == 0 and out.startswith("Compiled shop for target dev: 2 sources, 4 tables"), out + err
    assert len(full_compiles) == 2
    assert not (shop / "target" / partial.FILES_RECORD).exists() and not (shop / "target" / partial.STEPS_RECORD).exists()
    assert plan_text(shop) == fresh_plan(shop)

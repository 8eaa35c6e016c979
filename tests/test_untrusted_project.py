"""A project from an untrusted pull request: compiling it (and generating its docs) reads
nothing outside the project and writes nothing outside it. Links and special files are refused
with their place and what to do; what target/ holds is never trusted."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from pipe.cli import main
from tests.conftest import TEMPLATE

SECRET = "AKIAJ-ci-s3cr3t-Zoë"


def pipe(capsys, root: Path, *args: str) -> tuple[int, str]:
    code = main([*args, "--project-dir", str(root)])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


@pytest.fixture
def shop(tmp_path):
    root = tmp_path / "shop"
    shutil.copytree(TEMPLATE, root, ignore=shutil.ignore_patterns("lake", "target"))
    return root


@pytest.fixture
def secret_file(tmp_path):
    path = tmp_path / "outside" / "credentials"
    path.parent.mkdir()
    path.write_text(f"[default]\naws_secret_access_key = {SECRET}\n")
    return path


def nothing_secret_written(root: Path) -> None:
    for path in (root / "target").rglob("*") if (root / "target").exists() else ():
        if path.is_file() and not path.is_symlink():
            assert SECRET.encode() not in path.read_bytes(), path


def test_an_included_macro_linked_to_the_process_environment_is_refused(shop, capsys, monkeypatch):
    monkeypatch.setenv("CI_DEPLOY_TOKEN", SECRET)
    (shop / "macros/env.sql").symlink_to("/proc/self/environ")
    orders = shop / "tables/orders.sql"
    orders.write_text(orders.read_text() + "-- {% include 'macros/env.sql' %}\n")
    code, out = pipe(capsys, shop, "compile")
    assert code == 2, out
    assert "macros/env.sql:1: error: 'macros/env.sql' is a symbolic link (to /proc/self/environ)" in out
    assert "replace the link with a copy" in out and "Traceback" not in out
    assert SECRET not in out
    assert not (shop / "target/plan.json").exists()
    nothing_secret_written(shop)


@pytest.mark.parametrize("link, to_secret", [
    ("tables/orders.sql", True),  # a table's SELECT
    ("tables/extra.yml", True),  # a YAML file
    ("tests/leak.sql", True),  # a singular test
    ("pipe_project.yml", False),  # the project file, linked to a copy of itself outside
])
def test_a_linked_project_file_is_refused_and_never_read(shop, secret_file, capsys, link, to_secret):
    path = shop / link
    if to_secret:
        path.unlink(missing_ok=True)
        path.symlink_to(secret_file)
    else:
        outside = secret_file.parent / "pipe_project.yml"
        outside.write_text(path.read_text() + f"# {SECRET}\n")
        path.unlink()
        path.symlink_to(outside)
    code, out = pipe(capsys, shop, "compile")
    assert code == 2, out
    assert f"{link}:1: error: '{link}' is a symbolic link" in out
    assert SECRET not in out and not (shop / "target/plan.json").exists()
    nothing_secret_written(shop)


def test_a_linked_folder_is_refused_and_nothing_under_it_is_read(shop, tmp_path, capsys):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "leak.sql").write_text(f"select '{SECRET}' as s\n")
    (shop / "macros/shared").symlink_to(outside)
    code, out = pipe(capsys, shop, "compile")
    assert code == 2, out
    assert "macros/shared:1: error: 'macros/shared' is a symbolic link" in out
    assert SECRET not in out
    shutil.rmtree(shop / "tests")
    (shop / "tests").symlink_to(outside)  # a whole input folder
    code, out = pipe(capsys, shop, "compile")
    assert code == 2 and "tests:1: error: 'tests' is a symbolic link" in out and SECRET not in out


def test_a_named_pipe_in_the_project_is_refused_without_blocking(shop, capsys):
    os.mkfifo(shop / "macros/stream.sql")  # opening it to read would wait for a writer forever
    code, out = pipe(capsys, shop, "compile")
    assert code == 2, out
    assert "macros/stream.sql:1: error: 'macros/stream.sql' is a named pipe, not a regular file" in out


def test_a_link_in_target_is_refused_and_the_file_it_points_to_survives(shop, tmp_path, capsys):
    victim = tmp_path / "bashrc"
    victim.write_text("export PATH=$HOME/bin:$PATH\n")
    (shop / "target").mkdir()
    (shop / "target/.plan.json.tmp").symlink_to(victim)  # a compile writing through it would overwrite the victim
    code, out = pipe(capsys, shop, "compile")
    assert code == 2 and "target/.plan.json.tmp:1: error: 'target/.plan.json.tmp' is a symbolic link" in out
    assert "delete it: pipe writes target/ itself" in out
    assert victim.read_text() == "export PATH=$HOME/bin:$PATH\n"
    (shop / "target/.plan.json.tmp").unlink()
    assert pipe(capsys, shop, "compile")[0] == 0
    assert victim.read_text() == "export PATH=$HOME/bin:$PATH\n"


def test_docs_generate_removes_a_committed_link_instead_of_deleting_through_it(shop, tmp_path, capsys):
    precious = tmp_path / "thesis"
    precious.mkdir()
    for name in ("chapter1.tex", "chapter2.tex", "table.orders.html"):
        (precious / name).write_text(f"{name}: months of work\n")
    (shop / "target/docs").mkdir(parents=True)
    (shop / "target/docs/nodes").symlink_to(precious)
    (shop / "target/docs/index.html").symlink_to(precious / "chapter1.tex")
    code, out = pipe(capsys, shop, "docs", "generate", "--no-lake")
    assert code == 0, out
    assert sorted(p.name for p in precious.iterdir()) == ["chapter1.tex", "chapter2.tex", "table.orders.html"]
    assert all(p.read_text().endswith(": months of work\n") for p in precious.iterdir())
    nodes = shop / "target/docs/nodes"
    assert not nodes.is_symlink() and (nodes / "table.orders.html").is_file()
    assert not (shop / "target/docs/index.html").is_symlink() and "<html" in (shop / "target/docs/index.html").read_text()


def test_compile_of_a_project_without_links_writes_its_plan(shop, capsys):
    code, out = pipe(capsys, shop, "compile")
    assert code == 0, out
    assert json.loads((shop / "target/plan.json").read_text())["project"] == "shop"

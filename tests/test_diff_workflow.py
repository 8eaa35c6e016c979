"""The GitHub Actions workflow that `pipe init` ships (project_template/.github/workflows/pipe.yml).

Its pipe steps are taken out of the workflow file and run as GitHub runs them (bash -eo pipefail,
`${{ github.base_ref }}` filled in, GITHUB_OUTPUT and GITHUB_STEP_SUMMARY set), with `pipe` being
`python -m pipe` of this interpreter, in a git repository of a `pipe init` project holding a pull
request: `main` (pushed to a local `origin`) and a branch that changes the key of `orders`, the SQL
of `customer_revenue` and a setting of `raw_customers`. No Spark: compile and diff only."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import TEMPLATE

WORKFLOW = TEMPLATE / ".github/workflows/pipe.yml"
BASE_BRANCH = "main"
GIT = ["git", "-c", "user.email=ci@example.com", "-c", "user.name=ci", "-c", "commit.gpgsign=false", "-c", "init.defaultBranch=main"]
DIFF_COMMAND = 'pipe diff --base-ref "origin/${{ github.base_ref }}" --format markdown > pipe-diff.md'
GATE_COMMAND = 'pipe diff --base-ref "origin/${{ github.base_ref }}" --fail-on rewrite'


def _workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))


def _steps(job: str = "diff") -> list[dict]:
    return _workflow()["jobs"][job]["steps"]


def _step(step_id: str, job: str = "diff") -> dict:
    [step] = [s for s in _steps(job) if s.get("id") == step_id]
    return step


def git(cwd: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    return subprocess.run([*GIT, *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


def pipe(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipe", *args], cwd=cwd, capture_output=True, text=True)


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert old in text, f"{old!r} is not in {path}"
    path.write_text(text.replace(old, new, 1), encoding="utf-8")


# --- the repository --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def initialised(tmp_path_factory) -> Path:
    """A project made by `pipe init` (once per module; each test copies it)."""
    where = tmp_path_factory.mktemp("init")
    proc = pipe(where, "init", "shop")
    assert proc.returncode == 0, proc.stderr
    assert (where / "shop/.github/workflows/pipe.yml").read_bytes() == WORKFLOW.read_bytes()
    return where / "shop"


@pytest.fixture
def repo(initialised, tmp_path):
    """(root, base sha): `main` is the `pipe init` project, pushed to `origin` and fetched back as
    actions/checkout with fetch-depth 0 leaves it; the branch checked out changes it."""
    root = tmp_path / "shop"
    shutil.copytree(initialised, root)
    git(root, "init", "-q", "-b", BASE_BRANCH)
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "base")
    base = git(root, "rev-parse", "HEAD").strip()
    git(tmp_path, "clone", "-q", "--bare", str(root), str(tmp_path / "origin.git"))
    git(root, "remote", "add", "origin", str(tmp_path / "origin.git"))
    git(root, "fetch", "-q", "origin")
    git(root, "checkout", "-q", "-b", "change")
    return root, base


def _pull_request(root: Path) -> None:
    """The pull request: a rewrite (orders' key), a SQL change (customer_revenue) and a
    non-breaking source setting (raw_customers, upstream of customers)."""
    _edit(root / "tables/orders.yml", "key: [order_id]", "key: [order_id, region]")
    _edit(root / "tables/customer_revenue.sql", "count(o.order_id) as orders", "count(distinct o.order_id) as orders")
    _edit(root / "sources/shop.yml", "    path: data/customers\n", "    path: data/customers\n    max_files_per_run: 10\n")
    git(root, "commit", "-q", "-am", "change")


def _snapshot(root: Path) -> dict:
    """Every file of the working tree (bytes), the index, HEAD and `git status --porcelain`."""
    files = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if path.is_file() and rel.parts[0] not in (".git", "target"):
            files[rel.as_posix()] = hashlib.sha256(path.read_bytes()).hexdigest()
    return {
        "files": files,
        "index": git(root, "ls-files", "--stage"),
        "head": git(root, "rev-parse", "HEAD", "--abbrev-ref", "HEAD"),
        "status": git(root, "status", "--porcelain", "--untracked-files=all"),
        "stash": git(root, "stash", "list"),
        "worktrees": git(root, "worktree", "list", "--porcelain"),
    }


# --- running the workflow's steps ----------------------------------------------------------------


@pytest.fixture
def run_step(tmp_path):
    """run_step(root, step_id) runs the `run:` script of that workflow step as GitHub Actions'
    bash does; returns (process, $GITHUB_OUTPUT, $GITHUB_STEP_SUMMARY)."""
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "pipe").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m pipe "$@"\n', encoding="utf-8")
    (shim / "pipe").chmod(0o755)
    for job in _workflow()["jobs"].values():
        assert "working-directory" not in job.get("defaults", {}).get("run", {}), "the steps run at the project root"
    runner_temp = tmp_path / "runner-temp"
    runner_temp.mkdir()

    def run(root: Path, step_id: str, job: str = "diff", outputs: dict[str, str] | None = None):
        script = _step(step_id, job)["run"].replace("${{ github.base_ref }}", BASE_BRANCH)
        for name, value in (outputs or {}).items():  # ${{ steps.<id>.outputs.<name> }} of an earlier step
            script = script.replace("${{ steps." + name + " }}", value)
        assert "${{" not in script, f"step {step_id} uses an expression this test does not fill in: {script}"
        out, summary = tmp_path / f"{step_id}.output", tmp_path / f"{step_id}.summary"
        out.write_text("")
        summary.write_text("")
        env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
        env.update(PATH=f"{shim}{os.pathsep}{env.get('PATH', '')}", GITHUB_OUTPUT=str(out), GITHUB_STEP_SUMMARY=str(summary),
                   GITHUB_BASE_REF=BASE_BRANCH, CI="true", RUNNER_TEMP=str(runner_temp))
        proc = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script], cwd=root, env=env,
                              capture_output=True, text=True)
        return proc, out.read_text(), summary.read_text()

    return run


# --- the tests -----------------------------------------------------------------------------------


def test_the_workflow_runs_on_pull_requests_with_the_base_branch_and_no_third_party_action():
    wf = _workflow()
    text = WORKFLOW.read_text(encoding="utf-8")
    assert "pull_request" in wf.get("on", wf.get(True))  # PyYAML reads the key `on` as True
    assert wf["permissions"]["pull-requests"] == "write"
    steps = _steps()
    uses = {s["uses"].split("@")[0]: s.get("with", {}) for s in steps if "uses" in s}
    assert uses["actions/checkout"]["fetch-depth"] == 0
    assert str(uses["actions/setup-python"]["python-version"]) == "3.11"
    assert uses["actions/setup-java"] == {"distribution": "temurin", "java-version": "17"}
    assert "actions/github-script" in uses
    # the SQL checks of earlier runs are restored before compiling (only changed tables are parsed)
    assert uses["actions/cache"]["path"] == "target/sql_check_cache.json"
    assert uses["actions/cache"]["restore-keys"] == "pipe-sql-checks-"
    assert all(name.startswith("actions/") for name in uses), f"a third-party action: {sorted(uses)}"
    [install] = [s for s in steps if "pip install" in s.get("run", "")]
    assert "PLACEHOLDER" in text and "pin the pipe version" in text
    assert install["run"].strip() == "pip install pipe"
    order = [s.get("id") for s in steps]
    assert order.index("compile") < order.index("diff") < order.index("gate")
    assert _step("compile")["run"].strip() == "pipe compile"
    assert DIFF_COMMAND in _step("diff")["run"]
    assert _step("gate")["run"].strip() == GATE_COMMAND
    comment = uses["actions/github-script"]["script"]
    assert "pipe-diff.md" in comment and "updateComment" in comment and "createComment" in comment


def test_pipe_init_ships_the_workflow_and_the_project_compiles_without_warnings(initialised, tmp_path):
    root = tmp_path / "shop"
    shutil.copytree(initialised, root)
    proc = pipe(root, "compile")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # no warning
    assert (root / "target/plan.json").is_file()


def test_the_workflow_steps_on_a_pull_request(repo, run_step):
    root, _base = repo
    _pull_request(root)
    before = _snapshot(root)

    proc, _, _ = run_step(root, "compile")
    assert proc.returncode == 0, proc.stderr

    proc, outputs, summary = run_step(root, "diff")
    assert proc.returncode == 0, proc.stdout + proc.stderr  # changes do not fail this step
    assert "exit-code=1" in outputs.splitlines()
    md = (root / "pipe-diff.md").read_text(encoding="utf-8")
    assert summary == md
    assert md.startswith("### pipe diff\n")
    assert "most severe: **rewrite**" in md
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `([a-z_.]+)` \|.*$", md, re.M)}
    assert set(rows) == {"table.orders", "table.customer_revenue", "source.raw_customers", "table.customers"}
    assert rows["table.orders"].startswith("| `table.orders` | modified | **rewrite** | key: ")
    assert "after merging: `pipe run --select orders --full-refresh`" in rows["table.orders"]
    # downstream: customer_revenue changed itself (its SQL), customers only through its source
    assert rows["table.customer_revenue"].startswith("| `table.customer_revenue` | modified | non-breaking | sql: the query changed")
    assert rows["source.raw_customers"].startswith("| `source.raw_customers` | modified | non-breaking | max_files_per_run: ")
    assert rows["table.customers"] == "| `table.customers` | indirect |  | downstream of `source.raw_customers` |"
    assert "table.customers" not in md.split("<details>", 1)[1]
    assert "<details><summary>SQL changes</summary>" in md
    sql = md.split("```diff\n", 1)[1].split("\n```", 1)[0]
    assert sql.splitlines()[:2] == ["--- a/tables/customer_revenue.sql", "+++ b/tables/customer_revenue.sql"]
    assert "-    count(o.order_id) as orders," in sql.splitlines()
    assert "+    count(distinct o.order_id) as orders," in sql.splitlines()

    proc, _, _ = run_step(root, "gate")
    assert proc.returncode == 1, proc.stdout + proc.stderr  # the rewrite fails the check
    assert "table.orders  modified rewrite" in proc.stdout
    assert "after merging: pipe run --select orders --full-refresh" in proc.stdout

    after = _snapshot(root)
    assert after["status"] == before["status"] + "?? pipe-diff.md\n"  # the only new file (target/ is ignored)
    del after["files"]["pipe-diff.md"]
    assert {k: v for k, v in after.items() if k != "status"} == {k: v for k, v in before.items() if k != "status"}


def test_the_gate_passes_when_nothing_needs_a_rebuild(repo, run_step):
    root, _base = repo
    _edit(root / "tables/customer_revenue.sql", "count(o.order_id) as orders", "count(distinct o.order_id) as orders")
    git(root, "commit", "-q", "-am", "sql only")
    proc, outputs, _ = run_step(root, "diff")
    assert proc.returncode == 0 and "exit-code=1" in outputs.splitlines()
    assert "most severe: **non-breaking**" in (root / "pipe-diff.md").read_text()
    proc, _, _ = run_step(root, "gate")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_no_changes_exit_0_and_say_so(repo, run_step):
    root, _base = repo
    proc, outputs, _ = run_step(root, "diff")
    assert proc.returncode == 0 and "exit-code=0" in outputs.splitlines()
    assert (root / "pipe-diff.md").read_text() == f"### pipe diff\n\nNo changes: `working tree` does the same as `origin/{BASE_BRANCH}`.\n"
    proc, _, _ = run_step(root, "gate")
    assert proc.returncode == 0


def test_an_error_fails_the_diff_step(repo, run_step):
    root, _base = repo
    git(root, "update-ref", "-d", f"refs/remotes/origin/{BASE_BRANCH}")  # as if the base branch had not been fetched
    proc, outputs, _ = run_step(root, "diff")
    assert proc.returncode == 2
    assert "exit-code=2" in outputs.splitlines()
    assert "::error::pipe diff failed (exit code 2)" in proc.stdout
    proc, _, _ = run_step(root, "gate")
    assert proc.returncode == 2


def test_base_ref_compiles_the_commit_and_leaves_the_working_tree_and_index_alone(repo):
    """--base-ref reads the base from `git archive`: the working tree (with uncommitted and
    staged edits) is the head, and neither it, the index nor HEAD is touched."""
    root, base = repo
    _pull_request(root)
    _edit(root / "tables/customers.sql", "select", "select distinct")  # uncommitted
    _edit(root / "tables/customers.yml", "tags: [core]", "tags: [core, crm]")
    git(root, "add", "tables/customers.yml")  # staged
    (root / "scratch.txt").write_text("untracked\n")
    before = _snapshot(root)

    proc = pipe(root, "diff", "--base-ref", base, "--format", "json")
    assert proc.returncode == 1, proc.stderr
    out = json.loads(proc.stdout)
    assert out["diff_schema_version"] == 1 and out["base"] == base and out["head"] == "working tree"
    steps = {s["id"]: s for s in out["steps"]}
    assert steps["table.orders"]["class"] == "rewrite"
    assert steps["table.customers"]["status"] == "modified"  # the edits not committed are in the head
    assert {c["field"]: c["class"] for c in steps["table.customers"]["changes"]} == {"sql": "non-breaking", "tags": "metadata-only"}

    proc = pipe(root, "diff", "--base-ref", base, "--fail-on", "rewrite")
    assert proc.returncode == 1
    proc = pipe(root, "diff", "--base-ref", "HEAD", "--fail-on", "destructive")
    assert proc.returncode == 0, proc.stdout + proc.stderr  # HEAD to working tree: SQL and tags only

    assert _snapshot(root) == before


def test_the_data_job_is_off_by_default_and_never_runs_for_forks():
    job = _workflow()["jobs"]["data"]
    assert job["needs"] == "diff"
    assert job["if"] == "vars.PIPE_DATA_DIFF == 'true' && github.event.pull_request.head.repo.full_name == github.repository"
    assert set(job["env"]) == {"SHOP_LAKE_BUCKET", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}
    assert all(v.startswith("${{ secrets.") or v.startswith("${{ vars.") for v in job["env"].values())
    scripts = " ".join(s.get("run", "") for s in _steps("data"))
    assert "AWS_SECRET" not in scripts  # credentials stay in the environment, never on a command line
    uses = [s["uses"].split("@")[0] for s in _steps("data") if "uses" in s]
    assert all(name.startswith("actions/") for name in uses), uses


@pytest.mark.spark
def test_the_data_job_builds_the_modified_table_against_prod_and_gates_on_its_rows(initialised, tmp_path, run_step):
    """The `data` job's steps on a pull request that changes customer_revenue's SQL, with prod's
    lake a local folder built by `pipe run --target prod` (on the scheduler, in real life)."""
    root = tmp_path / "shop"
    shutil.copytree(initialised, root)
    project = root / "pipe_project.yml"
    text = project.read_text(encoding="utf-8")
    prod = text[text.index("  prod:"):text.index("  ci:")]
    text = text.replace(prod, '  prod:\n    lake: prodlake\n    spark:\n      master: "local[2]"\n    vars:\n      min_amount: 1\n')
    text = text.replace("        spark.jars.packages: org.apache.hadoop:hadoop-aws:3.5.0\n", "        spark.sql.shuffle.partitions: 2\n")
    project.write_text(text, encoding="utf-8")
    (root / ".gitignore").write_text((root / ".gitignore").read_text() + "prodlake/\n")
    git(root, "init", "-q", "-b", BASE_BRANCH)
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "base")
    git(tmp_path, "clone", "-q", "--bare", str(root), str(tmp_path / "origin.git"))
    git(root, "remote", "add", "origin", str(tmp_path / "origin.git"))
    git(root, "fetch", "-q", "origin")
    proc = pipe(root, "run", "--target", "prod", "-q")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    git(root, "checkout", "-q", "-b", "change")
    _edit(root / "tables/customer_revenue.sql", "count(o.order_id) as orders", "count(o.order_id) + 1 as orders")
    git(root, "commit", "-q", "-am", "one more order each")

    proc, _, _ = run_step(root, "state", "data")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc, _, _ = run_step(root, "build", "data")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "deferring to prod: customers at " in proc.stderr and "(prod's latest successful run" in proc.stderr
    built = json.loads((root / "target/run_results.json").read_text())
    assert {s["id"] for s in built["steps"] if s["kind"] == "write"} == {"table.customer_revenue"}
    assert sorted(p.name for p in (root / "target/ci-lake").iterdir() if not p.name.startswith(".")) == ["customer_revenue"]

    proc, outputs, summary = run_step(root, "data", "data")
    assert proc.returncode == 0, proc.stdout + proc.stderr  # a tripped gate does not fail this step
    assert "exit-code=1" in outputs.splitlines()
    md = (root / "pipe-data-diff.md").read_text(encoding="utf-8")
    assert summary == md and "customer_revenue" in md
    # every row's `orders` changed, and both sides read the same upstream commits (prod's, pinned)
    assert "| `customer_revenue` | 5 | 5 | 0 | 0 | 5 (100.00%) | `orders` 5 (100.00%) | same (other definition) |" in md
    assert "| `customer_id=101` | `orders` | 2 | 3 |" in md

    assert "**Data gates failed**" in md
    proc, _, _ = run_step(root, "data-gate", "data", {"data.outputs.exit-code": "1"})
    assert proc.returncode == 1, proc.stdout + proc.stderr  # every row changed: more than 1%
    [line] = proc.stdout.splitlines()
    assert line.startswith("::error::") and "customer_revenue" in line and "changed_rows" in line

    # a pull request that changes no table: nothing is built, the data diff compares nothing and passes
    git(root, "checkout", "-q", BASE_BRANCH)
    git(root, "checkout", "-q", "-b", "docs-only")
    _edit(root / "tables/orders.yml", "orders:", "orders:  # the orders")
    git(root, "commit", "-q", "-am", "a comment")
    shutil.rmtree(tmp_path / "runner-temp")  # a new job: a new runner
    (tmp_path / "runner-temp").mkdir()
    git(root, "worktree", "prune")
    for step in ("state", "build", "data"):
        proc, outputs, _ = run_step(root, step, "data")
        assert proc.returncode == 0, (step, proc.stdout + proc.stderr)
    assert "exit-code=0" in outputs.splitlines()
    assert "0 tables compared" in (root / "pipe-data-diff.md").read_text(encoding="utf-8")
    proc, _, _ = run_step(root, "data-gate", "data", {"data.outputs.exit-code": "0"})
    assert proc.returncode == 0

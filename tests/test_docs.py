"""docs/project.md documents every key of the project format (compiler/schema.py)."""

from __future__ import annotations

import re

from compiler import schema
from tests.conftest import REPO


def _sections():
    seen = {}
    stack = [schema.PROJECT, *schema.SOURCES.values(), schema.TABLE]
    while stack:
        section = stack.pop()
        if section.title in seen:
            continue
        seen[section.title] = section
        stack.extend(k.section for k in section.keys if k.section is not None)
    return seen.values()


def test_every_key_is_documented_in_a_table_row():
    text = (REPO / "docs/project.md").read_text()
    rows = set(re.findall(r"^\| `([a-z_]+)` \|", text, re.M))
    missing = sorted({f"{s.title}: {k.name}" for s in _sections() for k in s.keys if k.name not in rows})
    assert missing == []


def test_every_choice_is_documented():
    text = (REPO / "docs/project.md").read_text()
    missing = sorted({str(c) for s in _sections() for k in s.keys for c in (k.choices or ()) if f"`{c}`" not in text})
    assert missing == []


def test_readme_quickstart_has_the_two_commands_and_the_warm_loop_and_ci_runs_the_test_one():
    readme = (REPO / "README.md").read_text()
    quick = readme.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"```bash\n(.*?)\n```", quick, re.S)
    # the two set-up commands (run the example, run the tests), and between them the warm loop
    assert len(commands) == 3
    assert "pipe init" in commands[0]
    assert commands[1].strip() == "pipe server start && pipe run"
    ci = (REPO / ".ci/run").read_text()
    assert "pytest" in commands[2] and commands[2].strip() in ci

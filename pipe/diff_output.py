"""`pipe diff` output: short coloured text for a terminal, markdown for a pull-request comment,
and JSON (see docs/diff.md for its schema)."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.markup import escape

from compiler.diff import PlanDiff, StepDiff

_STYLE = {"rewrite": "bold red", "destructive": "red", "breaking": "yellow", "non-breaking": "green", "metadata-only": "dim"}
_MARK = {"added": "+", "removed": "-", "modified": "~", "indirect": "^", "unchanged": " "}


def _value(v: Any) -> str:
    if v is None:
        return "—"
    text = v if isinstance(v, str) else json.dumps(v, sort_keys=True)
    return text if len(text) <= 120 else text[:117] + "..."


def render_json(diff: PlanDiff) -> str:
    return json.dumps(diff.to_dict(), indent=2, sort_keys=True) + "\n"


def render_text(diff: PlanDiff, console: Console, show_sql: bool = True) -> None:
    if not diff.has_changes:
        console.print(f"No changes: {escape(diff.head)} does the same as {escape(diff.base)}.")
        for w in diff.warnings:
            console.print(f"[yellow]warning[/] {escape(w.step)}: {escape(w.message)}")
        return
    for c in diff.target_changes:
        console.print(f"[{_STYLE[c.cls]}]~ target {c.field}[/] ({c.cls}): {escape(_value(c.before))} -> {escape(_value(c.after))}  [dim]{escape(c.why)}[/]")
    for d in diff.changed:
        _text_step(d, console, show_sql)
    for w in diff.warnings:
        console.print(f"[yellow]warning[/] {escape(w.step)}: {escape(w.message)}")
    counts = diff.counts()
    parts = [f"{counts[k]} {k}" for k in ("added", "removed", "modified", "indirect") if counts[k]]
    worst = diff.worst()
    console.print(f"\n[bold]{', '.join(parts) or 'target settings changed'}[/]" + (f"; most severe: [{_STYLE[worst]}]{worst}[/]" if worst else ""))


def _text_step(d: StepDiff, console: Console, show_sql: bool) -> None:
    cls = f" [{_STYLE[d.cls]}]{d.cls}[/]" if d.cls else ""
    head = f"{_MARK[d.status]} {escape(d.id)}  {d.status}{cls}"
    if d.status == "indirect":
        head += f"  [dim](downstream of {escape(', '.join(d.upstream_changes))})[/]"
    console.print(head)
    for c in d.changes:
        if c.field in ("sql", "python"):
            console.print(f"    [{_STYLE[c.cls]}]{c.field}[/]: {escape(c.why)}")
        else:
            console.print(f"    [{_STYLE[c.cls]}]{escape(c.field)}[/]: {escape(_value(c.before))} -> {escape(_value(c.after))}  [dim]{escape(c.why)}[/]")
    if d.command:
        console.print(f"    [bold]after merging:[/] {escape(d.command)}")
    if show_sql and d.sql_diff:
        for line in d.sql_diff.rstrip("\n").splitlines():
            style = "green" if line.startswith("+") and not line.startswith("+++") else "red" if line.startswith("-") and not line.startswith("---") else "dim"
            console.print(f"    [{style}]{escape(line)}[/]", highlight=False)


def render_markdown(diff: PlanDiff) -> str:
    out = ["### pipe diff", ""]
    if not diff.has_changes:
        out.append(f"No changes: `{diff.head}` does the same as `{diff.base}`.")
        return "\n".join(out) + "\n"
    counts = diff.counts()
    worst = diff.worst()
    out.append(", ".join(f"**{counts[k]}** {k}" for k in ("added", "removed", "modified", "indirect") if counts[k])
               + (f"; most severe: **{worst}**" if worst else ""))
    out.append("")
    if diff.target_changes:
        out += ["| target setting | class | before | after | what it does |", "|---|---|---|---|---|"]
        out += [f"| {c.field} | {c.cls} | `{_md(_value(c.before))}` | `{_md(_value(c.after))}` | {_md(c.why)} |" for c in diff.target_changes]
        out.append("")
    out += ["| step | status | class | what changed |", "|---|---|---|---|"]
    for d in diff.changed:
        what = "; ".join(_md(f"{c.field}: {c.why}") for c in d.changes) or (
            "downstream of " + ", ".join(f"`{u}`" for u in d.upstream_changes) if d.status == "indirect" else "")
        if d.command:
            what += f"<br>after merging: `{d.command}`"
        out.append(f"| `{d.id}` | {d.status} | {('**' + d.cls + '**') if d.cls in ('rewrite', 'destructive') else (d.cls or '')} | {what} |")
    if diff.warnings:
        out += ["", "**Warnings**", ""]
        out += [f"- `{w.step}`: {_md(w.message)}" for w in diff.warnings]
    sql = [d for d in diff.changed if d.sql_diff]
    if sql:
        out += ["", "<details><summary>SQL changes</summary>", ""]
        for d in sql:
            out += [f"`{d.id}`", "", "```diff", d.sql_diff.rstrip("\n"), "```", ""]
        out.append("</details>")
    return "\n".join(out) + "\n"


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")

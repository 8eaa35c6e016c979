"""`pipe diff --data` output: text for a terminal, a markdown section to append to the
pull-request comment of `pipe diff --format markdown`, and JSON (docs/diff.md, "Data diff")."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.markup import escape

from runtime.data_diff import DataDiff, Inputs, TableDataDiff

_STATUS = {"only_in_base": "only in {base}", "only_in_head": "only in {head}", "in_neither": "built in neither {base} nor {head}"}
_WIDTH = 60  # a sample value longer than this is shortened in text and markdown


def render_json(diff: DataDiff) -> str:
    return json.dumps(diff.to_dict(), indent=2, sort_keys=True, default=str) + "\n"


# --- text ----------------------------------------------------------------------------------------


def render_text(diff: DataDiff, console: Console) -> None:
    b, h = diff.base, diff.head
    for t in diff.tables:
        if t.status != "compared":
            mark = {"only_in_base": "-", "only_in_head": "+", "in_neither": "?"}[t.status]
            console.print(f"[{'dim' if t.status == 'in_neither' else 'yellow'}]{mark} {escape(t.table)}[/]  "
                          + escape(_STATUS[t.status].format(base=b, head=h)))
            continue
        _text_table(t, b, h, console)
    console.print("")
    console.print(f"[bold]{escape(_summary(diff))}[/]")
    for why in diff.failures:
        console.print(f"[bold red]gate failed[/] {escape(why)}")


def _text_table(t: TableDataDiff, b: str, h: str, console: Console) -> None:
    same = not t.has_differences
    console.print(f"{'=' if same else '~'} [bold]{escape(t.table)}[/]  {t.base_rows:,} rows in {escape(b)}, {t.head_rows:,} in {escape(h)}"
                  + ("  [green]no differences[/]" if same else ""))
    if not same:
        console.print("    " + escape(_counts(t)))
    for c in t.columns:
        if c.mismatches:
            reach = f"  [dim]reaches {escape(', '.join(c.reaches))}[/]" if c.reaches else ""
            console.print(f"    [yellow]{escape(c.name)}[/]: {c.mismatches:,} mismatch{'es' if c.mismatches != 1 else ''} "
                          f"({_pct(c.rate)} of the keys on both sides){reach}")
    for name in t.added_columns:
        console.print(f"    [green]+ column {escape(name)}[/] only in {escape(h)} (not compared)")
    for name in t.dropped_columns:
        console.print(f"    [red]- column {escape(name)}[/] only in {escape(b)} (not compared)")
    for note in t.notes:
        console.print(f"    [dim]note: {escape(note)}[/]")
    if t.inputs is not None:
        console.print(f"    inputs: {escape(_inputs(t.inputs, b, h))}")
    for kind, rows in t.samples.items():
        if not rows:
            continue
        total = {"added": t.added_rows, "removed": t.removed_rows, "changed": t.changed_rows}[kind] or 0
        first = f" (the first {len(rows)}{' by key' if t.join_on else ''})" if total > len(rows) else ""
        console.print(f"    [dim]{kind}{first}:[/]")
        for r in rows:
            console.print("      " + escape(_changed_text(r, t.join_on) if kind == "changed" else _row_text(r)), soft_wrap=True)


def _counts(t: TableDataDiff) -> str:
    parts = [f"+{t.added_rows:,} added", f"-{t.removed_rows:,} removed"]
    if t.changed_rows is not None:
        parts.append(f"~{t.changed_rows:,} changed ({_pct(_rate(t.changed_rows, t.base_rows))} of {t.base_rows:,})")
    parts.append(f"{t.unchanged_rows:,} unchanged")
    if t.moved_rows:
        parts.append(f"{t.moved_rows:,} moved to another partition")
    return ", ".join(parts)


def _summary(diff: DataDiff) -> str:
    n = diff.counts()
    out = f"{n['compared']} table{'s' if n['compared'] != 1 else ''} compared, {n['different']} with differences"
    extra = [f"{n[k]} {_STATUS[k].format(base=diff.base, head=diff.head)}" for k in ("only_in_base", "only_in_head", "in_neither") if n[k]]
    return out + (f"; {', '.join(extra)}" if extra else "") + f" ({diff.base} -> {diff.head})"


def _inputs(i: Inputs, b: str, h: str) -> str:
    if i.same is None:
        return f"cannot tell whether they were built from the same inputs: {i.unknown}"
    definition = {True: " by the same definition", False: " but by a different definition (step fingerprint)", None: ""}[i.same_definition]
    if i.same:
        return f"built from the same inputs{definition}"
    return "inputs differ: " + "; ".join(f"{c.name} {_read(c.base, c.base_from)} in {b}, {_read(c.head, c.head_from)} in {h}" for c in i.changes) + (
        f"; built{definition}" if definition else "")


def _read(checkpoint: str | None, where: str) -> str:
    from runtime.table.history import short_checkpoint

    if checkpoint is None:
        return "not read"
    return f"at {short_checkpoint(checkpoint)}" + (f" (from {where})" if where else "")


def _row_text(r: dict[str, Any]) -> str:
    return ", ".join(f"{k}={_short(v)}" for k, v in r.items())


def _key(r: dict[str, Any], keys) -> str:
    return ", ".join(f"{k}={r[k]}" for k in keys if k in r)


def _changed_text(r: dict[str, Any], keys) -> str:
    key = _key(r, keys)
    diffs = "; ".join(f"{k}: {' -> '.join(_pair(v['base'], v['head']))}" for k, v in r.items() if k not in keys)
    return f"{key}  {diffs}"


def _pair(base: Any, head: Any, show=None) -> tuple[str, str]:
    """Two values of a changed column as shown; texts that print alike (another Unicode form of
    the same letters, e.g. é as one code point or as e and a combining accent) with escapes."""
    import unicodedata

    show = show or _short
    if isinstance(base, str) and isinstance(head, str) and unicodedata.normalize("NFC", base) == unicodedata.normalize("NFC", head):
        return _cut(ascii(base)), _cut(ascii(head))
    return show(base), show(head)


def _short(v: Any) -> str:
    """A value as text shows it: strings quoted (as Python writes them), null, anything else as Spark gives it."""
    return _cut("null" if v is None else repr(v) if isinstance(v, str) else str(v))


def _cell(v: Any) -> str:
    """A value in a markdown cell: strings as they are, null in italics."""
    return "_null_" if v is None else _cut(str(v))


def _cut(text: str) -> str:
    return text if len(text) <= _WIDTH else text[:_WIDTH - 3] + "..."


def _pct(rate: float | None) -> str:
    if rate is None:
        return "—"
    pct = rate * 100
    return f"{pct:.2f}%" if pct >= 0.01 or pct == 0 else "<0.01%"


def _rate(n: int | None, of: int | None) -> float | None:
    return None if n is None or not of else n / of


# --- markdown ------------------------------------------------------------------------------------


def render_markdown(diff: DataDiff) -> str:
    b, h = diff.base, diff.head
    out = [f"### pipe diff --data `{b}` → `{h}`", "", _md(_summary(diff)), ""]
    compared = [t for t in diff.tables if t.status == "compared"]
    if compared:
        out += [f"| table | rows {_md(b)} | rows {_md(h)} | added | removed | changed | columns with mismatches | inputs |",
                "|---|---:|---:|---:|---:|---:|---|---|"]
        for t in compared:
            cols = "<br>".join(f"`{_md(c.name)}` {c.mismatches:,} ({_pct(c.rate)})"
                               + (" → " + ", ".join(f"`{_md(r)}`" for r in c.reaches) if c.reaches else "") for c in t.columns if c.mismatches)
            cols += "".join(f"<br>+ `{_md(n)}` (only in {_md(h)})" for n in t.added_columns)
            cols += "".join(f"<br>− `{_md(n)}` (only in {_md(b)})" for n in t.dropped_columns)
            changed = "—" if t.changed_rows is None else f"{t.changed_rows:,} ({_pct(_rate(t.changed_rows, t.base_rows))})"
            out.append(f"| `{_md(t.table)}` | {t.base_rows:,} | {t.head_rows:,} | {t.added_rows:,} | {t.removed_rows:,} | {changed} | "
                       f"{cols.removeprefix('<br>') or '—'} | {_md(_inputs_short(t.inputs))} |")
    others = [t for t in diff.tables if t.status != "compared"]
    if others:
        out += [""] + [f"- `{_md(t.table)}`: {_STATUS[t.status].format(base=b, head=h)}" for t in others]
    failures = diff.failures
    if failures:
        out += ["", "**Data gates failed**", ""] + [f"- {_md(why)}" for why in failures]
    notes = [(t.table, n) for t in compared for n in t.notes]
    if notes:
        out += ["", "<details><summary>Notes</summary>", ""] + [f"- `{_md(t)}`: {_md(n)}" for t, n in notes] + ["", "</details>"]
    with_samples = [t for t in compared if any(t.samples.values())]
    if with_samples:
        out += ["", "<details><summary>Sample rows</summary>", ""]
        for t in with_samples:
            out += _md_samples(t, b, h)
        out.append("</details>")
    return "\n".join(out) + "\n"


def _inputs_short(i: Inputs | None) -> str:
    if i is None:
        return "—"
    if i.same is None:
        return "unknown"
    if i.same:
        return "same" + (" (other definition)" if i.same_definition is False else "")
    return "differ: " + ", ".join(c.name for c in i.changes)


def _md_samples(t: TableDataDiff, b: str, h: str) -> list[str]:
    out = []
    for kind in ("added", "removed"):
        rows = t.samples.get(kind) or ()
        if not rows:
            continue
        names = list(dict.fromkeys(k for r in rows for k in r))
        out += [f"`{_md(t.table)}` {kind} ({len(rows)} of {getattr(t, kind + '_rows'):,})", "",
                "| " + " | ".join(_md(n) for n in names) + " |", "|" + "---|" * len(names)]
        out += ["| " + " | ".join(_md(_cell(r.get(n))) for n in names) + " |" for r in rows]
        out.append("")
    rows = t.samples.get("changed") or ()
    if rows:
        out += [f"`{_md(t.table)}` changed ({len(rows)} of {t.changed_rows:,})", "",
                f"| key | column | {_md(b)} | {_md(h)} |", "|---|---|---|---|"]
        for r in rows:
            key = _key(r, t.join_on)
            for col, v in r.items():
                if col not in t.join_on:
                    base, head = _pair(v["base"], v["head"], _cell)
                    out.append(f"| `{_md(key)}` | `{_md(col)}` | {_md(base)} | {_md(head)} |")
        out.append("")
    return out


def _md(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")

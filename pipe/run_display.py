"""What `pipe run` shows while it runs: a live table of steps on a terminal, a line per finished
step in logs (CI), one JSON object per event with `--log-format json`, and a summary."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from runtime.executor import RunResult, StepResult

_STYLE = {
    "pending": ("·", "dim"), "running": ("▶", "cyan"), "success": ("✓", "green"), "no_input": ("=", "dim"),
    "would_run": ("→", "cyan"), "error": ("✗", "bold red"), "skipped": ("-", "yellow"), "cancelled": ("✗", "yellow"),
    "warn": ("!", "yellow"),
}
_LABEL = {"no_input": "no new input", "would_run": "would run"}
_TEST_LABEL = {"success": "pass", "error": "fail", "warn": "warn"}
_SUMMARY = {"success": "succeeded", "error": "failed", "no_input": "no new input", "would_run": "would run", "cancelled": "cancelled",
            "warn": "succeeded with a warning"}
_TEST_SUMMARY = {"success": "passed", "error": "failed", "warn": "warned"}


def _label(r: StepResult) -> str:
    return (_TEST_LABEL.get(r.state) if r.kind in ("test", "unit") else None) or _LABEL.get(r.state, r.state)


def summary(steps: list[StepResult]) -> str:
    """`2 succeeded, 1 no new input, 9 tests passed, 1 test failed`."""
    counts: dict[tuple[bool, str], int] = {}
    for r in steps:
        key = (r.kind in ("test", "unit"), r.state)
        counts[key] = counts.get(key, 0) + 1
    parts = []
    for (is_test, state), n in sorted(counts.items()):
        if is_test:
            parts.append(f"{n} test{'s' if n != 1 else ''} {_TEST_SUMMARY.get(state, _SUMMARY.get(state, state))}")
        else:
            parts.append(f"{n} {_SUMMARY.get(state, state)}")
    return ", ".join(parts)


def _num(v: int | None) -> str:
    return "" if v is None else f"{v:,}"


def _read(r: StepResult) -> str:
    """What a step read: its rows, or what it says it read (files, a table's instant)."""
    return escape(r.read) if r.read is not None else (_num(r.rows_read) or "-")


def _iud(r: StepResult) -> str:
    if r.inserts is None:
        return ""
    return f"{r.inserts:,}/{r.updates:,}/{r.deletes:,}"


def _duration(r: StepResult, now: float, starts: dict[str, float]) -> str:
    if r.elapsed_s is not None:
        return f"{r.elapsed_s:.1f}s"
    if r.id in starts:
        return f"{now - starts[r.id]:.0f}s"
    return ""


def steps_table(results: list[StepResult], starts: dict[str, float], title: str | None = None) -> Table:
    t = Table(title=title, title_justify="left", show_edge=False, pad_edge=False, box=None, header_style="bold")
    for col, justify in (("", "left"), ("step", "left"), ("state", "left"), ("read", "right"), ("written", "right"),
                         ("ins/upd/del", "right"), ("time", "right"), ("detail", "left")):
        t.add_column(col, justify=justify, no_wrap=col != "detail", overflow="fold")
    now = time.perf_counter()
    for r in results:
        mark, style = _STYLE.get(r.state, ("?", ""))
        detail = r.message or ""
        t.add_row(Text(mark, style=style), r.id, Text(_label(r), style=style), r.read or _num(r.rows_read),
                  _num(r.rows_written), _iud(r), _duration(r, now, starts), Text(detail, style="dim" if r.state != "error" else ""))
    return t


class Display:
    """Receives the executor's events (from its threads) and renders them."""

    def __init__(self, console: Console, err: Console, results_order: list[StepResult] | None = None,
                 mode: str = "text", quiet: bool = False):
        self.console = console
        self.err = err
        self.mode = mode
        self.quiet = quiet
        self.results: dict[str, StepResult] = {}
        self.order: list[str] = []
        self.starts: dict[str, float] = {}
        self._lock = threading.Lock()
        self.live: Live | None = None

    def begin(self, step_ids: list[str], kinds: dict[str, tuple[str, str]]) -> None:
        for sid in step_ids:
            kind, name = kinds[sid]
            self.results[sid] = StepResult(sid, kind, name)
            self.order.append(sid)
        if self.mode == "text" and not self.quiet and self.console.is_terminal:
            self.live = Live(self._render(), console=self.console, refresh_per_second=4, transient=True,
                             get_renderable=self._render)
            self.live.start()

    def _render(self):
        return steps_table([self.results[s] for s in self.order], self.starts)

    def __call__(self, event: str, result: StepResult) -> None:
        with self._lock:
            self.results[result.id] = result
            if event == "start":
                self.starts[result.id] = time.perf_counter()
            if self.mode == "json":
                self.console.file.write(json.dumps({"event": f"step_{event}", "time": time.time(), **result.to_dict()}, sort_keys=True, default=str) + "\n")
                self.console.file.flush()
            elif event == "end" and self.live is None and not self.quiet:
                mark, style = _STYLE.get(result.state, ("?", ""))
                counts = ""
                if result.rows_read is not None or result.read is not None or result.rows_written is not None:
                    counts = f"  read {_read(result)}  written {_num(result.rows_written) or '-'}"
                if result.inserts is not None:
                    counts += f" (ins {result.inserts:,} upd {result.updates:,} del {result.deletes:,})"
                took = f"  {result.elapsed_s:.1f}s" if result.elapsed_s is not None else ""
                self.console.print(f"[{style}]{mark}[/] {escape(result.id)}  [{style}]{_label(result)}[/]"
                                   f"{counts}{took}  [dim]{escape(result.message or '')}[/]")

    def end(self, run: RunResult, extra: dict[str, Any]) -> None:
        if self.live is not None:
            self.live.stop()
        counts = run.counts()
        said = summary(run.steps)
        if self.mode == "json":
            self.console.file.write(json.dumps({"event": "run_end", "time": time.time(), "elapsed_s": run.elapsed_s,
                                                "success": not run.failed, "counts": counts, **extra}, sort_keys=True) + "\n")
            self.console.file.flush()
        else:
            outcome = "Interrupted" if run.interrupted else "Failed" if run.failed else "Done"
            line = f"[bold]{outcome}[/] in {run.elapsed_s:.1f}s: {escape(said)}"
            if not self.quiet:
                self.console.print(Group(steps_table(run.steps, self.starts, title=None)) if self.live is not None else "")
                self.console.print(line)
            else:  # --quiet: the one-line summary alone; on stderr when the run did not succeed
                (self.err if run.failed or run.interrupted else self.console).print(line)
        if self.mode != "json":
            # one failure shared by several steps (Spark did not start, the executors' Python
            # cannot run pipe's tasks) is said once, naming them all
            errors: dict[tuple[str, str | None], list[str]] = {}
            for r in run.steps:
                if r.state == "error":
                    errors.setdefault((r.message or "", r.hint), []).append(r.id)
            for (message, hint), ids in errors.items():
                self.err.print(f"[bold red]error[/] in {escape(', '.join(ids))}: {escape(message)}")
                if hint:
                    self.err.print(f"  [dim]hint:[/] {escape(hint)}")
            for r in run.steps:  # a table whose commit stands but whose catalog sync failed
                if r.kind == "write" and r.state == "warn":
                    self.err.print(f"[yellow]warning[/] in {escape(r.id)}: {escape(r.message or '')}")
                    if r.hint:
                        self.err.print(f"  [dim]hint:[/] {escape(r.hint)}")
            for r in run.steps:  # a unit test's rows that differ from what it expects
                if r.kind == "unit" and r.samples and r.state == "error":
                    from runtime.steps.unit import diff_lines

                    self.err.print(f"[bold red]fail[/] {escape(r.id)}: {escape(r.message or '')}:")
                    for line in diff_lines(r.samples):
                        self.err.print("  " + escape(line), soft_wrap=True)
            for r in run.steps:  # the failing rows of tests, a few each
                if r.kind == "test" and r.samples and r.state in ("error", "warn"):
                    out = self.err if r.state == "error" else self.console
                    out.print(f"[{'bold red' if r.state == 'error' else 'yellow'}]{_label(r)}[/] {escape(r.id)}: {escape(r.message or '')}; "
                              f"{'the first' if r.failures and r.failures > len(r.samples) else 'the'} failing row{'s' if len(r.samples) != 1 else ''}:")
                    for row in r.samples:
                        out.print("  " + escape(", ".join(f"{k}={v!r}" for k, v in row.items())), soft_wrap=True)

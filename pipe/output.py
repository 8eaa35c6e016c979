"""Terminal output: diagnostics on stderr, results on stdout, through rich (colour only on a
terminal, plain text in CI logs and pipes)."""

from __future__ import annotations

import sys
from typing import Iterable

from rich.console import Console
from rich.markup import escape

from compiler.errors import Diagnostic

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def diagnostics(items: Iterable[Diagnostic], wrote_nothing: bool = False) -> None:
    items = list(items)
    for d in items:
        colour = "red" if d.severity == "error" else "yellow"
        err.print(f"[bold]{escape(str(d.location))}[/]: [bold {colour}]{d.severity}[/]: {escape(d.message)}")
        if d.hint:
            err.print(f"  [dim]hint:[/] {escape(d.hint)}")
    n_err = sum(1 for d in items if d.severity == "error")
    if n_err:
        tail = "; nothing was written." if wrote_nothing else "."
        err.print(f"[bold red]{n_err} error{'s' if n_err != 1 else ''}[/] found{tail}")


def fail(message: str, hint: str | None = None) -> None:
    err.print(f"[bold red]error[/]: {escape(message)}")
    if hint:
        err.print(f"  [dim]hint:[/] {escape(hint)}")


def line(text: str = "") -> None:
    out.print(text)


def table(renderable) -> None:
    """A rich table; outside a terminal at the width its rows need, never cropped or wrapped
    (a Console caps `print(width=...)` at its own width, 80 columns in a pipe)."""
    if out.is_terminal:
        out.print(renderable)
        return
    wide = Console(width=2000, highlight=False, color_system=None, soft_wrap=True)
    with wide.capture() as captured:
        wide.print(renderable)
    sys.stdout.write("".join(line.rstrip() + "\n" for line in captured.get().splitlines()))


def plain(text: str) -> None:
    """Unstyled output for machine consumption (`pipe ls`)."""
    sys.stdout.write(text + "\n")

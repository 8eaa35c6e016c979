"""Terminal output: diagnostics on stderr, results on stdout, through rich (colour only on a
terminal, plain text in CI logs and pipes).

rich costs about 25 ms to import, which `pipe compile` writing to a CI log has no use for, so it
is imported on first use: `out` and `err` are made when first asked for, and `line()` writes a
line whose only markup is a few style tags to a pipe or file itself, as rich would print it
there (`_plain`)."""

from __future__ import annotations

import builtins
import os
import re
import sys
from typing import TYPE_CHECKING, Iterable

from compiler.errors import Diagnostic

if TYPE_CHECKING:
    from rich.console import Console

_consoles: dict[str, Console] = {}


def __getattr__(name: str):
    """`output.out` (stdout) and `output.err` (stderr), rich Consoles made on first use."""
    if name in ("out", "err"):
        return _console(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _console(name: str) -> Console:
    console = _consoles.get(name)
    if console is None:
        from rich.console import Console

        console = _consoles[name] = Console(stderr=name == "err", highlight=False, soft_wrap=True)
    return console


def diagnostics(items: Iterable[Diagnostic], wrote_nothing: bool = False) -> None:
    from rich.markup import escape

    items = list(items)
    err = _console("err")
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
    from rich.markup import escape

    err = _console("err")
    err.print(f"[bold red]error[/]: {escape(message)}")
    if hint:
        err.print(f"  [dim]hint:[/] {escape(hint)}")


def line(text: str = "") -> None:
    plain = _plain(text, sys.stdout)
    if plain is None:
        _console("out").print(text)
    else:
        sys.stdout.write(plain)
        sys.stdout.flush()


# The style tags `_plain` removes; any other `[` or `]` may be markup, and leaves the line to rich.
_STYLE_TAG = re.compile(r"\[(?:/|(?:bold |dim )?(?:bold|dim|green|yellow|red))\]")
# rich would replace an emoji code (`:smile:`), strip control characters or encode for the stream
_RICH_TEXT = re.compile(r"[^\x20-\x7e]|\\|:\S*:")


def _plain(text: str, stream) -> str | None:
    """`text` (rich markup) as rich prints it to `stream` when that is not a terminal (no
    styles, no wrapping with soft_wrap), or None when only rich can say: the stream is a
    terminal or the environment makes rich treat it as one (FORCE_COLOR, TTY_COMPATIBLE,
    Jupyter), or the text holds markup beyond plain style tags, an emoji code, a backslash or
    anything but printable ASCII."""
    isatty = getattr(stream, "isatty", None)
    try:
        if isatty is None or isatty():
            return None
    except ValueError:  # a closed stream: rich's business
        return None
    if "FORCE_COLOR" in os.environ or "TTY_COMPATIBLE" in os.environ or hasattr(builtins, "get_ipython"):
        return None
    stripped = _STYLE_TAG.sub("", text)
    if "[" in stripped or "]" in stripped or _RICH_TEXT.search(stripped):
        return None
    return stripped + "\n"


def table(renderable) -> None:
    """A rich table; outside a terminal at the width its rows need, never cropped or wrapped
    (a Console caps `print(width=...)` at its own width, 80 columns in a pipe)."""
    from rich.console import Console

    out = _console("out")
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


class Row(tuple):
    """A struct value as Spark's collect() gives it (pyspark's Row, which a tuple is too):
    printed `Row(a=1, b='x')`, a JSON list of its values."""

    def __new__(cls, items: dict):
        row = super().__new__(cls, items.values())
        row._names = list(items)
        return row

    def __repr__(self) -> str:
        return "Row(" + ", ".join(f"{n}={v!r}" for n, v in zip(self._names, self)) + ")"

    __str__ = __repr__


def spark_value(value, arrow_type):
    """A value pyarrow read (`to_pylist`) as the Python value Spark's collect() gives for the
    same column, so that rows read without Spark print the same: a TIMESTAMP (given as a
    datetime or as its count of `unit`s since the epoch) in this process's local time without
    a time zone, TIMESTAMP_NTZ as its wall time, BINARY as bytearray, a MAP as a dict, a
    STRUCT as a Row."""
    import datetime as dt

    import pyarrow as pa

    if value is None:
        return None
    t = arrow_type
    if pa.types.is_timestamp(t):
        # microseconds since the epoch (an int), or a datetime (inside a list or struct)
        if isinstance(value, dt.datetime):
            epoch = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc if value.tzinfo else None)
            micros = (value - epoch) // dt.timedelta(microseconds=1)
        else:
            micros = value // 1000 if t.unit == "ns" else value * {"s": 1_000_000, "ms": 1000, "us": 1}[t.unit]
        if t.tz is None:  # TIMESTAMP_NTZ: the wall time as stored
            return dt.datetime.fromtimestamp(micros // 1_000_000, dt.timezone.utc).replace(microsecond=micros % 1_000_000, tzinfo=None)
        return dt.datetime.fromtimestamp(micros // 1_000_000).replace(microsecond=micros % 1_000_000)
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return bytearray(value)
    if pa.types.is_map(t):
        return {spark_value(k, t.key_type): spark_value(v, t.item_type) for k, v in value}
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return [spark_value(v, t.value_type) for v in value]
    if pa.types.is_struct(t):
        return Row({t.field(i).name: spark_value(value.get(t.field(i).name), t.field(i).type) for i in range(t.num_fields)})
    return value


# --- secrets -----------------------------------------------------------------------------------
# Every value an env_var() gives a setting or an option (the target's lake, Spark master and
# conf, its catalog, every source's and table's options) is a secret as far as output goes: the
# plan holds only `${env:NAME}` placeholders, the values are read from the environment by the
# runtime, and whatever pipe prints or writes (the console, --log-format json, run_results.json,
# a traceback with --debug) shows `****` in their place, Spark's own error messages included.
# Values shorter than MIN_SECRET characters are left alone: masking `1` or `EU` would mask every
# such text of the output and no secret is that short.

MASK = "****"
MIN_SECRET = 4
_secrets: list[str] = []  # longest first, with their JSON-escaped forms


def hide_secrets(plan, environ=None) -> None:
    """Masks, from now on, the environment's values of the env_var() placeholders in `plan`'s
    settings and options (their defaults are written in the project: not secret)."""
    import json

    from compiler.render import ENV_PLACEHOLDER_RE

    environ = os.environ if environ is None else environ
    texts = [json.dumps(plan.target.to_dict(), sort_keys=True, default=str)]
    texts += [json.dumps(s.config, sort_keys=True, default=str) for s in plan.steps]
    names = {m.group(1) for text in texts for m in ENV_PLACEHOLDER_RE.finditer(text)}
    values = {environ[n] for n in names if len(environ.get(n) or "") >= MIN_SECRET}
    forms = set(_secrets)
    for v in values:
        forms |= {v, json.dumps(v)[1:-1], json.dumps(v, ensure_ascii=True)[1:-1]}
    _secrets[:] = sorted(forms, key=len, reverse=True)


def forget_secrets() -> None:
    _secrets.clear()


def mask(text: str) -> str:
    """`text` with every secret value replaced by MASK."""
    for s in _secrets:
        if s in text:
            text = text.replace(s, MASK)
    return text


class MaskingStream:
    """A text stream (sys.stdout, sys.stderr) that writes through `mask`; everything else is the
    stream's own (isatty, fileno, encoding: rich and click see the stream they expect)."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(mask(text) if _secrets and isinstance(text, str) else text)
        return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)

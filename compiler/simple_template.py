"""A fast path for the SQL templates most projects are made of: plain text with expressions
such as `{{ ref('orders') }}`, `{{ var('min_amount', 0) }}`, `{{ money('amount') }}`,
`{{ this }}` or `{{ target.name }}`.

Compiling a template with Jinja costs about a millisecond (lexer, parser, code generation and
Python's compile()), which dominates `pipe compile` on large projects. Like dbt's static
parser, we recognise the simple subset ourselves and evaluate its expressions by calling the very
same functions Jinja would. Anything outside the subset (tags, comments, filters, whitespace
control, operators, unknown names) goes to Jinja, so behaviour and error messages do not depend
on which path a template took; a test renders a corpus both ways and compares."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Any, Callable

_EXPRESSION = re.compile(r"\{\{(.*?)\}\}", re.S)
_LITERAL_NAMES = {"true": True, "false": False, "none": None, "True": True, "False": False, "None": None}


@dataclass(frozen=True)
class _Expr:
    line: int
    kind: str  # "call" | "name" | "attr"
    name: str
    args: tuple = ()
    kwargs: tuple = ()
    attr: str | None = None


def _literal(node: ast.AST) -> tuple[bool, Any]:
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, int, float)) and not isinstance(node.value, bool):
        return True, node.value
    if isinstance(node, ast.Name) and node.id in _LITERAL_NAMES:
        return True, _LITERAL_NAMES[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant) and type(node.operand.value) in (int, float):
        return True, -node.operand.value
    return False, None


def _expression(text: str, line: int) -> _Expr | None:
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        return None
    if isinstance(node, ast.Name) and node.id not in _LITERAL_NAMES:
        return _Expr(line, "name", node.id)
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and not node.attr.startswith("_"):
        return _Expr(line, "attr", node.value.id, attr=node.attr)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        args = []
        for a in node.args:
            ok, value = _literal(a)
            if not ok:
                return None
            args.append(value)
        kwargs = []
        for k in node.keywords:
            ok, value = _literal(k.value)
            if not ok or k.arg is None:
                return None
            kwargs.append((k.arg, value))
        return _Expr(line, "call", node.func.id, tuple(args), tuple(kwargs))
    return None


class SimpleTemplate:
    """A template in the simple subset; `parse` returns None for any other text."""

    def __init__(self, name: str, parts: list[str | _Expr]):
        self.name = name
        self.parts = parts

    @classmethod
    def parse(cls, name: str, text: str) -> "SimpleTemplate | None":
        # Jinja tags, comments and newline normalisation are Jinja's job.
        if "{%" in text or "{#" in text or "\r" in text:
            return None
        parts: list[str | _Expr] = []
        pos = 0
        for m in _EXPRESSION.finditer(text):
            inner = m.group(1)
            if inner.startswith(("-", "+")) or inner.endswith("-") or "{{" in inner:
                return None
            expr = _expression(inner, text.count("\n", 0, m.start()) + 1)
            if expr is None:
                return None
            parts.append(text[pos:m.start()])
            parts.append(expr)
            pos = m.end()
        if "{{" in text[pos:]:
            return None  # unclosed: Jinja reports the syntax error
        parts.append(text[pos:])
        return cls(name, parts)

    @staticmethod
    def to_data(template: "SimpleTemplate | None") -> tuple:
        """What `parse` found, in plain values (for compiler/partial.py's cache): a template's
        parts, or that the text is Jinja's."""
        if template is None:
            return ("jinja",)
        return ("simple", [p if isinstance(p, str) else (p.line, p.kind, p.name, p.args, p.kwargs, p.attr) for p in template.parts])

    @classmethod
    def from_data(cls, name: str, data: tuple) -> "SimpleTemplate | None":
        """The inverse of `to_data` (TypeError, ValueError or IndexError for anything it did not give)."""
        if data == ("jinja",):
            return None
        tag, parts = data
        if tag != "simple":
            raise ValueError(tag)
        return cls(name, [p if isinstance(p, str) else _Expr(p[0], p[1], p[2], tuple(p[3]), tuple(tuple(kw) for kw in p[4]), p[5])
                          for p in parts])

    def names(self) -> set[str]:
        return {p.name for p in self.parts if isinstance(p, _Expr)}

    def render(self, lookup: Callable[[str], Any], at_line: Callable[[int], None]) -> str:
        """`lookup(name)` gives a global (a function or value); `at_line(n)` is told the
        template line before each expression runs, for error positions."""
        out = []
        for part in self.parts:
            if isinstance(part, str):
                out.append(part)
                continue
            at_line(part.line)
            value = lookup(part.name)
            if part.kind == "call":
                value = value(*part.args, **dict(part.kwargs))
            elif part.kind == "attr":
                value = value[part.attr] if isinstance(value, dict) else getattr(value, part.attr)
            out.append(str(value))
        return "".join(out)

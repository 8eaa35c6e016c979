"""Python models: a table whose rows come from a Python function, `tables/<name>.py`.

    from pipe.model import ref, source

    def model(orders=ref("orders"), customers=source("raw_customers"), spark=None, this=None):
        return orders.join(customers, "customer_id")

The compiler reads the file with `ast` and never runs it (`pipe compile`, `ls`, `diff` and
`docs` run on untrusted pull requests): the inputs are the parameters whose defaults are
`ref("...")` or `source("...")` calls with a literal name, so the graph is known from the text.
Two parameters more may be asked for by name: `spark` (the step's SparkSession) and `this` (the
table's current rows, or None on a first build or a full refresh). The module's whole text goes
into the plan, so its fingerprint changes with any edit and `pipe diff` shows the change; the
runtime runs that text (runtime/steps/python_model.py), not the file."""

from __future__ import annotations

import ast
from dataclasses import dataclass

from compiler.errors import Collector, Location, did_you_mean

FUNCTION = "model"
EXTRAS = ("spark", "this")  # parameters asked for by name, not inputs


@dataclass(frozen=True)
class Input:
    param: str
    kind: str  # "table" (ref) | "source"
    name: str
    location: Location


@dataclass(frozen=True)
class PythonModel:
    inputs: tuple[Input, ...]
    extras: tuple[str, ...]  # of EXTRAS, those model() asks for
    line: int  # where `def model` is written


def read(rel: str, text: str, errors: Collector) -> PythonModel | None:
    """What `text` (the file `rel`) declares, or None with every mistake reported at its line."""
    try:
        tree = ast.parse(text, filename=rel)
    except SyntaxError as exc:
        errors.error(Location(rel, exc.lineno or 1, exc.offset), f"Python syntax error: {exc.msg}", "fix the file: pipe reads it as Python 3")
        return None
    except (RecursionError, MemoryError):  # an expression nested beyond what the parser takes
        errors.error(Location(rel, 1), "the file is nested too deeply for Python's parser", "split the expressions")
        return None
    defs = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == FUNCTION]
    if not defs:
        errors.error(Location(rel, 1), f"{rel} defines no top-level `def {FUNCTION}(...)`",
                     f"a Python model is a function `def {FUNCTION}(orders=ref(\"orders\")):` returning a DataFrame; "
                     "code shared by several models belongs in a package installed beside pipe")
        return None
    if len(defs) > 1:
        errors.error(Location(rel, defs[1].lineno), f"`def {FUNCTION}` is defined twice (first at line {defs[0].lineno})", "keep one")
    fn = defs[0]
    if isinstance(fn, ast.AsyncFunctionDef):
        errors.error(Location(rel, fn.lineno), f"`{FUNCTION}` must be a plain function, not `async def`", "remove `async`")
    args = fn.args
    for bad, what in ((args.vararg, "*args"), (args.kwarg, "**kwargs")):
        if bad is not None:
            errors.error(Location(rel, bad.lineno, bad.col_offset + 1), f"`{FUNCTION}` cannot take {what}: pipe passes each input by name",
                         "name each input: `orders=ref(\"orders\")`")
    positional = args.posonlyargs + args.args
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    params = list(zip(positional, defaults)) + list(zip(args.kwonlyargs, args.kw_defaults))
    inputs: list[Input] = []
    extras: list[str] = []
    seen: dict[tuple[str, str], str] = {}
    for arg, default in params:
        where = Location(rel, arg.lineno, arg.col_offset + 1)
        if arg.arg in args_of(args.posonlyargs):
            errors.error(where, f"parameter '{arg.arg}' is positional-only: pipe passes each input by name", "remove the `/`")
        if arg.arg in EXTRAS and (default is None or _is_none(default)):
            extras.append(arg.arg)
            continue
        declared = _input_call(default)
        if declared is None:
            errors.error(where, f"parameter '{arg.arg}' of {FUNCTION}() is not an input",
                         f"give it a default `ref(\"table\")` or `source(\"source\")` with the name written out, "
                         f"or name it one of: {', '.join(EXTRAS)}")
            continue
        kind, name, call = declared
        at = Location(rel, call.lineno, call.col_offset + 1)
        if name is None:
            errors.error(at, f"parameter '{arg.arg}': {'ref' if kind == 'table' else 'source'}() takes one name written as a string",
                         "write the name out, e.g. ref(\"orders\"): pipe reads the graph without running the file")
            continue
        if (kind, name) in seen:
            errors.error(at, f"parameter '{arg.arg}' reads {kind} '{name}', which parameter '{seen[kind, name]}' reads already", "keep one")
            continue
        seen[kind, name] = arg.arg
        inputs.append(Input(arg.arg, kind, name, at))
    return PythonModel(tuple(inputs), tuple(extras), fn.lineno)


def args_of(args: list[ast.arg]) -> set[str]:
    return {a.arg for a in args}


def _is_none(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def _input_call(node: ast.expr | None):
    """("table"|"source", name or None, the call) when `node` is `ref(...)`/`source(...)`
    (also `pipe.model.ref(...)`), else None."""
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
    if called not in ("ref", "source"):
        return None
    kind = "table" if called == "ref" else "source"
    if len(node.args) == 1 and not node.keywords and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
        return kind, node.args[0].value, node
    return kind, None, node


def check_inputs(model: PythonModel, owner: str, tables, sources, errors: Collector) -> None:
    """Reports an input that names no table or source, as ref()/source() in SQL do."""
    for i in model.inputs:
        if i.kind == "table":
            if i.name == owner:
                errors.error(i.location, f"table '{owner}' reads itself with ref('{owner}')", "ask for its current rows with a parameter named `this`")
            elif i.name not in tables:
                hint = (f"'{i.name}' is a source: use source(\"{i.name}\")" if i.name in sources else did_you_mean(i.name, tables)) \
                    or "declare it in tables/*.yml or add tables/<name>.sql"
                errors.error(i.location, f"ref(\"{i.name}\"): no table named '{i.name}'", hint)
        elif i.name not in sources:
            hint = (f"'{i.name}' is a table: use ref(\"{i.name}\")" if i.name in tables else did_you_mean(i.name, sources)) \
                or "declare it in sources/*.yml"
            errors.error(i.location, f"source(\"{i.name}\"): no source named '{i.name}'", hint)


def signature(model: PythonModel) -> dict:
    """What the runtime needs to call model(): each parameter and what it is bound to."""
    return {"inputs": {i.param: i.name for i in model.inputs}, "extras": list(model.extras), "line": model.line}

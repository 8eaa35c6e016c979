"""The names a table's SQL uses, so that the views of the merge-on-read tables it reads carry
only the columns it can refer to.

Spark cannot push a query's columns into the merge of a merge-on-read table's log files (a
Python task, reader.read_merged_slices), so a view of such a table would merge every column
of every row. `names_used` reads the rendered SQL with sqlglot (Spark dialect) and returns
every identifier in it, lower-case: a column the SQL refers to in any way (qualified, through
an alias, as a struct field's parent, in a subquery) is among them, whatever relation sqlglot
thinks it belongs to. It returns None, and the views keep every column, when the SQL may read
columns it does not name: a `*` (other than `count(*)`), a NATURAL join, a statement sqlglot
does not fully parse. The step runs the SQL on the full views if it fails on the pruned ones."""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=64)
def _parsed(text: str | None) -> tuple | None:
    """sqlglot's trees of `text` (Spark dialect; none for an empty text), or None when it does
    not parse; a step's SQL is read once for its names and its filters. The trees are only read."""
    import sqlglot
    from sqlglot.errors import SqlglotError

    if not text or not text.strip():
        return ()
    try:
        return tuple(t for t in sqlglot.parse(text, read="spark") if t is not None)
    except (SqlglotError, ValueError, RecursionError):
        return None


def names_used(texts: list[str]) -> frozenset[str] | None:
    """Every identifier of the SQL `texts` (lower-case), or None when they may read columns
    they do not name."""
    from sqlglot import exp

    names: set[str] = set()
    for text in texts:
        trees = _parsed(text)
        if trees is None:
            return None
        for tree in trees:
            if not isinstance(tree, exp.Query) or tree.find(exp.Command) is not None:
                return None
            for star in tree.find_all(exp.Star):
                if not isinstance(star.parent, exp.Count):
                    return None
            for join in tree.find_all(exp.Join):
                if (join.args.get("method") or "").upper() == "NATURAL":
                    return None
            names.update(i.name.lower() for i in tree.find_all(exp.Identifier))
    return frozenset(names)


def expression_names(texts: list[str]) -> frozenset[str] | None:
    """names_used for SQL expressions (a filter, an expectation), each read as `select <it>`."""
    return names_used([f"SELECT {t}" for t in texts if t])


# --- filters a view can take ---------------------------------------------------------------------

_OPS = {"EQ": "=", "GT": ">", "GTE": ">=", "LT": "<", "LTE": "<="}
_FLIPPED = {"=": "=", ">": "<", ">=": "<=", "<": ">", "<=": ">="}


def view_filters(texts: list[str], views: list[str]) -> dict[str, tuple]:
    """Conditions on a view's columns that every row of it the SQL `texts` can use meets, by
    view (lower-case name): what a read of the view may skip partitions by
    (runtime/table/partition_pruning.py). Each is (column, op, values): op one of = > >= < <=,
    `in` (values: the list), `between` (low, high) or `is null`; a value is (kind, text), kind
    `string`, `number` or `date`. Spark still applies the whole query to the rows read.

    A view takes the conditions of the WHERE clause of the one SELECT that reads it: the
    top-level conjuncts comparing one of its columns (qualified by its name or alias, or
    unqualified when it is that SELECT's only relation) with literals. Such a condition is false
    for a null, so it drops the same rows before a join as after it, whichever side of an outer
    join the view is on; IS NULL, true for a null, is taken only from a SELECT without outer
    joins. Nothing is taken for a view read twice (a self-join, two subqueries), a name a CTE
    shadows, a view sampled, pivoted or with renamed columns, or SQL sqlglot does not fully
    parse; no string or date is taken from SQL with a backslash or a double quote."""
    from sqlglot import exp

    wanted = {v.lower() for v in views}
    # a string's value is sqlglot's reading of it, which is Spark's by default; with a backslash
    # (spark.sql.parser.escapedStringLiterals) or a double quote (spark.sql.ansi.
    # doubleQuotedIdentifiers) in the SQL it may not be the session's: no string is taken then
    strings = not any(t and ("\\" in t or '"' in t) for t in texts)
    found: dict[str, list] = {}
    uses: dict[str, int] = {}
    for text in texts:
        trees = _parsed(text)
        if trees is None:
            return {}
        for tree in trees:
            if tree.find(exp.Command) is not None:
                return {}
            for cte in tree.find_all(exp.CTE):
                wanted.discard(cte.alias_or_name.lower())
            for table in tree.find_all(exp.Table):
                name = table.name.lower()
                if name not in wanted or table.args.get("db") or table.args.get("catalog"):
                    continue
                uses[name] = uses.get(name, 0) + 1
                found[name] = [c for c in _conditions(exp, table)
                               if strings or all(kind == "number" for kind, _ in c[2])]
    return {name: tuple(conds) for name, conds in found.items() if name in wanted and uses[name] == 1 and conds}


def _conditions(exp, table) -> list:
    """The conditions on `table`'s columns in the WHERE clause of the SELECT whose FROM or JOIN it is."""
    extra = {k for k, v in table.args.items() if v and k not in ("this", "alias")}
    alias = table.args.get("alias")
    if extra or (alias is not None and alias.args.get("columns")):
        return []
    holder = table.parent
    select = holder.parent if isinstance(holder, (exp.From, exp.Join)) else None
    if not isinstance(select, exp.Select) or select.args.get("where") is None:
        return []
    alone = not select.args.get("joins") and not select.args.get("laterals")
    # IS NULL is true for the null-extended rows of an outer join: on its null-supplying side,
    # fewer rows read would mean more rows without a match, which the condition keeps
    outer = any((j.args.get("side") or "") for j in select.args.get("joins") or [])
    qualifier = table.alias_or_name.lower()
    out = []
    for cond in _conjuncts(exp, select.args["where"].this):
        said = _condition(exp, cond)
        if said is None or (said[1] == "is null" and outer):
            continue
        column, op, values = said
        named_by = column.table.lower() if column.table else None
        if (named_by == qualifier or (named_by is None and alone)) and not column.args.get("db"):
            out.append((column.name.lower(), op, values))
    return out


def _conjuncts(exp, node) -> list:
    while isinstance(node, exp.Paren):
        node = node.this
    if isinstance(node, exp.And):
        return _conjuncts(exp, node.this) + _conjuncts(exp, node.expression)
    return [node]


def _condition(exp, node):
    """(column, op, values) of `column op literal` (either way round), `column IN (literals)`,
    `column BETWEEN literal AND literal` or `column IS NULL`; None for anything else."""
    name = type(node).__name__
    if name in _OPS:
        left, right, op = node.this, node.expression, _OPS[name]
        if isinstance(right, exp.Column) and not isinstance(left, exp.Column):
            left, right, op = right, left, _FLIPPED[op]
        value = _literal(exp, right)
        return (left, op, (value,)) if isinstance(left, exp.Column) and value is not None else None
    if isinstance(node, exp.In) and isinstance(node.this, exp.Column) and not node.args.get("query") and not node.args.get("unnest"):
        values = [_literal(exp, v) for v in node.expressions]
        return (node.this, "in", tuple(values)) if values and None not in values else None
    if isinstance(node, exp.Between) and isinstance(node.this, exp.Column):
        low, high = _literal(exp, node.args.get("low")), _literal(exp, node.args.get("high"))
        return (node.this, "between", (low, high)) if low is not None and high is not None else None
    if isinstance(node, exp.Is) and isinstance(node.this, exp.Column) and isinstance(node.expression, exp.Null):
        return (node.this, "is null", ())
    return None


def _literal(exp, node):
    """(kind, text) of a string or number literal (a negative number too) or DATE 'yyyy-mm-dd'."""
    if isinstance(node, exp.Literal):
        return ("string" if node.is_string else "number", node.this)
    if isinstance(node, exp.Neg) and isinstance(node.this, exp.Literal) and not node.this.is_string:
        return ("number", f"-{node.this.this}")
    if isinstance(node, exp.Cast) and isinstance(node.this, exp.Literal) and node.this.is_string and node.to.this == exp.DataType.Type.DATE:
        return ("date", node.this.this)
    return None

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


def names_used(texts: list[str]) -> frozenset[str] | None:
    """Every identifier of the SQL `texts` (lower-case), or None when they may read columns
    they do not name."""
    import sqlglot
    from sqlglot import exp
    from sqlglot.errors import SqlglotError

    names: set[str] = set()
    for text in texts:
        if not text or not text.strip():
            continue
        try:
            trees = [t for t in sqlglot.parse(text, read="spark") if t is not None]
        except (SqlglotError, ValueError, RecursionError):
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

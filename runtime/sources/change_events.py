"""What every change-event format shares (`format: debezium`, `format: dms`): the columns each
change adds to its row, and how a decoder reports a message it cannot apply.

A format's `decoder()` returns the function the executors call on each message with a value
(kafka.fetch): `decode(value, key)` gives (the row as JSON text with the columns below, its
columns as JSON `[[name, Spark type], ...]` or None), None for a message that holds no row (a
control record: counted and skipped), or raises BadEvent with the reason (a bad record: the step
stops, drops it or dead-letters it, naming topic, partition and offset)."""

from __future__ import annotations

import datetime as dt

from compiler.columns import CDC_COLUMNS

OP, POSITION, TS, TABLE, IS_DELETED = CDC_COLUMNS
CDC_DDL = f"`{OP}` STRING, `{POSITION}` STRING, `{TS}` TIMESTAMP, `{TABLE}` STRING, `{IS_DELETED}` BOOLEAN"
OPS = ("c", "u", "d", "r")  # insert, update, delete, a row read by a snapshot (Debezium's letters)
FORMATS = ("debezium", "dms")

_EPOCH = dt.datetime(1970, 1, 1)


class BadEvent(ValueError):
    """A message that is not a change event pipe can apply; the text is the reason."""


def iso_millis(ms: int) -> str:
    return (_EPOCH + dt.timedelta(milliseconds=int(ms))).isoformat() + "Z"


DECODED = ("debezium", "dms", "avro")  # formats a decoder turns into JSON rows in the executors (kafka.fetch)


def decoder(fmt: str, registry=None):
    """The decoder of format `fmt` (one of DECODED); `registry`: avro.registry_settings."""
    if fmt == "dms":
        from runtime.sources import dms

        return dms.decoder()
    if fmt == "avro":
        from runtime.sources import avro

        return avro.decoder(registry)
    from runtime.sources import debezium

    return debezium.decoder(registry)

"""The `.cdc` log files of CDC-enabled tables (runtime/table/cdc_log.py) against files Hudi 0.15.0
and 1.1.1 wrote (tests/fixtures/cdc): pipe decodes them, builds the same record schema from the
table's schema, and encodes the same block bytes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runtime.table import cdc_log
from runtime.table.logfile import CDC, SCHEMA, Block, encode_block, read_blocks

FIXTURES = Path(__file__).parent / "fixtures" / "cdc"
CASES = [  # file, mode, its name in the table, the records it holds
    ("hudi-0.15.0_data_before_after.cdc", cdc_log.DATA_BEFORE_AFTER,
     ".8cc588fb-9491-43a7-81d2-a185e8e2e8e1-0_20261202212124045.log.1_0-120-118.cdc",
     [{"op": "d", "ts_ms": "20261202212124045", "before": {"id": "id1", "name": "a2", "price": 1.5, "ts": 2, "part": "p1"}, "after": None}]),
    ("hudi-0.15.0_op_key_only.cdc", cdc_log.OP_KEY_ONLY,
     ".1bc066c2-41ef-4d68-9a25-a26cd8394016-0_20261202211247502.log.1_0-663-670.cdc", [{"op": "d", "record_key": "id1"}]),
    ("hudi-1.1.1_data_before.cdc", cdc_log.DATA_BEFORE,
     ".c5af82e4-58ec-49fb-b371-f255b07630d7-0_20261202211321022.log.1_0-889-1228.cdc",
     [{"op": "u", "record_key": "id2", "before": {"id": "id2", "name": "b", "price": 2.0, "ts": 1, "part": "p1"}}]),
]


def table_schema(java_schema: dict) -> dict:
    """The table's writer schema (record `<table>_record` in namespace `hoodie.<table>`) that
    Java's CDC schema was built from: its `before` image, with the CDC record's namespace."""
    before = next(f for f in java_schema["fields"] if f["name"] == "before")["type"][1]
    return {**before, "namespace": java_schema["namespace"]}


@pytest.mark.parametrize("name,mode,original,expected", CASES, ids=[c[0] for c in CASES])
def test_pipe_reads_and_writes_the_cdc_files_hudi_writes(name, mode, original, expected):
    data = (FIXTURES / name).read_bytes()
    assert cdc_log.records(data) == expected
    (java,) = read_blocks(data)
    assert java.type == CDC
    java_schema = json.loads(java.header[SCHEMA])
    ours = cdc_log.schema(mode, table_schema(java_schema) if mode != cdc_log.OP_KEY_ONLY else {})
    assert ours == java_schema
    if mode != cdc_log.OP_KEY_ONLY:  # Java prints it compactly, as pipe does
        assert json.dumps(ours, separators=(",", ":")) == java.header[SCHEMA]
    file_id, instant = cdc_log.parse_name(original)
    token = original.split(".log.1_")[1][: -len(".cdc")]
    assert cdc_log.file_name(file_id, instant, token) == original
    block = cdc_log.block(instant, java_schema, expected)
    assert block.content == java.content
    assert encode_block(Block(CDC, java.header, block.content)) == data  # the header's order is Java's hash map's
    assert cdc_log.records(cdc_log.encode(instant, ours, expected)) == expected


def test_the_mode_a_table_declares():
    assert cdc_log.mode_of({}) is None and cdc_log.mode_of({cdc_log.ENABLED: "false", cdc_log.MODE: "OP_KEY_ONLY"}) is None
    assert cdc_log.mode_of({cdc_log.ENABLED: "true"}) == cdc_log.DATA_BEFORE_AFTER  # Hudi's default
    assert cdc_log.mode_of({cdc_log.ENABLED: "TRUE", cdc_log.MODE: "data_before"}) == cdc_log.DATA_BEFORE
    assert cdc_log.mode_of({cdc_log.ENABLED: "true", cdc_log.MODE: "cdc_op_key"}) == cdc_log.OP_KEY_ONLY  # Hudi 0.13's spelling
    with pytest.raises(ValueError, match="KEYS_AND_MORE is not a mode Hudi knows"):
        cdc_log.mode_of({cdc_log.ENABLED: "true", cdc_log.MODE: "KEYS_AND_MORE"})
    assert cdc_log.parse_name(".abc-0_20261202211247502.log.1_0-1-2") is None  # a data log file, not a .cdc

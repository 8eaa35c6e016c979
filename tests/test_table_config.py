"""hoodie.properties: what pipe writes, what it reads back, and which tables it will not write."""

from __future__ import annotations

import zlib

from runtime.table.config import TableConfig, parse_properties

BASE = "hoodie.table.name=x\nhoodie.table.type=COPY_ON_WRITE\nhoodie.table.recordkey.fields=id\n"


def test_properties_round_trip_with_checksum():
    config = TableConfig(name="orders", record_key_fields=("a", "b"), partition_fields=("region",), precombine_field="ts")
    props = parse_properties(config.to_properties())
    assert props["hoodie.table.checksum"] == str(zlib.crc32(b"default.orders"))
    assert props["hoodie.table.keygenerator.class"] == "org.apache.hudi.keygen.ComplexKeyGenerator"
    assert props["hoodie.record.merge.mode"] == "EVENT_TIME_ORDERING"
    again = TableConfig.from_properties(config.to_properties())
    assert (again.record_key_fields, again.partition_fields, again.precombine_field) == (("a", "b"), ("region",), "ts")
    assert again.unwritable_reason() is None


def test_tables_pipe_will_not_write_say_why():
    keygen = "hoodie.table.keygenerator.class=org.apache.hudi.keygen."
    assert "TimestampBasedKeyGenerator" in TableConfig.from_properties(BASE + keygen + "TimestampBasedKeyGenerator\n").unwritable_reason()
    assert "without meta fields" in TableConfig.from_properties(BASE + keygen + "SimpleKeyGenerator\nhoodie.populate.meta.fields=false\n").unwritable_reason()
    assert "metadata table" in TableConfig.from_properties(BASE + keygen + "SimpleKeyGenerator\nhoodie.table.metadata.partitions=files\n").unwritable_reason()
    mor = BASE.replace("COPY_ON_WRITE", "MERGE_ON_READ") + keygen + "SimpleKeyGenerator\n"
    assert TableConfig.from_properties(mor).unwritable_reason() is None
    payload = "hoodie.compaction.payload.class=org.apache.hudi.common.model.OverwriteNonDefaultsWithLatestAvroPayload\n"
    assert "OverwriteNonDefaultsWithLatestAvroPayload" in TableConfig.from_properties(mor + payload).unwritable_reason()

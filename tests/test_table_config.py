"""hoodie.properties: what pipe writes, what it reads back, and which tables it will not write."""

from __future__ import annotations

import zlib

from runtime.table.config import TableConfig, parse_properties, store_properties

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
    # a metadata table is retired before a change (test_metadata_table.py), not a reason to refuse
    assert TableConfig.from_properties(BASE + keygen + "SimpleKeyGenerator\nhoodie.table.metadata.partitions=files\n").unwritable_reason() is None
    mor = BASE.replace("COPY_ON_WRITE", "MERGE_ON_READ") + keygen + "SimpleKeyGenerator\n"
    assert TableConfig.from_properties(mor).unwritable_reason() is None
    payload = "hoodie.compaction.payload.class=org.apache.hudi.common.model.OverwriteNonDefaultsWithLatestAvroPayload\n"
    assert "OverwriteNonDefaultsWithLatestAvroPayload" in TableConfig.from_properties(mor + payload).unwritable_reason()


# --- the file's encoding: java.util.Properties ---------------------------------------------------

# What Java's Properties.store writes for these values (saveConvert: `\\`, `=`, `:`, `#`, `!`
# escaped, a leading space escaped, everything outside printable ASCII as \\uXXXX in UTF-16).
JAVA_STORED = r"""hoodie.table.create.schema={"type"\:"record","name"\:"orders_record"}
k=a\=b\:c\#d\!e\\f caf\u00E9 \u20AC \uD83D\uDE00
my\ key=\ leading space, tab\tand newline\n
"""


def test_properties_are_stored_as_java_stores_them():
    props = {"hoodie.table.create.schema": '{"type":"record","name":"orders_record"}',
             "k": "a=b:c#d!e\\f café € \U0001F600", "my key": " leading space, tab\tand newline\n"}
    text = store_properties(props, "Properties saved on 2026-11-24T03:00:00.000Z")
    lines = text.splitlines()
    assert lines[0] == "#Properties saved on 2026-11-24T03:00:00.000Z" and lines[1].startswith("#")
    assert "\n".join(lines[2:]) + "\n" == JAVA_STORED
    text.encode("ascii")  # ISO-8859-1 output that is plain ASCII: the same bytes whoever decodes them
    assert parse_properties(text) == props


def test_every_java_escape_is_read():
    text = ("# comment\n! also a comment\nhoodie.table.name=orders\nplain:colon\nspaced value here\n"
            "cont=first \\\n    second\nuni=\\u00e9t\\u00E9\\tend\nodd\\=key=v\\:w\\#x\\!y\\\\z\n")
    assert parse_properties(text) == {"hoodie.table.name": "orders", "plain": "colon", "spaced": "value here",
                                      "cont": "first second", "uni": "été\tend", "odd=key": "v:w#x!y\\z"}


def test_create_schema_is_written_with_escaped_colons_as_the_java_fixtures_have_it():
    schema = '{"type":"record","name":"orders_record","namespace":"hoodie.orders","fields":[]}'
    text = TableConfig(name="orders", record_key_fields=("id",), create_schema=schema).to_properties()
    assert 'hoodie.table.create.schema={"type"\\:"record","name"\\:"orders_record","namespace"\\:"hoodie.orders","fields"\\:[]}' in text.splitlines()
    assert TableConfig.from_properties(text).create_schema == schema

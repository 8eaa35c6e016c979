"""The Hudi-format table engine (table version 6, timeline layout 1). Modules follow the
format's own concepts: config (hoodie.properties), timeline (instants), layout (file groups and
slices), schema, files (executor-side write I/O), writer (the write path), reader, table (the API)."""

from runtime.table.config import COPY_ON_WRITE, MERGE_ON_READ, TableConfig
from runtime.table.table import LockTimeout, Table, TableError, WriteResult
from runtime.table.errors import WriteError

__all__ = ["COPY_ON_WRITE", "MERGE_ON_READ", "LockTimeout", "Table", "TableConfig", "TableError", "WriteError", "WriteResult"]

"""Content hashes of what a phase reads and writes: tables (over their Arrow buffers) and JSON values."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pyarrow as pa


def table_hash(table: pa.Table) -> str:
    """Content hash of a table: sha256 over its schema and each column's Arrow buffers.

    Columns are combined into one chunk with no offset first, so the same values always give
    the same buffers; hashing the buffers in place avoids serialising a copy of the table.
    """
    h = hashlib.sha256(table.schema.to_string().encode())
    h.update(str(table.num_rows).encode())
    for column in table.columns:
        chunks = column.chunks
        array = chunks[0] if len(chunks) == 1 else column.combine_chunks()
        if len(chunks) == 0:
            continue
        if array.offset:
            array = pa.concat_arrays([array])  # materialise a sliced array at offset 0
        _hash_array(h, array)
    return h.hexdigest()


def _hash_array(h: Any, array: pa.Array) -> None:
    h.update(b"|")
    for buf in array.buffers():
        if buf is None:
            h.update(b"-")
        else:
            h.update(memoryview(buf))
    # Nested types (list<string>) carry their children's buffers in array.buffers() already.


def hash_json(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()

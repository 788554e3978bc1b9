"""A decision taken once per kind of call: a bounded table of plans.

A quantize of a 1 x 64 tensor costs the C kernel well under a microsecond; what costs is what
the host works out around it (output shapes, the kernel's arguments, checks). Those depend only
on the call's kind (shapes, dtypes, format, block size, modes), so they are worked out once and
looked up after. The table is bounded: inputs of ever new shapes (a server's prompt lengths)
make it start over rather than grow.
"""

__all__ = ["memo", "MEMO_LIMIT"]

MEMO_LIMIT = 4096  # entries a table holds at most before it starts over


def memo(table: dict, key, make):
    """table[key], made by `make()` on the first call with that key; the table starts over once
    it holds MEMO_LIMIT entries."""
    value = table.get(key)
    if value is None:
        if len(table) >= MEMO_LIMIT:
            table.clear()
        value = table[key] = make()
    return value

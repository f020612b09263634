"""The data loaders' one error and their field checks: every failure names the dataset, the row, the field, what was
expected and what was found (``klear_lib.data.hub``, ``klear_lib.data.code_tests``, ``klear_lib.evaluation``)."""

from __future__ import annotations

from typing import Any


class SchemaError(ValueError):
    """A row (or the whole dataset) does not match the schema its loader expects."""




def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _wrong(ds: str, row: int, field: str, expected: str, value: Any) -> SchemaError:
    if value is None:
        return SchemaError(f"{ds} row {row}: field '{field}' is missing or null; expected {expected}")
    return SchemaError(f"{ds} row {row}: field '{field}' must be {expected}, "
                       f"got {type(value).__name__} ({_show(value)})")


def _is(value: Any, typ: type) -> bool:
    # bool is an int subclass; a verdict where a count is expected (or the reverse) is a schema error.
    if typ is int and isinstance(value, bool):
        return False
    return isinstance(value, typ)


def _field(record: dict, path: str, typ: type | tuple[type, ...], ds: str, row: int) -> Any:
    """``record[a][b]...`` for ``path == "a.b"``, checked to be an instance of ``typ``."""
    value: Any = record
    walked: list[str] = []
    for key in path.split("."):
        if walked and not isinstance(value, dict):
            raise _wrong(ds, row, ".".join(walked), "dict", value)
        value = value.get(key)
        walked.append(key)
    types = typ if isinstance(typ, tuple) else (typ,)
    if value is None or not any(_is(value, t) for t in types):
        raise _wrong(ds, row, path, " or ".join(t.__name__ for t in types), value)
    return value


def _typed_list(record: dict, field: str, ds: str, row: int, *, item: type = str) -> list:
    values = _field(record, field, list, ds, row)
    for j, v in enumerate(values):
        if v is None or not _is(v, item):
            raise _wrong(ds, row, f"{field}[{j}]", item.__name__, v)
    return values


def _messages(record: dict, field: str, ds: str, row: int, *, role_key: str = "role",
              content_key: str = "content") -> list[dict]:
    """A non-empty list of messages, each reduced to ``{"role", "content"}`` (both str)."""
    values = _field(record, field, list, ds, row)
    if not values:
        raise SchemaError(f"{ds} row {row}: field '{field}' must be a non-empty list of messages, got []")
    out = []
    for j, msg in enumerate(values):
        if not isinstance(msg, dict):
            raise _wrong(ds, row, f"{field}[{j}]", "dict", msg)
        role, content = msg.get(role_key), msg.get(content_key)
        if not isinstance(role, str):
            raise _wrong(ds, row, f"{field}[{j}].{role_key}", "str", role)
        if not isinstance(content, str):
            raise _wrong(ds, row, f"{field}[{j}].{content_key}", "str", content)
        out.append({"role": role, "content": content})
    return out

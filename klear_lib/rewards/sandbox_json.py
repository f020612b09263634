"""What a sandboxed program sends back, decoded on the host without trusting it, and compared with big integers.

A function-call test's return value comes out of the sandbox as one record, ``json <text>`` or ``repr <text>``
(see `sandbox_zygote`). The program can write anything there, so `decode_result` treats the bytes as hostile:
they are bounded in size by the sandbox's output cap, and every way a decode can fail (not one record, invalid
UTF-8, malformed JSON, nesting deeper than `MAX_DEPTH`, memory) becomes a `Decoded` that says why, never an
exception. Nesting is measured before the decode with a linear scan, so the C decoder's recursion is never
near the host's recursion limit (or its C stack, should someone have raised that limit). Every step is linear
in the record, whatever it holds (1 MiB of 4,000-digit integers decodes in ~0.03 s of CPU; tests pin 0.05 s).

Big integers. Python refuses to turn more than ``sys.int_max_str_digits`` (4,300) decimal digits into an int,
because the conversion is quadratic, and the limit is process-wide, so the judge cannot lift it (verl calls it
from threads). An integer of more than `LONG_DIGITS` digits is therefore kept as a `LongInt` holding its digit
string: decoding one is linear, and it compares equal to an int or a `LongInt` of the same value (through
``decimal.Decimal``, exact and unlimited; the int side is the trusted expected value, converted only when the
digit counts can match). `normalize_expected` turns a test's expected value into the same shape as a decoded
result (tuples as lists, dict keys as JSON writes them, huge ints as `LongInt`), and `loads` reads JSON text
(e.g. a record's tests) with huge ints as `LongInt` instead of raising.
"""

from __future__ import annotations

import decimal
import json
import math
import reprlib
from dataclasses import dataclass

#: Most nesting levels of lists and dicts a result may have (deeper: wrong, "too deeply nested").
MAX_DEPTH = 200
#: Integers with more decimal digits than this are `LongInt` (below Python's default limit of 4,300).
LONG_DIGITS = 4000
_LOG10_2 = math.log10(2)
# A run of more than LONG_DIGITS digits, found in C in linear time: every digit byte becomes b"d" and every other
# byte a space (UTF-8 never puts an ASCII digit inside a multi-byte character), then a substring search (CPython's
# two-way search for long needles: linear, no backtracking). A regex [0-9]{4001} instead retries from every digit
# of a shorter run: quadratic, 4.5 s of CPU per MiB of 4,000-digit integers.
_DIGIT_BYTES = bytes(ord("d") if ord("0") <= b <= ord("9") else ord(" ") for b in range(256))
_LONG_RUN = b"d" * (LONG_DIGITS + 1)
_STEPS = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")  # brackets as signed bytes: +1 opens, -1 closes
_DEPTH_CHUNK = 1 << 20  # brackets summed per numpy call (4 bytes of running sums each: no overflow)
_BRACKETS = bytes(range(256)).translate(None, b"[]{}")  # every byte but the four brackets: deleted by translate


class LongInt:
    """An integer of more than `LONG_DIGITS` decimal digits, kept as its digits (see the module docstring)."""

    __slots__ = ("text", "_decimal")

    def __init__(self, text: str):
        self.text = text
        self._decimal = None

    @property
    def digits(self) -> int:
        return len(self.text) - self.text.startswith("-")

    def decimal(self) -> decimal.Decimal:
        if self._decimal is None:
            self._decimal = decimal.Decimal(self.text)  # linear in the digits, exact, no int conversion limit
        return self._decimal

    def __eq__(self, other):
        if isinstance(other, LongInt):
            return self.text == other.text
        if isinstance(other, bool):
            return False
        if isinstance(other, int):
            # A cheap count first (bit length -> digits within one), so that an untrusted LongInt never makes us
            # convert a trusted int of a very different size; then the exact comparison.
            if abs(int_digits_estimate(other) - self.digits) > 1:
                return False
            return self.decimal() == decimal.Decimal(other)
        if isinstance(other, float):
            return math.isfinite(other) and self.decimal() == decimal.Decimal(other)
        return NotImplemented

    def __hash__(self):
        return hash(self.decimal())  # equal to the hash of the int of the same value

    def __repr__(self):
        return f"<int of {self.digits} digits: {self.text[:12]}...{self.text[-6:]}>"


def int_digits_estimate(n: int) -> int:
    """Decimal digits of |n|, within one, from its bit length (no conversion)."""
    return max(1, int(abs(n).bit_length() * _LOG10_2) + 1)


def _int_or_long(text: str):
    if len(text) - text.startswith("-") > LONG_DIGITS:
        return LongInt(text)
    try:
        return int(text)
    except ValueError:  # this process lowered int_max_str_digits below LONG_DIGITS
        return LongInt(text)


def has_long_run(data: bytes) -> bool:
    """Whether ``data`` holds more than `LONG_DIGITS` consecutive ASCII digits (linear, in C)."""
    return _LONG_RUN in data.translate(_DIGIT_BYTES)


def loads(text: str | bytes):
    """``json.loads``, except that integers of more than `LONG_DIGITS` digits become `LongInt`, whatever this
    Python's own limit (the fast C path unless the text holds such a run of digits; then a hook per integer)."""
    return _loads(text, text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass"))


def _loads(text: str | bytes, data: bytes):
    """`loads` of ``text``, whose UTF-8 (or own) bytes are ``data``."""
    if not has_long_run(data):
        try:
            return json.loads(text)
        except ValueError as e:
            if "integer string conversion" not in str(e):
                raise
    return json.loads(text, parse_int=_int_or_long)


def depth(data: bytes) -> int:
    """Deepest nesting of lists and dicts in JSON text, brackets inside strings not counted; linear, in C (the
    running count of brackets in numpy, a chunk at a time: ~5 ms per MiB of brackets). Escaped backslashes go
    first, then escaped quotes, and what is left between quotes is string: exact on valid JSON, and on any prefix
    the decoder accepts before it fails."""
    if data.count(b"[") + data.count(b"{") <= MAX_DEPTH:
        return data.count(b"[") + data.count(b"{")  # an upper bound, and the common case
    import numpy as np  # only here: a result this nested is rare, and the host has numpy (the trl extra)

    outside = b"".join(data.replace(b"\\\\", b"").replace(b'\\"', b"").split(b'"')[::2])
    steps = outside.translate(_STEPS, _BRACKETS)
    level = deepest = 0
    for at in range(0, len(steps), _DEPTH_CHUNK):
        running = np.frombuffer(steps, np.int8, min(_DEPTH_CHUNK, len(steps) - at), at).cumsum(dtype=np.int32)
        deepest = max(deepest, level + int(running.max()))
        level += int(running[-1])
    return deepest


@dataclass(frozen=True)
class Decoded:
    """A decoded result record. ``is_json``: ``value`` is the JSON value; otherwise ``value`` is text for humans
    (the program's repr of a non-JSON value, or why the record could not be decoded: ``error`` is then True)."""

    value: object
    is_json: bool
    error: bool = False


def decode_result(record: bytes, *, overflow: bool = False) -> Decoded:
    """Decode one result record from the sandbox (module docstring); never raises."""
    if overflow:
        return Decoded("result larger than the output cap", False, True)
    if not record.endswith(b"\n") or record.count(b"\n") != 1:
        return Decoded(f"malformed result record ({len(record)} bytes, not one line)", False, True)
    kind, _, body = record[:-1].partition(b" ")
    if kind == b"repr":
        return Decoded(body.decode("utf-8", errors="replace"), False)
    if kind != b"json":
        return Decoded(f"malformed result record (kind {kind[:20]!r})", False, True)
    try:
        text = body.decode("utf-8")  # strict: invalid UTF-8 is not a result
        levels = depth(body)
        if levels > MAX_DEPTH:
            return Decoded(f"result nested {levels} deep (more than {MAX_DEPTH})", False, True)
        return Decoded(_loads(text, body), True)
    except (ValueError, RecursionError, MemoryError) as e:  # UnicodeDecodeError and JSONDecodeError included
        return Decoded(f"undecodable result ({type(e).__name__}: {str(e)[:120]})", False, True)


def normalize_expected(value):
    """A test's expected value as a decoded result would hold it: tuples as lists, dict keys as JSON writes
    them, ints of more than `LONG_DIGITS` digits as `LongInt`. TypeError for a value JSON cannot hold."""
    if value is None or isinstance(value, (bool, LongInt)):
        return value
    if isinstance(value, str):
        return str(value)
    if isinstance(value, int):
        value = int(value)
        if int_digits_estimate(value) > LONG_DIGITS:  # an upper bound: below it, surely an ordinary int
            text = str(decimal.Decimal(value))  # exact, unlimited (no int -> str conversion)
            if len(text) - text.startswith("-") > LONG_DIGITS:
                return LongInt(text)
        return value
    if isinstance(value, float):
        return float(value)
    if isinstance(value, (list, tuple)):
        return [normalize_expected(v) for v in value]
    if isinstance(value, dict):
        return {_json_key(k): normalize_expected(v) for k, v in value.items()}
    raise TypeError(f"{type(value).__name__} is not a JSON value: {_REPR.repr(value)}")


def _json_key(key) -> str:
    if isinstance(key, str):
        return str(key)
    if key is None or isinstance(key, bool):
        return {None: "null", True: "true", False: "false"}[key]
    if isinstance(key, (int, float)):
        return json.dumps(key)
    raise TypeError(f"a dict key of type {type(key).__name__} is not a JSON key: {_REPR.repr(key)}")


def json_size(value) -> int:
    """Length of the JSON text of a normalized value (a `LongInt` counts its digits)."""
    return len(json.dumps(value, default=lambda o: o.text if isinstance(o, LongInt) else str(o)))


def equal(result, expected) -> bool:
    """Whether a decoded result equals a normalized expected value (Python's ==, so 1 == 1.0 and True == 1 as
    before); False where the comparison itself fails."""
    try:
        return bool(result == expected)
    except (RecursionError, ValueError, TypeError, MemoryError, ArithmeticError):
        return False


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict, _REPR.maxstring, _REPR.maxother = 3, 6, 4, 60, 60
_REPR.maxlong = 40


def short(value, limit: int = 80) -> str:
    """A bounded, never-raising text of a value for a reward's detail."""
    try:
        text = value if isinstance(value, str) else _REPR.repr(value)
    except Exception as e:  # noqa: BLE001 - a detail must never fail the judgement
        text = f"<unprintable {type(value).__name__}: {type(e).__name__}>"
    return repr(text if len(text) <= limit else text[:limit] + "...")

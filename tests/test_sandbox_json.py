"""Decoding what a sandboxed program sends back (`sandbox_json`): hostile bytes never raise, nesting is measured
right, and integers of any size compare exactly."""

from __future__ import annotations

import json
import sys
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from klear_lib.rewards import sandbox_json
from klear_lib.rewards.sandbox_json import LongInt, decode_result, depth, equal, loads, normalize_expected


def big_text(n: int) -> str:
    """Decimal text of n without Python's int -> str limit (set and restored in this thread only: tests)."""
    old = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        return str(n)
    finally:
        sys.set_int_max_str_digits(old)


@pytest.mark.parametrize("record, why", [
    (b"json [1,\n", "undecodable result (JSONDecodeError"),
    (b'json "\xff\xfe"\n', "undecodable result (UnicodeDecodeError"),
    (b"json [1]\njson [2]\n", "not one line"),
    (b"json [1]", "not one line"),
    (b"\n", "kind b''"),
    (b"pickle \x80\x04K\x01.\n", "kind b'pickle'"),
    (b"json " + b"[" * 201 + b"]" * 201 + b"\n", "nested 201 deep"),
    (b"json " + b"{\"a\":" * 300 + b"1" + b"}" * 300 + b"\n", "nested 300 deep"),
])
def test_a_bad_record_is_a_reason_never_a_raise(record, why):
    d = decode_result(record)
    assert (d.is_json, d.error) == (False, True) and why in d.value


def test_records_that_decode():
    assert decode_result(b'json {"a": [1, 2.5, null, true, "\\u00e9"]}\n').value == {"a": [1, 2.5, None, True, "é"]}
    assert decode_result(b"repr {1, 2}\n") == sandbox_json.Decoded("{1, 2}", False)
    assert decode_result(b"json " + b"[" * 200 + b"]" * 200 + b"\n").is_json  # the depth limit itself passes
    assert decode_result(b'json ["' + b"[{" * 300 + b'\\"]"]\n').value == ["[{" * 300 + '"]']  # in a string: no nesting
    assert decode_result(b"", overflow=True).value == "result larger than the output cap"


def test_depth_is_linear_on_hostile_input():
    for data in (b'"' + b'\\"' * 2_000_000, b'["' * 1_000_000, b"[" * 2_000_000, b'"\\' * 1_000_000):
        t0 = time.process_time()
        depth(data)
        assert time.process_time() - t0 < 2.0  # a quadratic scan of 2 MB would take minutes


def nested(max_leaves=8):
    leaves = st.one_of(st.integers(-5, 5), st.text(alphabet='[]{}"\\ a', max_size=6), st.none())
    return st.recursive(leaves, lambda kids: st.one_of(st.lists(kids, max_size=3),
                                                       st.dictionaries(st.text(alphabet='[]"\\k', max_size=4), kids,
                                                                       max_size=3)), max_leaves=max_leaves)


def true_depth(v) -> int:
    if isinstance(v, (list, dict)):
        return 1 + max((true_depth(x) for x in (v.values() if isinstance(v, dict) else v)), default=0)
    return 0


@settings(max_examples=300, deadline=None)
@given(nested(40))
def test_depth_agrees_with_the_structure(value):
    text = json.dumps(value).encode()
    found = depth(text)
    if found > sandbox_json.MAX_DEPTH:
        assert found == true_depth(value)
    else:  # at most MAX_DEPTH opening brackets: their count, an upper bound
        assert true_depth(value) <= found


def test_huge_integers_are_digit_strings_compared_exactly():
    n = 7 ** 6000  # 5,071 digits
    text = big_text(n)
    decoded = decode_result(f"json [{text}, 5]\n".encode()).value
    assert isinstance(decoded[0], LongInt) and decoded[0].digits == len(text) and decoded[1] == 5
    assert decoded[0] == n and n == decoded[0] and decoded[0] != n + 1 and decoded[0] != -n
    assert decoded[0] != 10 ** 100 and decoded[0] != 1.5 and decoded[0] != float("inf") and decoded[0] != "x"
    assert equal(decoded, normalize_expected((n, 5))) and not equal(decoded, normalize_expected((n - 1, 5)))
    assert hash(decoded[0]) == hash(n)
    neg = loads(f"[-{text}]")[0]
    assert isinstance(neg, LongInt) and neg == -n and neg.digits == len(text)
    assert loads("[1, 2]") == [1, 2]
    assert normalize_expected(10 ** 3999) == 10 ** 3999 and type(normalize_expected(10 ** 3999)) is int
    assert isinstance(normalize_expected(10 ** 4000), LongInt)  # 4,001 digits


def test_expected_values_take_the_shape_of_a_decoded_result():
    class Key(str):
        pass
    assert normalize_expected({1: (2, [3]), None: True, 2.5: Key("v"), Key("k"): False}) == \
        json.loads(json.dumps({1: (2, [3]), None: True, 2.5: "v", "k": False}))
    with pytest.raises(TypeError, match="set is not a JSON value"):
        normalize_expected([{1, 2}])
    with pytest.raises(TypeError, match="not a JSON key"):
        normalize_expected({(1, 2): 3})


def test_comparison_and_details_never_raise():
    deep_a, deep_b = [], []
    for _ in range(100_000):
        deep_a, deep_b = [deep_a], [deep_b]
    assert equal(deep_a, deep_b) is False  # RecursionError inside: not equal, no raise

    class Bad:
        def __repr__(self):
            raise RuntimeError("no")
    assert sandbox_json.short(Bad()).startswith("'<Bad instance at")
    assert len(sandbox_json.short(list(range(10 ** 5)))) < 100
    assert sandbox_json.short(LongInt("9" * 5000)) == "'<int of 5000 digits: 999999999999...999999>'"


# ---------------------------------------------------------------------------------------------------------------
# Linear decoding: 1 MiB of program output costs at most DECODE_CPU_S of host CPU, whatever its digits (the regex
# this replaced took 4.5 s per MiB of 4,000-digit integers). CPU time, not wall time, so a busy machine does not
# fail it; the best of three runs, so that one page-fault storm does not either.
# ---------------------------------------------------------------------------------------------------------------
MIB = 1 << 20
DECODE_CPU_S = 0.05


def decode_cpu_s(body: bytes) -> tuple[sandbox_json.Decoded, float]:
    import numpy  # noqa: F401 - loaded in the trainer already: the timing is the decode's, not numpy's import
    record = b"json " + body + b"\n"
    best, decoded = float("inf"), None
    for _ in range(3):
        t0 = time.process_time()
        decoded = decode_result(record)
        best = min(best, time.process_time() - t0)
    return decoded, best


def test_a_mib_of_4000_digit_integers_decodes_in_linear_time():
    n = MIB // (sandbox_json.LONG_DIGITS + 1)  # 262 integers of 4,000 digits, each below Python's 4,300-digit limit
    text = "[" + ",".join(str(7 * 10 ** 3999 + k) for k in range(n)) + "]"
    assert len(text) >= MIB - 4001 and max(map(len, text[1:-1].split(","))) == sandbox_json.LONG_DIGITS
    decoded, cpu = decode_cpu_s(text.encode())
    assert cpu <= DECODE_CPU_S, f"{cpu:.3f} s of CPU for 1 MiB"
    assert decoded.is_json and decoded.value == json.loads(text)  # plain ints, the same values
    assert all(type(v) is int for v in decoded.value) and decoded.value[5] - decoded.value[0] == 5


@pytest.mark.parametrize("name, body, want", [
    ("digits", b"7" * MIB, "long"),  # one integer of 1,048,576 digits: a LongInt
    ("minus signs", b"-" * MIB, "undecodable result (JSONDecodeError"),
    ("open brackets", b"[" * MIB, f"result nested {MIB} deep"),
    ("zero point", b"0." * (MIB // 2), "undecodable result (JSONDecodeError"),
    ("negative digits", b"-" + b"9" * MIB, "long"),
    ("digits in a string", b'["' + b"9" * MIB + b'"]', ["9" * MIB]),
    ("a long fraction", b"0." + b"9" * MIB, 1.0),  # json.loads rounds it, as it does a short one
    ("4,001-digit runs", b"[" + b",".join([b"5" * 4001] * (MIB // 4002)) + b"]", "list of long"),
    ("4,000-digit fractions", b"[" + b",".join([b"1." + b"5" * 4000] * (MIB // 4003)) + b"]", "list of floats"),
])
def test_pathological_mib_decodes_in_linear_time(name, body, want):
    decoded, cpu = decode_cpu_s(body)
    assert cpu <= DECODE_CPU_S, f"{name}: {cpu:.3f} s of CPU for {len(body)} bytes"
    if want == "long":
        assert decoded.is_json and isinstance(decoded.value, LongInt)
        assert decoded.value.text == body.decode() and decoded.value.digits == MIB
    elif want == "list of long":
        assert all(isinstance(v, LongInt) and v.text == "5" * 4001 for v in decoded.value)
        assert len(decoded.value) == MIB // 4002
    elif want == "list of floats":
        assert decoded.value == json.loads(body) and decoded.value[0] == pytest.approx(14 / 9)
    elif isinstance(want, str):
        assert (decoded.is_json, decoded.error) == (False, True) and want in decoded.value, decoded.value
    else:
        assert decoded.is_json and decoded.value == want


@given(st.lists(st.sampled_from(["1", "-", "0", "9", "[", "]", ",", ".", "e", '"', " "]), max_size=40),
       st.integers(1, 4))
@settings(max_examples=200, deadline=None)
def test_decoding_agrees_with_json_loads(pieces, repeat):
    """Whatever the text, the decoder says what json.loads says (value, or that it fails), short of its limits."""
    text = "".join(pieces) * repeat
    try:
        want = json.loads(text)
    except ValueError:
        want = ValueError
    d = decode_result(b"json " + text.encode() + b"\n")
    if want is ValueError:
        assert d.error
    else:
        assert d.is_json and d.value == want


def test_long_runs_are_found_exactly_at_the_limit():
    limit = sandbox_json.LONG_DIGITS
    for text, long in ((("1" * limit + ".") * 3, False), ("x" + "1" * (limit + 1), True), ("1" * limit, False),
                       ("é" + "2" * limit + "é" + "3" * (limit + 1), True), ("1" * limit + "-" + "1" * limit, False)):
        assert sandbox_json.has_long_run(text.encode()) is long, text[:20]
        assert isinstance(loads(f'["{text}", {"4" * (limit + int(long))}]')[1], LongInt) is long

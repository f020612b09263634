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

"""SFT data selection (klear_lib/data/selection.py): hand-computed cases, brute-force second
implementations, invariants, and every error message."""
from __future__ import annotations

import hashlib
import itertools
import os
import random
import subprocess
import sys
import warnings
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from klear_lib.data import selection
from klear_lib.data.selection import (
    decontaminate,
    deduplicate,
    difficulty_buckets,
    filter_by_correctness,
    filter_by_correctness_and_difficulty,
    hashed_ngram_embedding,
    k_center_greedy,
    normalize_words,
    rank_sources,
    top_k_sources,
)


# ------------------------------------------------------------------ k-center greedy
def brute_k_center(points: list[tuple[int, ...]], k: int, first: int) -> list[int]:
    """The greedy rule written out: among unselected points, the one whose nearest selected point is
    farthest (exact integer squared distances), lowest index on ties."""
    if k == 0:
        return []
    sel = [first]
    while len(sel) < k:
        best, best_d = None, -1
        for i, p in enumerate(points):
            if i in sel:
                continue
            d = min(sum((a - b) ** 2 for a, b in zip(p, points[s])) for s in sel)
            if d > best_d:  # strict: the first (lowest) index keeps a tie
                best, best_d = i, d
        sel.append(best)
    return sel


def covering_radius(x: np.ndarray, sel: list[int]) -> float:
    return float(max(min(np.linalg.norm(x[i] - x[s]) for s in sel) for i in range(len(x))))


@st.composite
def point_sets(draw):
    n = draw(st.integers(1, 9))
    d = draw(st.integers(1, 3))
    # small integer coordinates: many exact ties and duplicate points, all distances exact in float64
    pts = [tuple(draw(st.integers(-3, 3)) for _ in range(d)) for _ in range(n)]
    k = draw(st.integers(0, n))
    first = draw(st.integers(0, n - 1))
    return pts, k, first


@settings(max_examples=150, deadline=None)
@given(point_sets())
def test_k_center_matches_brute_force(case):
    pts, k, first = case
    sel = k_center_greedy(np.array(pts, dtype=float), k, first=first)
    assert sel == brute_k_center(pts, k, first)
    if k:
        assert sel[0] == first
    assert len(sel) == len(set(sel)) == k  # no index twice, even with duplicate points


def test_k_center_hand_made_1d():
    # points 0,1,5,10,4 from index 0: farthest is 10 (idx 3); then min-dists [0,1,5,0,4] -> 5 (idx 2);
    # then [0,1,0,0,1]: tie between idx 1 and idx 4 -> lowest index 1; then 4.
    x = np.array([[0.0], [1.0], [5.0], [10.0], [4.0]])
    assert k_center_greedy(x, 5) == [0, 3, 2, 1, 4]
    assert k_center_greedy(x, 2, first=3) == [3, 0]
    assert k_center_greedy(x, 0) == []


def test_k_center_duplicates_and_radius_non_increasing():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(size=(30, 4)), np.zeros((5, 4))])  # five identical rows
    full = k_center_greedy(x, len(x), first=7)
    assert sorted(full) == list(range(len(x)))
    radii = []
    for k in range(1, len(x) + 1):
        sel = k_center_greedy(x, k, first=7)
        assert sel == full[:k]  # greedy selections are nested prefixes
        radii.append(covering_radius(x, sel))
    assert all(a >= b for a, b in zip(radii, radii[1:]))
    assert radii[-1] == 0.0


def test_k_center_errors():
    x = np.zeros((3, 2))
    with pytest.raises(ValueError, match=r"k=4 is larger than the number of embeddings n=3"):
        k_center_greedy(x, 4)
    with pytest.raises(ValueError, match=r"k must be a non-negative int, got -1"):
        k_center_greedy(x, -1)
    with pytest.raises(ValueError, match=r"first must be an int row index in \[0, 3\), got 3"):
        k_center_greedy(x, 1, first=3)
    with pytest.raises(ValueError, match=r"embeddings must be 2-D \(n, d\), got shape \(3,\)"):
        k_center_greedy(np.zeros(3), 1)
    bad = np.zeros((3, 2))
    bad[2, 1] = np.nan
    with pytest.raises(ValueError, match=r"row 2 has NaN or inf"):
        k_center_greedy(bad, 1)


# ------------------------------------------------------------------ hashed n-gram embedding
def _bucket(gram: str, dim: int, seed: int) -> int:
    h = hashlib.blake2b(gram.encode("utf-8"), digest_size=8, salt=seed.to_bytes(16, "little")).digest()
    return int.from_bytes(h, "little") % dim


def test_hashed_embedding_by_value():
    # "Ab, c" normalises to "ab c": character 3-grams "ab " and "b c", one count each -> 1/sqrt(2) each
    # (or 2/2 = 1.0 in one bucket if they collide); "aaaa" -> "aaa" twice -> a single 1.0.
    dim, seed = 16, 3
    emb = hashed_ngram_embedding(["Ab, c", "aaaa", "", "hi"], dim=dim, seed=seed)
    want = np.zeros((4, dim))
    want[0, _bucket("ab ", dim, seed)] += 1
    want[0, _bucket("b c", dim, seed)] += 1
    want[0] /= np.linalg.norm(want[0])
    want[1, _bucket("aaa", dim, seed)] = 1.0
    want[3, _bucket("hi", dim, seed)] = 1.0  # shorter than n: the whole text is one gram
    np.testing.assert_allclose(emb, want)
    assert emb.shape == (4, dim)
    assert not emb[2].any()  # empty text: zero row


def test_hashed_embedding_unit_rows_and_seed():
    texts = [f"problem number {i} about primes and {i * 7} apples" for i in range(20)]
    emb = hashed_ngram_embedding(texts, n=4, dim=64, seed=0)
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0)
    assert not np.array_equal(emb, hashed_ngram_embedding(texts, n=4, dim=64, seed=1))
    np.testing.assert_array_equal(emb, hashed_ngram_embedding(texts, n=4, dim=64, seed=0))


def test_hashed_embedding_same_across_processes():
    code = ("from klear_lib.data.selection import hashed_ngram_embedding as h; import numpy as np;"
            "print(np.flatnonzero(h(['Klear reasoner, gppo!'], dim=97)[0]).tolist())")
    outs = set()
    for hashseed in ("1", "2"):  # Python's own hash() would differ between these two processes
        env = {**os.environ, "PYTHONHASHSEED": hashseed}
        outs.add(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                check=True, cwd=os.path.dirname(os.path.dirname(__file__))).stdout)
    here = str(np.flatnonzero(hashed_ngram_embedding(["Klear reasoner, gppo!"], dim=97)[0]).tolist())
    assert outs == {here + "\n"}


def test_hashed_embedding_errors():
    with pytest.raises(ValueError, match="n must be a positive int, got 0"):
        hashed_ngram_embedding(["a"], n=0)
    with pytest.raises(ValueError, match="dim must be a positive int, got 0"):
        hashed_ngram_embedding(["a"], dim=0)
    with pytest.raises(ValueError, match=r"seed must be an int in \[0, 2\*\*128\)"):
        hashed_ngram_embedding(["a"], seed=-1)
    with pytest.raises(TypeError, match="text must be a str, got int"):
        hashed_ngram_embedding([5])


# ------------------------------------------------------------------ normalisation, decontamination
def test_normalize_words():
    assert normalize_words("  Hello,\tWORLD!\n x+y=3  snake_case ") == (
        "hello", "world", "x", "y", "3", "snake", "case")


REF = "Find the number of ordered pairs of integers such that x plus y equals ten"


def test_decontaminate_nine_vs_eight_shared_words():
    nine = "Intro text. FIND the number of ordered pairs, of integers such -- and then something else"
    eight = "Intro text. Find the number of ordered pairs of integers whatever comes next here"
    # nine: "find the number of ordered pairs of integers such" = 9 consecutive shared words
    # eight: "find the number of ordered pairs of integers" = 8, then "whatever" breaks the run
    assert decontaminate([nine, eight], [REF]) == [False, True]
    assert decontaminate([eight], [REF], n=8) == [False]


def test_decontaminate_short_texts_and_references():
    refs = [REF, "What is 2+2?"]
    texts = ["what is 2 2", "What is 2+3?", "find the number of ordered pairs", "", "Completely unrelated."]
    # a short text is dropped only when identical (after normalisation) to a whole reference
    assert decontaminate(texts, refs) == [False, True, True, True, True]
    with pytest.raises(ValueError, match="n must be a positive int, got 0"):
        decontaminate(["a"], ["a"], n=0)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.sampled_from("abc"), max_size=7), max_size=4),
       st.lists(st.lists(st.sampled_from("abc"), max_size=7), max_size=3),
       st.integers(1, 4))
def test_decontaminate_matches_brute_force(texts, refs, n):
    def brute(t, refs):
        if len(t) < n:
            return not any(t and t == r for r in refs)
        return not any(t[i:i + n] == r[j:j + n] for r in refs
                       for i in range(len(t) - n + 1) for j in range(len(r) - n + 1))
    got = decontaminate([" ".join(t) for t in texts], [" ".join(r) for r in refs], n=n)
    assert got == [brute(t, refs) for t in texts]


# ------------------------------------------------------------------ deduplication
def test_deduplicate_exact():
    texts = ["Hello world", "hello,  WORLD!", "other", "Hello world", ""]
    assert deduplicate(texts) == [True, False, True, False, True]


def test_deduplicate_near_hand_computed():
    # trigrams: "a b c d e" -> {abc, bcd, cde}; "a b c d f" -> {abc, bcd, cdf}: |∩| = 2, |∪| = 4, J = 0.5
    texts = ["a b c d e", "a b c d f"]
    assert deduplicate(texts, near=0.5) == [True, False]
    assert deduplicate(texts, near=0.51) == [True, True]
    assert deduplicate(texts) == [True, True]
    # no chains: B is near A (dropped); C is near B (J=0.5) but not A (J=0.2) -> C kept
    assert deduplicate(["a b c d e", "a b c d f", "b c d f g"], near=0.5) == [True, False, True]
    # shorter than n words: the whole tuple is one gram
    assert deduplicate(["x y", "x  Y!", "x z"], near=0.9) == [True, False, True]


def test_deduplicate_errors():
    for bad in (0, 1.5, "0.5"):
        with pytest.raises(ValueError, match=r"near must be None or a number in \(0, 1\]"):
            deduplicate(["a"], near=bad)
    with pytest.raises(ValueError, match="n must be a positive int, got 0"):
        deduplicate(["a"], n=0)


# ------------------------------------------------------------------ top-K sources
def test_rank_sources():
    assert rank_sources({"b": 0.5, "a": 0.5, "c": 0.9, "d": 0.1}) == ["c", "a", "b", "d"]
    with pytest.raises(ValueError, match=r"score of source 'x' must be a number \(not NaN\), got nan"):
        rank_sources({"x": float("nan")})


def _pool(counts: dict[str, int]) -> list[dict]:
    return [{"source": s, "i": i} for s, c in counts.items() for i in range(c)]


def test_top_k_hand_computed_shares():
    samples = _pool({"A": 5, "B": 2, "C": 10})
    scores = {"A": 0.9, "B": 0.8, "C": 0.1}
    # k=2 keeps A, B; budget 6 -> equal share 3 each; B has only 2, its shortfall of 1 goes to A: 4 + 2
    out = top_k_sources(samples, scores, 2, 6, seed=0)
    assert Counter(s["source"] for s in out) == {"A": 4, "B": 2}
    assert all(any(s is t for t in samples) for s in out)  # the original dicts
    assert [samples.index(s) for s in out] == sorted(samples.index(s) for s in out)  # input order
    # capacities 10, 1, 10 and budget 7: B gives 1, the other 6 split 3 + 3 (not 4 + 2)
    out = top_k_sources(_pool({"A": 10, "B": 1, "C": 10}), {"A": 3, "B": 2, "C": 1}, 3, 7, seed=0)
    assert Counter(s["source"] for s in out) == {"A": 3, "B": 1, "C": 3}
    # remainder of an uneven split goes to the best-ranked source: 5 = 3 + 2
    out = top_k_sources(_pool({"A": 10, "C": 10}), {"A": 1, "C": 2}, 2, 5, seed=0)
    assert Counter(s["source"] for s in out) == {"C": 3, "A": 2}


def test_top_k_determinism_and_stability():
    samples = _pool({"A": 50, "B": 50})
    scores = {"A": 1.0, "B": 0.5}
    a = top_k_sources(samples, scores, 2, 20, seed=1)
    assert a == top_k_sources(samples, scores, 2, 20, seed=1)
    assert a != top_k_sources(samples, scores, 2, 20, seed=2)
    # A's draw depends only on (seed, "A", its pool, its count): adding an unranked-away source keeps it
    more = top_k_sources(samples + _pool({"Z": 9}), {**scores, "Z": 0.0}, 2, 20, seed=1)
    assert more == a


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 8), min_size=1, max_size=5), st.integers(0, 40), st.data())
def test_top_k_invariants(caps, budget, data):
    counts = {f"s{i}": c for i, c in enumerate(caps)}
    scores = {s: float(i) for i, s in enumerate(counts)}
    k = data.draw(st.integers(1, len(caps)))
    top = rank_sources(scores)[:k]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = top_k_sources(_pool(counts), scores, k, budget, seed=0)
    got = Counter(s["source"] for s in out)
    assert set(got) <= set(top)
    assert len(out) == min(budget, sum(counts[s] for s in top))
    assert all(got[s] <= counts[s] for s in top)
    # max-min fair: a source left with spare samples is within one of the largest share
    biggest = max((got[s] for s in top), default=0)
    assert all(got[s] >= biggest - 1 for s in top if got[s] < counts[s])


def test_top_k_errors_and_warning():
    samples = _pool({"A": 2, "B": 3})
    with pytest.raises(ValueError, match=r"sample 2 has source 'B', which has no score"):
        top_k_sources(samples, {"A": 1.0}, 1, 1, seed=0)
    with pytest.raises(ValueError, match=r"sample 1 must be a dict with a 'source' key"):
        top_k_sources([{"source": "A"}, {"src": "A"}], {"A": 1.0}, 1, 1, seed=0)
    with pytest.raises(ValueError, match=r"k=3 is larger than the number of scored sources \(2\)"):
        top_k_sources(samples, {"A": 1.0, "B": 0.0}, 3, 1, seed=0)
    with pytest.raises(ValueError, match="k must be a positive int, got 0"):
        top_k_sources(samples, {"A": 1.0, "B": 0.0}, 0, 1, seed=0)
    with pytest.raises(ValueError, match="budget must be a non-negative int, got -1"):
        top_k_sources(samples, {"A": 1.0, "B": 0.0}, 1, -1, seed=0)
    with pytest.raises(ValueError, match="seed must be an int, got None"):
        top_k_sources(samples, {"A": 1.0, "B": 0.0}, 1, 1, seed=None)
    with pytest.warns(UserWarning, match=r"budget=9 exceeds the 5 samples of the top-2 sources"):
        out = top_k_sources(samples, {"A": 1.0, "B": 0.0}, 2, 9, seed=0)
    assert out == samples


# ------------------------------------------------------------------ correctness and difficulty
SAMPLES = [
    {"id": 0, "verdict": True, "difficulty": "easy"},
    {"id": 1, "verdict": False, "difficulty": "easy"},
    {"id": 2, "verdict": True, "difficulty": "hard"},
    {"id": 3, "verdict": False, "difficulty": "hard"},
]


def _ids(xs):
    return [x["id"] for x in xs]


def test_filter_by_correctness_modes():
    assert _ids(filter_by_correctness(SAMPLES, "only_true")) == [0, 2]
    assert _ids(filter_by_correctness(SAMPLES, "mixed")) == [0, 1, 2, 3]
    assert filter_by_correctness([{"no": "verdict"}], "mixed") == [{"no": "verdict"}]
    msg = r"sample 1 needs a bool 'verdict' for mode 'only_true', got '<missing>'"
    with pytest.raises(ValueError, match=msg):
        filter_by_correctness([SAMPLES[0], {"id": 9}], "only_true")
    with pytest.raises(ValueError, match=r"sample 0 needs a bool 'verdict'.*got None"):
        filter_by_correctness([{"verdict": None}], "only_true")
    with pytest.raises(ValueError, match=r"mode must be one of \('only_true', 'mixed'\), got 'all'"):
        filter_by_correctness(SAMPLES, "all")


def test_difficulty_rule():
    assert difficulty_buckets({"p1": 0.9, "p2": 0.5, "p3": 0.0, "p4": 0.51}) == {
        "p1": "easy", "p2": "hard", "p3": "hard", "p4": "easy"}  # strictly above 0.5 is easy
    assert difficulty_buckets({"p": 0.3}, easy_above=0.2) == {"p": "easy"}
    with pytest.raises(ValueError, match=r"pass rate of problem 'p' must be a number in \[0, 1\], got 1.5"):
        difficulty_buckets({"p": 1.5})
    # the paper's rule: drop incorrect responses on easy problems only
    assert _ids(filter_by_correctness_and_difficulty(SAMPLES)) == [0, 2, 3]
    assert _ids(filter_by_correctness_and_difficulty(SAMPLES, hard="only_true")) == [0, 2]
    assert _ids(filter_by_correctness_and_difficulty(SAMPLES, easy="mixed")) == [0, 1, 2, 3]
    # a hard sample needs no verdict under "mixed"; an easy one does under "only_true"
    assert _ids(filter_by_correctness_and_difficulty([{"id": 5, "difficulty": "hard"}])) == [5]
    with pytest.raises(ValueError, match=r"sample 1 needs a bool 'verdict' for mode 'only_true'"):
        filter_by_correctness_and_difficulty([SAMPLES[0], {"difficulty": "easy"}])
    with pytest.raises(ValueError, match=r"sample 0 needs 'difficulty' in \('easy', 'hard'\), got 'medium'"):
        filter_by_correctness_and_difficulty([{"difficulty": "medium", "verdict": True}])
    with pytest.raises(ValueError, match=r"hard must be one of \('only_true', 'mixed'\), got 'x'"):
        filter_by_correctness_and_difficulty(SAMPLES, hard="x")


def test_pipeline_composes():
    # decontaminate -> dedup -> k-center over hashed embeddings: a smoke test that the pieces fit, with
    # the contaminated and duplicated texts provably gone
    texts = [f"compute the sum of {i} and {i + 1} then reduce it modulo ten please" for i in range(12)]
    texts += [texts[0].upper(), REF + " extra"]
    keep = [a and b for a, b in zip(decontaminate(texts, [REF]), deduplicate(texts))]
    assert keep == [True] * 12 + [False, False]
    pool = list(itertools.compress(texts, keep))
    sel = k_center_greedy(hashed_ngram_embedding(pool), 5)
    assert len(set(sel)) == 5 and sel[0] == 0


def test_upsample_repeats_every_sample_and_draws_the_rest_once():
    from klear_lib.data.selection import upsample

    samples = ["a", "b", "c"]
    out = upsample(samples, 8, seed=0)  # 8 = 2 * 3 + 2: every sample twice, two of them a third time
    assert len(out) == 8 and sorted(set(out)) == samples
    counts = sorted(out.count(x) for x in samples)
    assert counts == [2, 3, 3]
    assert out == sorted(out, key=samples.index)  # input order kept
    assert upsample(samples, 8, seed=0) == out and upsample(samples, 3, seed=5) == samples
    assert upsample([], 0, seed=0) == []
    with pytest.raises(ValueError, match="n must be an int >= len"):
        upsample(samples, 2, seed=0)
    with pytest.raises(ValueError, match="no samples"):
        upsample([], 4, seed=0)


# Top-K arms over sources of two procedures (step orders): f* add forward, r* in reverse.
ORDERS = {"f1": "forward", "f2": "forward", "f3": "forward", "r1": "reverse", "r2": "reverse"}


@pytest.mark.parametrize("scores, arm, expected", [
    # the best source adds in reverse: top2 mixes orders; same-order takes the two best forward sources
    ({"f1": 0.7, "f2": 0.6, "f3": 0.5, "r1": 0.9}, "top2", ["r1", "f1"]),
    ({"f1": 0.7, "f2": 0.6, "f3": 0.5, "r1": 0.9}, "top2_same_order", ["f1", "f2"]),
    ({"f1": 0.7, "f2": 0.6, "f3": 0.5, "r1": 0.9}, "top2_mixed_order", ["r1", "f1"]),
    # the best source adds forward: top2 is the same-order pair; mixed-order takes the best reverse source instead
    ({"f1": 0.9, "f2": 0.8, "f3": 0.5, "r1": 0.6}, "top2", ["f1", "f2"]),
    ({"f1": 0.9, "f2": 0.8, "f3": 0.5, "r1": 0.6}, "top2_same_order", ["f1", "f2"]),
    ({"f1": 0.9, "f2": 0.8, "f3": 0.5, "r1": 0.6}, "top2_mixed_order", ["f1", "r1"]),
    # beyond one per order, mixed-order fills by score; the best of each order comes first whatever its rank
    ({"f1": 0.9, "f2": 0.8, "f3": 0.7, "r1": 0.1, "r2": 0.2}, "top3_mixed_order", ["f1", "f2", "r2"]),
    ({"f1": 0.9, "f2": 0.8, "f3": 0.7, "r1": 0.1, "r2": 0.2}, "top4", ["f1", "f2", "f3", "r2"]),
    ({"f1": 0.9, "f2": 0.8, "f3": 0.7, "r1": 0.1}, "top1", ["f1"]),
])
def test_top_k_arm_picks_by_score_within_its_rule(scores, arm, expected):
    chosen, k = selection.top_k_arm(arm, scores, ORDERS)
    assert (list(chosen), k) == (expected, int(arm[3]))
    assert all(chosen[n] == scores[n] for n in chosen)


def test_top_k_arm_two_top2_variants_always_differ_in_one_source():
    rng = random.Random(0)
    names = ["f1", "f2", "f3", "r1"]
    for _ in range(200):  # any ranking of three forward sources and one reverse source
        scores = {n: rng.random() for n in names}
        same, _ = selection.top_k_arm("top2_same_order", scores, ORDERS)
        mixed, _ = selection.top_k_arm("top2_mixed_order", scores, ORDERS)
        best_forward = max(["f1", "f2", "f3"], key=scores.get)
        assert best_forward in same and best_forward in mixed
        assert {ORDERS[n] for n in same} == {"forward"} and {ORDERS[n] for n in mixed} == {"forward", "reverse"}
        assert len(set(same) & set(mixed)) == 1


def test_top_k_arm_names_what_is_wrong():
    scores = {"f1": 0.9, "f2": 0.8, "r1": 0.1}
    with pytest.raises(ValueError, match="'top2_any' must be topK"):
        selection.top_k_arm("top2_any", scores, ORDERS)
    with pytest.raises(ValueError, match="'top4': K = 4 needs between 1 and 3"):
        selection.top_k_arm("top4", scores, ORDERS)
    with pytest.raises(ValueError, match="'top3_same_order': K = 3 needs between 1 and 2"):
        selection.top_k_arm("top3_same_order", scores, ORDERS)
    with pytest.raises(ValueError, match="'top1_mixed_order': mixing orders needs"):
        selection.top_k_arm("top1_mixed_order", scores, ORDERS)
    with pytest.raises(ValueError, match="mixing orders needs sources of at least two orders"):
        selection.top_k_arm("top2_mixed_order", {"f1": 0.9, "f2": 0.8}, ORDERS)
    with pytest.raises(ValueError, match=r"no order given for the sources \['x'\]"):
        selection.top_k_arm("top1", {"x": 0.5}, ORDERS)

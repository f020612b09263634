"""SFT data selection: K-center coverage, decontamination, dedup, Top-K sources, correctness filters.

Source: Klear-Reasoner (arXiv 2508.07629) §3 (long-CoT SFT data) and the ablations in reference §6:
  * 31,600 math samples are chosen by K-center greedy over an embedding of the prompts;
  * training data is decontaminated against the benchmarks by word 9-gram overlap;
  * few high-quality sources beat many diverse ones (Top-1/Top-2 beat Top-10), so sources are ranked by a
    measured quality score and only the best K are kept;
  * incorrect teacher responses are filtered on easy problems and kept on hard ones (Only-True vs Mixed).

Every rule is a pure function over plain lists and dicts; a pipeline composes them. Text is normalised
once, by `normalize_words` (lowercase, punctuation -> space, whitespace collapsed), for every text rule.
"""
from __future__ import annotations

import collections
import hashlib
import math
import random
import re
import warnings
from collections.abc import Mapping

import numpy as np

CORRECTNESS_MODES = ("only_true", "mixed")
DIFFICULTIES = ("easy", "hard")

# Punctuation becomes a space rather than vanishing, so "end.Start" and "x+y" split into words instead of
# fusing into "endstart"/"xy" (a fused token could never match the same words in a benchmark text).
_PUNCT = re.compile(r"[^\w\s]|_", flags=re.UNICODE)


def normalize_words(text: str) -> tuple[str, ...]:
    """Lowercase, replace every punctuation character (anything not a letter, digit or space; `_` too)
    with a space, and split on runs of whitespace. "Hello,  World!" -> ("hello", "world")."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    return tuple(_PUNCT.sub(" ", text.lower()).split())


def _ngrams(words: tuple[str, ...], n: int) -> set[tuple[str, ...]]:
    return {words[i:i + n] for i in range(len(words) - n + 1)}


def _check_positive_int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


# ---------------------------------------------------------------------------------------------------------
# K-center greedy (paper §3: 31,600 math samples). Gonzalez's 2-approximation of the k-center problem:
#   c_1 = first;  c_{j+1} = argmax_i min_{l<=j} ||x_i - x_{c_l}||_2
# A running vector d_i = min_l ||x_i - x_{c_l}||^2 is updated with one new column per pick: O(n·k·d) time,
# O(n) extra memory. Squared distances give the same argmax as distances (sqrt is monotone).
# ---------------------------------------------------------------------------------------------------------
def k_center_greedy(embeddings: np.ndarray, k: int, *, first: int = 0) -> list[int]:
    """Indices of k rows of `embeddings` (n, d) in selection order, starting from `first`.

    Each next pick is the unselected row farthest (Euclidean) from its nearest selected row; ties go to
    the lowest index. Already-selected rows are never picked again, so exact duplicate rows are picked only
    once every other row is at distance 0 (the selection never repeats an index). k == 0 returns [].
    """
    x = np.asarray(embeddings, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"embeddings must be 2-D (n, d), got shape {x.shape}")
    if not np.isfinite(x).all():
        bad = int(np.argwhere(~np.isfinite(x))[0, 0])
        raise ValueError(f"embeddings must be finite; row {bad} has NaN or inf")
    n = x.shape[0]
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ValueError(f"k must be a non-negative int, got {k!r}")
    if k > n:
        raise ValueError(f"k={k} is larger than the number of embeddings n={n}")
    if k == 0:
        return []
    if isinstance(first, bool) or not isinstance(first, int) or not 0 <= first < n:
        raise ValueError(f"first must be an int row index in [0, {n}), got {first!r}")
    min_d2 = ((x - x[first]) ** 2).sum(axis=1)  # (n,) squared distance to the nearest selected row
    min_d2[first] = -np.inf  # selected rows can never win the argmax again
    chosen = [first]
    for _ in range(k - 1):
        nxt = int(np.argmax(min_d2))  # np.argmax returns the first maximum: the lowest-index tie rule
        chosen.append(nxt)
        np.minimum(min_d2, ((x - x[nxt]) ** 2).sum(axis=1), out=min_d2)
        min_d2[nxt] = -np.inf
    return chosen


def hashed_ngram_embedding(texts: list[str], *, n: int = 3, dim: int = 1024, seed: int = 0) -> np.ndarray:
    """(len(texts), dim) float64 rows: counts of character n-grams of the normalised text, hashed into
    `dim` buckets, each row L2-normalised. The default, dependency-free embedding for `k_center_greedy`
    (the paper embeds with a model; any (n, d) array can be passed instead).

    The text is `" ".join(normalize_words(text))`; a text shorter than n characters is one gram; an empty
    text is a zero row. Bucket = int.from_bytes(blake2b(gram.utf8, digest_size=8, salt=seed as 16 bytes
    little-endian), "little") % dim. blake2b, not Python's `hash`, which is salted per process
    (PYTHONHASHSEED) and would change the selection from run to run.
    """
    _check_positive_int("n", n)
    _check_positive_int("dim", dim)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2 ** 128:
        raise ValueError(f"seed must be an int in [0, 2**128) (a blake2b salt), got {seed!r}")
    salt = seed.to_bytes(16, "little")
    out = np.zeros((len(texts), dim), dtype=np.float64)
    for row, text in enumerate(texts):
        s = " ".join(normalize_words(text))
        grams = [s[i:i + n] for i in range(len(s) - n + 1)] if len(s) >= n else ([s] if s else [])
        for g in grams:
            h = hashlib.blake2b(g.encode("utf-8"), digest_size=8, salt=salt).digest()
            out[row, int.from_bytes(h, "little") % dim] += 1.0
        norm = np.linalg.norm(out[row])
        if norm > 0:
            out[row] /= norm
    return out


def decontaminate(texts: list[str], references: list[str], *, n: int = 9) -> list[bool]:
    """Keep-mask (True = keep) after the paper's word n-gram decontamination (n = 9).

    A text is dropped when it shares any word n-gram with any reference, both normalised by
    `normalize_words`. Texts or references shorter than n words have no n-gram; such a text is dropped
    only when its word sequence equals a reference's whole word sequence (a short benchmark question copied
    verbatim), and such a reference only catches those identical texts. Empty texts are always kept.
    """
    _check_positive_int("n", n)
    ref_grams: set[tuple[str, ...]] = set()
    ref_whole: set[tuple[str, ...]] = set()
    for ref in references:
        words = normalize_words(ref)
        ref_grams |= _ngrams(words, n)
        if words:
            ref_whole.add(words)
    keep = []
    for text in texts:
        words = normalize_words(text)
        if len(words) >= n:
            keep.append(ref_grams.isdisjoint(_ngrams(words, n)))
        else:
            keep.append(words not in ref_whole)
    return keep


def deduplicate(texts: list[str], *, near: float | None = None, n: int = 3) -> list[bool]:
    """Keep-mask (True = keep): the first occurrence of each normalised text (`normalize_words`) is kept.

    With `near` in (0, 1], a text is also dropped when the Jaccard similarity |A∩B| / |A∪B| of its word
    n-gram set A with the set B of an earlier *kept* text is >= near (a dropped text does not drop others,
    so there are no chains). A text shorter than n words has the one-element set {its word tuple}.
    O(len(texts)^2) set comparisons: meant for per-source pools, not a whole corpus (use MinHash there).
    """
    _check_positive_int("n", n)
    if near is not None and not (isinstance(near, (int, float)) and 0 < near <= 1):
        raise ValueError(f"near must be None or a number in (0, 1], got {near!r}")
    seen: set[tuple[str, ...]] = set()
    kept_sets: list[set[tuple[str, ...]]] = []
    keep = []
    for text in texts:
        words = normalize_words(text)
        if words in seen:
            keep.append(False)
            continue
        if near is not None:
            grams = _ngrams(words, n) if len(words) >= n else ({words} if words else set())
            if any(grams and len(grams & b) / len(grams | b) >= near for b in kept_sets):
                keep.append(False)
                continue
            kept_sets.append(grams)
        seen.add(words)
        keep.append(True)
    return keep


# ---------------------------------------------------------------------------------------------------------
# Top-K sources (reference §6: Top1 > Top2 > ... > Top10 on AIME24 for math).
# ---------------------------------------------------------------------------------------------------------
def rank_sources(scores: dict[str, float]) -> list[str]:
    """Source names by descending quality score (e.g. validation accuracy after a short SFT on that
    source alone), ties broken by name ascending."""
    for name, s in scores.items():
        if isinstance(s, bool) or not isinstance(s, (int, float)) or math.isnan(s):
            raise ValueError(f"score of source {name!r} must be a number (not NaN), got {s!r}")
    return sorted(scores, key=lambda name: (-scores[name], name))


TOP_K_ARM = re.compile(r"top(\d+)(_same_order|_mixed_order)?")


def top_k_arm(arm: str, scores: Mapping[str, float], orders: Mapping[str, str]) -> tuple[dict[str, float], int]:
    """The scored sources a Top-K arm draws from, and its K; ``orders`` gives each source's procedure (the step
    order of ``teachers.TeacherSpec``), ``scores`` its quality score (``rank_sources``).

    ``topK``: the K best-scored sources. ``topK_same_order``: the K best-scored of the sources that follow the most
    common order (a tie between orders goes to the one first in ``scores``). ``topK_mixed_order``: the best-scored
    source of each order, then the best-scored of the rest up to K. Both Top-2 variants hold the best source of the
    most common order and differ in their second only: one more of that procedure, or the best of another. They
    exist whatever the ranking, where ``top2`` may be either (its two best sources may or may not share an order).
    """
    m = TOP_K_ARM.fullmatch(arm)
    if m is None:
        raise ValueError(f"arm {arm!r} must be topK, topK_same_order or topK_mixed_order (K a whole number)")
    k = int(m[1])
    missing = [n for n in scores if n not in orders]
    if missing:
        raise ValueError(f"arm {arm!r}: no order given for the sources {missing}")
    ranked = rank_sources(dict(scores))
    if m[2] == "_same_order":
        order = collections.Counter(orders[n] for n in scores).most_common(1)[0][0]
        ranked = [n for n in ranked if orders[n] == order]
        chosen = ranked[:k]
    elif m[2] == "_mixed_order":
        firsts = list({orders[n]: n for n in reversed(ranked)}.values())  # the best of each order
        if len(firsts) < 2 or k < len(firsts):
            raise ValueError(f"arm {arm!r}: mixing orders needs sources of at least two orders and K at least the "
                             f"number of orders ({len(firsts)}); the orders are {sorted({orders[n] for n in scores})}")
        rest = [n for n in ranked if n not in firsts][:k - len(firsts)]
        chosen = [n for n in ranked if n in firsts or n in rest]  # in rank order, as for the other arms
    else:
        chosen = ranked[:k]
    if not 1 <= k <= len(ranked) or len(chosen) < k:
        raise ValueError(f"arm {arm!r}: K = {k} needs between 1 and {len(ranked)} sources to draw from")
    return {n: float(scores[n]) for n in chosen}, k


def _equal_shares(caps: list[int], budget: int) -> list[int]:
    """Max-min fair split of `budget` over sources with capacities `caps` (in rank order): a source with
    fewer samples than the equal share gives all it has and its shortfall is split among the others; the
    last remainder (budget not divisible) goes one each to the best-ranked sources."""
    alloc = [0] * len(caps)
    active = list(range(len(caps)))
    remaining = budget
    while active:
        share = remaining // len(active)
        small = [i for i in active if caps[i] <= share]
        if not small:
            break
        for i in small:
            alloc[i] = caps[i]
            remaining -= caps[i]
        active = [i for i in active if i not in small]
    if active:
        share, extra = divmod(remaining, len(active))
        for rank, i in enumerate(active):  # every cap here > share, so share + 1 fits
            alloc[i] = share + (1 if rank < extra else 0)
    return alloc


def top_k_sources(samples: list[dict], scores: dict[str, float], k: int, budget: int, *, seed: int,
                  pick=None) -> list:
    """Up to `budget` samples drawn from the k best sources by `scores` (`rank_sources`).

    Equal share per source (`_equal_shares`: shortfalls redistributed, remainder to the best-ranked);
    inside a source the samples are a uniform draw by `random.Random(f"{seed}:{source}")`, so a source's
    pick does not move when other sources change. `pick(source_samples, count, rng) -> indices` replaces the
    uniform draw (e.g. `k_center_pick()`, the paper's diversity selection); it must return `count` distinct
    indices into `source_samples`. Returns the original dicts in their input order.
    A budget larger than the k sources hold takes all of them with a warning. A scored source with no
    samples counts among the k and gets nothing (its share goes to the others).
    """
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an int, got {seed!r}")
    _check_positive_int("k", k)
    if k > len(scores):
        raise ValueError(f"k={k} is larger than the number of scored sources ({len(scores)})")
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 0:
        raise ValueError(f"budget must be a non-negative int, got {budget!r}")
    by_source: dict[str, list[int]] = {}
    for i, sample in enumerate(samples):
        if not isinstance(sample, dict) or "source" not in sample:
            raise ValueError(f"sample {i} must be a dict with a 'source' key, got {sample!r:.80}")
        src = sample["source"]
        if src not in scores:
            raise ValueError(f"sample {i} has source {src!r}, which has no score; "
                             f"scored sources: {sorted(scores)}")
        by_source.setdefault(src, []).append(i)
    chosen = rank_sources(scores)[:k]
    caps = [len(by_source.get(src, [])) for src in chosen]
    if budget > sum(caps):
        warnings.warn(f"budget={budget} exceeds the {sum(caps)} samples of the top-{k} sources "
                      f"{chosen}; taking all of them", UserWarning, stacklevel=2)
    picked: list[int] = []
    for src, count in zip(chosen, _equal_shares(caps, budget)):
        rng = random.Random(f"{seed}:{src}")  # str seeds hash with sha512: stable across processes
        members = by_source.get(src, [])
        if pick is None:
            picked += rng.sample(members, count)
            continue
        local = list(pick([samples[i] for i in members], count, rng))
        if len(local) != count or len(set(local)) != count or not all(0 <= j < len(members) for j in local):
            raise ValueError(f"pick returned {len(local)} indices for source {src!r}; expected {count} distinct "
                             f"indices in [0, {len(members)})")
        picked += [members[j] for j in local]
    return [samples[i] for i in sorted(picked)]


def k_center_pick(field: str = "prompt", **embed_kwargs):
    """A `pick` for `top_k_sources`: K-center greedy (`k_center_greedy`) over `hashed_ngram_embedding` of each
    sample's `field`, from a first sample drawn by the source's rng. The paper picks its 31,600 math samples
    this way; exact duplicates of a chosen text come last, so a budget below the number of distinct texts
    never repeats one. `embed_kwargs` go to `hashed_ngram_embedding` (n, dim, seed)."""

    def pick(source_samples: list[dict], count: int, rng: random.Random) -> list[int]:
        if count == 0:
            return []
        for i, s in enumerate(source_samples):
            if not isinstance(s.get(field), str):
                raise ValueError(f"sample {i} of source {s.get('source')!r} needs a str {field!r} for "
                                 f"k_center_pick, got {s.get(field)!r:.80}")
        emb = hashed_ngram_embedding([s[field] for s in source_samples], **embed_kwargs)
        return k_center_greedy(emb, count, first=rng.randrange(len(source_samples)))

    return pick


# ---------------------------------------------------------------------------------------------------------
# Correctness filtering (reference §6): Only-True wins on easy problems (AIME24 45.00 vs 40.22), Mixed wins
# on hard ones (47.29 vs 45.63): incorrect long-CoT traces on hard problems still teach exploration.
# ---------------------------------------------------------------------------------------------------------
def _keep(sample, i: int, mode: str) -> bool:
    """One sample under one correctness mode; `i` is its index, for the error message."""
    if mode == "mixed":
        return True
    if not isinstance(sample, dict) or not isinstance(sample.get("verdict"), bool):
        got = sample.get("verdict", "<missing>") if isinstance(sample, dict) else sample
        raise ValueError(f"sample {i} needs a bool 'verdict' for mode 'only_true', got {got!r:.80}")
    return sample["verdict"]


def filter_by_correctness(samples: list[dict], mode: str) -> list:
    """mode "only_true": keep samples whose `verdict` is True (a sample without a bool verdict is an
    error); "mixed": keep every sample. Returns the original dicts in order."""
    if mode not in CORRECTNESS_MODES:
        raise ValueError(f"mode must be one of {CORRECTNESS_MODES}, got {mode!r}")
    return [s for i, s in enumerate(samples) if _keep(s, i, mode)]


def upsample(samples: list, n: int, *, seed: int) -> list:
    """``n`` samples from ``samples`` by whole repeats plus a seeded draw without replacement for the rest:
    ``n // len(samples)`` copies of every sample, then ``n % len(samples)`` distinct ones (``random.Random(seed)``),
    in input order. A volume-matched control (Only-True upsampled to Mixed's count) trains as many steps on the same
    correct samples. ``n`` below ``len(samples)`` is an error (that is a subsample, not an upsample)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < len(samples):
        raise ValueError(f"upsample: n must be an int >= len(samples) = {len(samples)}, got {n!r}")
    if not samples:
        if n:
            raise ValueError("upsample: no samples to repeat")
        return []
    whole, rest = divmod(n, len(samples))
    extra = set(random.Random(seed).sample(range(len(samples)), rest))
    return [s for i, s in enumerate(samples) for _ in range(whole + (i in extra))]


def difficulty_buckets(pass_rates: dict[str, float], *, easy_above: float = 0.5) -> dict[str, str]:
    """Problem id -> "easy" when its measured pass rate (fraction of correct rollouts) is strictly above
    `easy_above`, else "hard"."""
    out = {}
    for pid, rate in pass_rates.items():
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate <= 1:
            raise ValueError(f"pass rate of problem {pid!r} must be a number in [0, 1], got {rate!r}")
        out[pid] = "easy" if rate > easy_above else "hard"
    return out


def filter_by_correctness_and_difficulty(samples: list[dict], *, easy: str = "only_true",
                                         hard: str = "mixed") -> list:
    """The paper's rule by default: Only-True on easy problems, Mixed on hard ones. Each sample carries
    `difficulty` ("easy" or "hard", e.g. from `difficulty_buckets`). Returns the original dicts in order."""
    modes = {"easy": easy, "hard": hard}
    for which, mode in modes.items():
        if mode not in CORRECTNESS_MODES:
            raise ValueError(f"{which} must be one of {CORRECTNESS_MODES}, got {mode!r}")
    kept = []
    for i, sample in enumerate(samples):
        diff = sample.get("difficulty") if isinstance(sample, dict) else None
        if diff not in DIFFICULTIES:
            raise ValueError(f"sample {i} needs 'difficulty' in {DIFFICULTIES}, got {diff!r}")
        if _keep(sample, i, modes[diff]):
            kept.append(sample)
    return kept

"""Synthetic long-CoT teacher *sources* for the tiny stand-in of the SFT data ablations (reference §6).

The paper's SFT data comes from many sources (datasets distilled from different teachers) that differ in
quality; its ablations rank the sources, mix the Top-K of them at a fixed budget, and filter incorrect
responses by difficulty. Here a source is a :class:`TeacherSpec`: a teacher over the modular-arithmetic task
(``klear_lib.data.tasks``) whose defects are explicit and measurable:

* ``step_error``: the chance that one addition is wrong (the error propagates to the answer);
* ``error_growth``: extra per-step error for each level above 1, so the teacher's accuracy drops with
  difficulty and hard problems carry many incorrect traces (88% of the paper's SFT data is hard);
* ``skip_prob``: the chance that two additions are merged into one line (a skipped reasoning step: a harder
  fact for the student, as a terse teacher's leaps are);
* ``format_noise``: the chance that the response breaks the format (no ``</think>``, or an answer that is
  not boxed), which the format reward scores as a failure;
* ``verbosity``: re-check lines after each step (longer responses, same content);
* ``levels``: the problem levels the source covers (narrow vs broad coverage).

Style, which changes how a response is written and never whether it is right (notebook 01's main condition:
sources of matched quality that differ only in style):

* ``notation``: ``symbols`` (``3 + 2 = 5``), ``words`` (``3 plus 2 is 5``), ``compact`` (``3+2=5``);
* ``layout``: ``lines`` (one step per line) or ``inline`` (every step on one line, ``; ``-separated);
* ``order``: ``forward`` (the addends in the question's order) or ``reverse`` (last addend first: the same
  sum, other steps);
* ``answer_style``: ``boxed`` (``\\boxed{5}``) or ``stated`` (``The answer is \\boxed{5}.``);
* ``verbosity`` above.

``NearMissTeacher`` (notebook 02) writes the correct procedure with exactly one wrong step, placed late, in a
share of responses calibrated per level (``near_miss_matching``: the accuracy of a ``TeacherSpec`` per level,
``spec_accuracy``), so that an incorrect trace is a long, almost right chain rather than one full of slips.

Every sample is a dict with the fields of ``klear_lib.data.hub.SFTSample`` (prompt, response, source, verdict,
difficulty) plus the problem's level and answer, so the selection functions of ``klear_lib.data.selection`` apply
unchanged and ``rows.sft_sample_to_chat`` turns it into a chat row for SFT.
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass

from klear_lib.data.tasks import LEVELS, MODULUS, Problem, exact_answer_reward

STYLE_CHOICES = {"notation": ("symbols", "words", "compact"), "layout": ("lines", "inline"),
                 "order": ("forward", "reverse"), "answer_style": ("boxed", "stated")}


@dataclass(frozen=True)
class TeacherSpec:
    """One synthetic SFT source: a teacher with explicit defects (see the module docstring)."""

    name: str
    step_error: float = 0.0
    error_growth: float = 0.0
    skip_prob: float = 0.0
    format_noise: float = 0.0
    verbosity: int = 0
    levels: tuple[int, ...] = tuple(LEVELS)
    description: str = ""
    notation: str = "symbols"
    layout: str = "lines"
    order: str = "forward"
    answer_style: str = "boxed"

    def __post_init__(self) -> None:
        for key, allowed in STYLE_CHOICES.items():
            if getattr(self, key) not in allowed:
                raise ValueError(f"TeacherSpec {self.name!r}: {key} must be one of {allowed}, "
                                 f"got {getattr(self, key)!r}")
        for key in ("step_error", "error_growth", "skip_prob", "format_noise"):
            value = getattr(self, key)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"TeacherSpec {self.name!r}: {key} must be in [0, 1], got {value!r}")
        if self.verbosity < 0:
            raise ValueError(f"TeacherSpec {self.name!r}: verbosity must be >= 0, got {self.verbosity!r}")
        bad = [lvl for lvl in self.levels if lvl not in LEVELS]
        if not self.levels or bad:
            raise ValueError(f"TeacherSpec {self.name!r}: levels must be a non-empty subset of {sorted(LEVELS)}, "
                             f"got {self.levels!r}")

    def error_at(self, level: int) -> float:
        """Per-step error probability on a problem of ``level``."""
        return min(1.0, self.step_error + self.error_growth * (level - 1))

    def respond(self, problem: Problem, rng: random.Random) -> str:
        """One response to ``problem`` (``teacher_response``)."""
        return teacher_response(self, problem, rng)

    def to_dict(self) -> dict:
        return asdict(self)


# The default pool of sources: seven, differing in one defect each (plus a clean one), so that a quality
# ranking measured by SFT has something to find. Names say what the defect is.
SOURCES: dict[str, TeacherSpec] = {
    spec.name: spec
    for spec in (
        TeacherSpec("clean", step_error=0.03, description="few errors, every step written, broad coverage"),
        TeacherSpec("verbose", step_error=0.03, verbosity=1,
                    description="as clean, with a re-check line after every step (longer responses)"),
        TeacherSpec("narrow", step_error=0.03, levels=(1, 2),
                    description="as clean, but only the two easiest levels (narrow coverage)"),
        TeacherSpec("skipper", step_error=0.03, skip_prob=0.5,
                    description="merges two additions into one line half the time (skipped steps)"),
        TeacherSpec("weak_on_hard", step_error=0.03, error_growth=0.12,
                    description="accuracy drops steeply with the level"),
        TeacherSpec("messy_format", step_error=0.03, format_noise=0.3,
                    description="breaks the <think>/boxed format in 30% of responses"),
        TeacherSpec("sloppy", step_error=0.3, description="errs on 30% of steps everywhere"),
    )
}

# The teacher of the correctness-filtering ablation: decent on easy problems, mostly wrong on hard ones
# (per-step error 0.05, 0.15, 0.25, 0.35 at levels 1-4: the answer is right about 95%, 72%, 42%, 12% of the time).
GRADED_TEACHER = TeacherSpec("graded", step_error=0.05, error_growth=0.10,
                             description="accuracy falls with the level: most hard responses are wrong")

# Notebook 01's main condition: seven sources of *matched* quality (every one errs on 3% of steps, covers every
# level, keeps the format) that differ only in how they write: the paper's question ("a few consistent sources
# beat many diverse ones at the same budget") without "adding bad data hurts" built in.
STYLE_SOURCES: dict[str, TeacherSpec] = {
    spec.name: spec
    for spec in (
        TeacherSpec("plain", step_error=0.03, description="one 'a + b = c' line per step, boxed answer"),
        TeacherSpec("words", step_error=0.03, notation="words", description="'a plus b is c' lines"),
        TeacherSpec("compact", step_error=0.03, notation="compact", description="'a+b=c' lines, no spaces"),
        TeacherSpec("inline", step_error=0.03, layout="inline", description="every step on one line, '; ' between"),
        TeacherSpec("reverse", step_error=0.03, order="reverse", description="adds the addends last to first"),
        TeacherSpec("stated", step_error=0.03, answer_style="stated",
                    description="ends 'The answer is \\boxed{c}.'"),
        TeacherSpec("checked", step_error=0.03, verbosity=1, description="a re-check line after every step"),
    )
}

FILLER = "check {a} + {b} = {c} ok"
_NOTATION = {"symbols": "{a} + {b} = {c}", "words": "{a} plus {b} is {c}", "compact": "{a}+{b}={c}"}
_JOIN = {"symbols": " + ", "words": " plus ", "compact": "+"}


def render_response(spec: TeacherSpec, steps: list[tuple[int, list[int], int]], answer: int) -> str:
    """The text of a response in ``spec``'s style from its ``steps`` (running value, addends of the step, the
    result written) and the answer written; format noise is not applied here."""
    lines = []
    for value, terms, new in steps:
        b = _JOIN[spec.notation].join(map(str, terms))
        step = _NOTATION[spec.notation].format(a=value, b=b, c=new)
        lines.append(step)
        for _ in range(spec.verbosity):
            lines.append(FILLER.format(a=value, b=" + ".join(map(str, terms)), c=new))
    body = "; ".join(lines) if spec.layout == "inline" else "\n".join(lines)
    boxed = "\\boxed{" + str(answer) + "}"
    final = f"The answer is {boxed}." if spec.answer_style == "stated" else boxed
    return "<think>\n" + body + "\n</think>\n" + final


def teacher_response(spec: TeacherSpec, problem: Problem, rng: random.Random) -> str:
    """One response of ``spec``'s teacher to ``problem`` (``<think>`` lines, then ``\\boxed{}``)."""
    err = spec.error_at(problem.level)
    ops = list(problem.operands[1:])
    if spec.order == "reverse":
        ops.reverse()
    value = problem.operands[0]
    steps = []
    i = 0
    while i < len(ops):
        if spec.skip_prob and i + 1 < len(ops) and rng.random() < spec.skip_prob:
            terms = ops[i : i + 2]  # a skipped step: two additions in one line
        else:
            terms = ops[i : i + 1]
        new = (value + sum(terms)) % MODULUS
        for _ in terms:  # each merged addition can go wrong, as written-out steps can
            if err and rng.random() < err:
                new = (new + rng.randint(1, MODULUS - 1)) % MODULUS
        steps.append((value, terms, new))
        value = new
        i += len(terms)
    text = render_response(spec, steps, value)
    if spec.format_noise and rng.random() < spec.format_noise:
        think = text.split("</think>")[0]
        if rng.random() < 0.5:
            return think + "\\boxed{" + str(value) + "}"  # never closes the think block
        return think + "</think>\nanswer " + str(value)  # the answer is not boxed
    return text


def spec_accuracy(spec: TeacherSpec, level: int) -> float:
    """The probability that ``spec``'s answer to a problem of ``level`` is right (no skipped steps, no format
    noise). Each of the n = ``LEVELS[level] - 1`` steps adds an offset: 0 with probability 1 - e, else uniform on
    1..9 (mod 10), e = ``spec.error_at(level)``. The offset's characteristic function is 1 at frequency 0 and
    φ = 1 - e - e/9 = 1 - 10e/9 at the nine others, so P(offset sum ≡ 0) = 1/10 + 9/10 · (1 - 10e/9)^n
    (errors can cancel: 1/9 of a second error undoes the first)."""
    if spec.skip_prob or spec.format_noise:
        raise ValueError(f"spec_accuracy: {spec.name!r} skips steps or breaks the format; the closed form assumes "
                         "neither")
    e, n = spec.error_at(level), LEVELS[level] - 1
    return 0.1 + 0.9 * (1 - 10 * e / 9) ** n


@dataclass(frozen=True)
class NearMissTeacher:
    """A teacher whose incorrect responses are near misses: the correct procedure with exactly one wrong step
    (off by 1..9), placed late (uniformly among the last ``ceil(late_share · n)`` of the n steps), every later
    step computed correctly from the wrong value, so the answer is wrong. A response to a level-L problem is
    right with probability ``accuracy[L - 1]``. Written in the plain style."""

    name: str
    accuracy: tuple[float, ...]
    """Probability of a right answer per level, levels 1..4 in order."""
    late_share: float = 0.5
    levels: tuple[int, ...] = tuple(LEVELS)
    description: str = ""

    def __post_init__(self) -> None:
        if len(self.accuracy) != len(LEVELS) or not all(0.0 <= a <= 1.0 for a in self.accuracy):
            raise ValueError(f"NearMissTeacher {self.name!r}: accuracy must be {len(LEVELS)} probabilities (levels "
                             f"{sorted(LEVELS)}), got {self.accuracy!r}")
        if not 0.0 < self.late_share <= 1.0:
            raise ValueError(f"NearMissTeacher {self.name!r}: late_share must be in (0, 1], got {self.late_share!r}")

    def late_steps(self, n_steps: int) -> range:
        """0-based indices of the steps a wrong step may take: the last ceil(late_share · n_steps)."""
        return range(n_steps - math.ceil(self.late_share * n_steps), n_steps)

    def respond(self, problem: Problem, rng: random.Random) -> str:
        ops = problem.operands[1:]
        wrong_at = -1
        if rng.random() >= self.accuracy[problem.level - 1]:
            wrong_at = rng.choice(self.late_steps(len(ops)))
        value, steps = problem.operands[0], []
        for i, b in enumerate(ops):
            new = (value + b) % MODULUS
            if i == wrong_at:
                new = (new + rng.randint(1, MODULUS - 1)) % MODULUS
            steps.append((value, [b], new))
            value = new
        return render_response(PLAIN, steps, value)

    def to_dict(self) -> dict:
        return asdict(self)


PLAIN = TeacherSpec("plain")


def near_miss_matching(spec: TeacherSpec, *, name: str = "near_miss", late_share: float = 0.5) -> NearMissTeacher:
    """A ``NearMissTeacher`` with ``spec``'s accuracy at every level (``spec_accuracy``): the same share of
    incorrect responses per level, each a near miss instead of a chain of independent slips."""
    acc = tuple(spec_accuracy(spec, lvl) for lvl in sorted(LEVELS))
    return NearMissTeacher(name, acc, late_share=late_share,
                           description=f"one late wrong step; per-level accuracy of {spec.name!r} "
                                       f"({', '.join(f'{a:.2f}' for a in acc)})")


def correct_counterparts(samples: list[dict], problems: list[Problem], teacher: NearMissTeacher) -> list[dict]:
    """``samples`` with every incorrect response replaced by ``teacher``'s correct response to the same problem (the
    near miss without its wrong step: the same procedure and style), in order: the same prompts, the same count,
    every response right. Notebook 02's coverage-matched arm (Only-True covering Mixed's distinct questions).
    ``problems`` must hold every sample's question."""
    by_question = {p.question: p for p in problems}
    right = NearMissTeacher(f"{teacher.name}_correct", (1.0,) * len(LEVELS), late_share=teacher.late_share,
                            levels=teacher.levels)
    out = []
    for i, s in enumerate(samples):
        if s["verdict"]:
            out.append(s)
            continue
        if s["prompt"] not in by_question:
            raise ValueError(f"sample {i}: its question {s['prompt']!r} is not among the problems given")
        p = by_question[s["prompt"]]
        response = right.respond(p, random.Random(0))  # no draw decides anything at accuracy 1
        if exact_answer_reward(response, p.answer)[0] != 1.0:
            raise AssertionError(f"the correct counterpart of sample {i} is not correct: {response!r}")
        out.append({**s, "response": response, "verdict": True, "corrected": True})
    return out


def source_samples(spec: TeacherSpec, problems: list[Problem], n: int, *, seed: int) -> list[dict]:
    """``n`` samples of one source: problems drawn (with replacement) from those of ``problems`` whose level the
    source covers, one response each. Each sample: prompt, response, source, verdict (the response's answer
    judged against the gold one), difficulty (None: set later from measured pass rates), level, question id."""
    rng = random.Random(f"{seed}:{spec.name}")
    pool = [p for p in problems if p.level in spec.levels]
    if not pool:
        raise ValueError(f"source {spec.name!r} covers levels {spec.levels}, and none of the {len(problems)} "
                         f"problems has one of them")
    out = []
    for _ in range(n):
        p = rng.choice(pool)
        response = spec.respond(p, rng)
        out.append({
            "prompt": p.question,
            "response": response,
            "source": spec.name,
            "verdict": exact_answer_reward(response, p.answer)[0] == 1.0,
            "difficulty": None,
            "level": p.level,
            "answer": p.answer,
        })
    return out


def teacher_pass_rates(spec: TeacherSpec, problems: list[Problem], *, samples: int = 8, seed: int = 0) -> dict:
    """Measured pass rate of ``spec``'s teacher on each distinct question: the fraction of ``samples`` responses
    whose answer is right (the paper buckets difficulty by measured pass rates; here the teacher's own)."""
    rng = random.Random(f"{seed}:pass:{spec.name}")
    rates = {}
    for p in problems:
        if p.question in rates:
            continue
        ok = sum(exact_answer_reward(spec.respond(p, rng), p.answer)[0] for _ in range(samples))
        rates[p.question] = ok / samples
    return rates


def corpus(specs, problems: list[Problem], *, per_source: int = 200, seed: int = 0) -> list[str]:
    """Text covering every source's style (for training the tiny tokenizer): questions and responses."""
    texts = [p.question for p in problems]
    for spec in specs:
        texts += [s["response"] for s in source_samples(spec, problems, per_source, seed=seed)]
    return texts


def mixture_samples(specs, problems: list[Problem], *, seed: int, step_error: float | None = None) -> list[dict]:
    """One sample per problem, each from a teacher drawn uniformly from ``specs`` (with ``step_error`` replacing
    every spec's own and its ``error_growth`` when given): a base model's data that writes in every style of
    ``specs`` (notebook 01) without favouring any. Samples as ``source_samples``'s, ``source`` the drawn spec."""
    import dataclasses

    specs = [dataclasses.replace(s, step_error=step_error, error_growth=0.0) if step_error is not None else s
             for s in specs]
    if not specs:
        raise ValueError("mixture_samples needs at least one spec")
    rng = random.Random(f"{seed}:mixture")
    out = []
    for p in problems:
        spec = rng.choice(specs)
        response = spec.respond(p, rng)
        out.append({"prompt": p.question, "response": response, "source": spec.name,
                    "verdict": exact_answer_reward(response, p.answer)[0] == 1.0, "difficulty": None,
                    "level": p.level, "answer": p.answer})
    return out

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

Every sample is a dict with the fields of ``klear_lib.data.hub.SFTSample`` (prompt, response, source, verdict,
difficulty) plus the problem's level and answer, so the selection functions of ``klear_lib.data.selection`` apply
unchanged and ``hub.sft_sample_to_chat`` turns it into a chat row for SFT.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass

from klear_lib.data.tasks import LEVELS, MODULUS, Problem, exact_answer_reward


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

    def __post_init__(self) -> None:
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

FILLER = "check {a} + {b} = {c} ok"


def teacher_response(spec: TeacherSpec, problem: Problem, rng: random.Random) -> str:
    """One response of ``spec``'s teacher to ``problem`` (``<think>`` lines, then ``\\boxed{}``)."""
    err = spec.error_at(problem.level)
    ops = list(problem.operands[1:])
    value = problem.operands[0]
    lines = []
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
        lines.append(f"{value} + {' + '.join(map(str, terms))} = {new}")
        for _ in range(spec.verbosity):
            lines.append(FILLER.format(a=value, b=" + ".join(map(str, terms)), c=new))
        value = new
        i += len(terms)
    think = "<think>\n" + "\n".join(lines) + "\n"
    answer = "\\boxed{" + str(value) + "}"
    if spec.format_noise and rng.random() < spec.format_noise:
        if rng.random() < 0.5:
            return think + answer  # never closes the think block
        return think + "</think>\nanswer " + str(value)  # the answer is not boxed
    return think + "</think>\n" + answer


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
        response = teacher_response(spec, p, rng)
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
        ok = sum(exact_answer_reward(teacher_response(spec, p, rng), p.answer)[0] for _ in range(samples))
        rates[p.question] = ok / samples
    return rates


def corpus(specs, problems: list[Problem], *, per_source: int = 200, seed: int = 0) -> list[str]:
    """Text covering every source's style (for training the tiny tokenizer): questions and responses."""
    texts = [p.question for p in problems]
    for spec in specs:
        texts += [s["response"] for s in source_samples(spec, problems, per_source, seed=seed)]
    return texts

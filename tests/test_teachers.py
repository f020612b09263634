"""The synthetic SFT sources: each defect does what its name says, at the rate it says, reproducibly."""

import random
import re

import pytest

from klear_lib.data import tasks, teachers
from klear_lib.data.tasks import LEVELS, Problem, exact_answer_reward, make_problem


def _problems(n=400, level=None, seed=0):
    rng = random.Random(seed)
    return [make_problem(rng, level or rng.choice(list(LEVELS))) for _ in range(n)]


def _steps(response: str) -> list[str]:
    return [l for l in response.split("</think>")[0].splitlines() if "=" in l and not l.startswith("check")]


def test_perfect_teacher_is_always_right_and_writes_every_step():
    spec = teachers.TeacherSpec("perfect")
    rng = random.Random(0)
    for p in _problems(200):
        r = teachers.teacher_response(spec, p, rng)
        assert exact_answer_reward(r, p.answer) == (1.0, "correct")
        assert len(_steps(r)) == len(p.operands) - 1
        assert r == tasks.teacher_solution(p)  # the same format as the RL notebooks' teacher


def test_step_lines_are_arithmetic_on_the_running_value():
    # every line "v + b [+ c] = w" of an erring teacher starts from the previous line's result
    spec = teachers.TeacherSpec("x", step_error=0.3, skip_prob=0.5)
    rng = random.Random(1)
    for p in _problems(100, level=4):
        lines = _steps(teachers.teacher_response(spec, p, rng))
        value = p.operands[0]
        for line in lines:
            left, right = line.split(" = ")
            assert int(left.split(" + ")[0]) == value
            value = int(right)


@pytest.mark.parametrize("error,level", [(0.1, 1), (0.3, 1), (0.2, 4)])
def test_error_rate_matches_the_spec(error, level):
    # P(right answer) on level L with per-step error e: at least (1-e)^(steps); a wrong step is off by 1..9 so
    # two errors cancel with probability 1/9 per later error. Level 1 has one step: exactly 1 - e.
    spec = teachers.TeacherSpec("x", step_error=error)
    rng = random.Random(2)
    probs = _problems(3000, level=level)
    acc = sum(exact_answer_reward(teachers.teacher_response(spec, p, rng), p.answer)[0] for p in probs) / len(probs)
    steps = LEVELS[level] - 1
    assert acc >= (1 - error) ** steps - 0.03
    assert acc <= (1 - error) ** steps + 0.06


def test_error_grows_with_the_level():
    spec = teachers.GRADED_TEACHER
    assert [round(spec.error_at(l), 2) for l in (1, 2, 3, 4)] == [0.05, 0.15, 0.25, 0.35]
    rates = teachers.teacher_pass_rates(spec, _problems(600), samples=8)
    probs = {p.question: p for p in _problems(600)}
    by_level = {l: [r for q, r in rates.items() if probs[q].level == l] for l in LEVELS}
    means = [sum(v) / len(v) for v in by_level.values()]
    assert means == sorted(means, reverse=True)
    assert means[0] > 0.9 and means[-1] < 0.2  # 95% and (0.65)^5 = 12%


def test_skipper_merges_two_additions_into_one_line():
    spec = teachers.TeacherSpec("s", skip_prob=1.0)
    # 5 additions, each pair merged: 2 + 2 + 1
    r = teachers.teacher_response(spec, Problem("q", 6, 4, (1, 1, 1, 1, 1, 1)), random.Random(0))
    assert _steps(r) == ["1 + 1 + 1 = 3", "3 + 1 + 1 = 5", "5 + 1 = 6"]
    assert exact_answer_reward(r, 6)[0] == 1.0


def test_format_noise_breaks_the_format_at_its_rate_and_the_reward_sees_it():
    spec = teachers.TeacherSpec("m", format_noise=0.3)
    rng = random.Random(3)
    probs = _problems(2000)
    reasons = [exact_answer_reward(teachers.teacher_response(spec, p, rng), p.answer)[1] for p in probs]
    broken = sum(r in ("no_think_close", "no_answer") for r in reasons) / len(reasons)
    assert abs(broken - 0.3) < 0.04
    assert {"no_think_close", "no_answer", "correct"} <= set(reasons)


def test_verbose_adds_one_check_line_per_step_and_stays_correct():
    spec = teachers.TeacherSpec("v", verbosity=1)
    p = Problem("q", 7, 2, (3, 2, 2))
    r = teachers.teacher_response(spec, p, random.Random(0))
    assert r.count("\ncheck ") == 2 and exact_answer_reward(r, 7)[0] == 1.0


def test_narrow_source_covers_only_its_levels_and_says_so_when_none_match():
    spec = teachers.SOURCES["narrow"]
    samples = teachers.source_samples(spec, _problems(300), 200, seed=0)
    assert {s["level"] for s in samples} <= {1, 2}
    with pytest.raises(ValueError, match="covers levels"):
        teachers.source_samples(spec, _problems(50, level=4), 5, seed=0)


def test_samples_carry_the_sft_schema_and_honest_verdicts_and_are_reproducible():
    probs = _problems(300)
    a = teachers.source_samples(teachers.SOURCES["sloppy"], probs, 300, seed=7)
    b = teachers.source_samples(teachers.SOURCES["sloppy"], probs, 300, seed=7)
    c = teachers.source_samples(teachers.SOURCES["sloppy"], probs, 300, seed=8)
    assert a == b and a != c
    for s in a:
        assert set(s) >= {"prompt", "response", "source", "verdict", "difficulty"}
        assert s["verdict"] == (exact_answer_reward(s["response"], s["answer"])[0] == 1.0)
    assert 0.2 < sum(s["verdict"] for s in a) / len(a) < 0.6  # 30% step error over 1-5 steps


def test_the_default_sources_are_distinct_and_at_least_six():
    assert len(teachers.SOURCES) >= 6
    assert len({tuple(sorted(s.to_dict().items(), key=str)) for s in teachers.SOURCES.values()}) == len(teachers.SOURCES)


@pytest.mark.parametrize("kwargs,match", [
    (dict(step_error=1.5), "step_error"), (dict(format_noise=-0.1), "format_noise"),
    (dict(verbosity=-1), "verbosity"), (dict(levels=(5,)), "levels"), (dict(levels=()), "levels"),
])
def test_bad_specs_name_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        teachers.TeacherSpec("bad", **kwargs)


def test_corpus_covers_every_style():
    text = "\n".join(teachers.corpus(teachers.SOURCES.values(), _problems(100), per_source=30))
    assert "check" in text and "answer " in text and "\\boxed{" in text and re.search(r"\d \+ \d \+ \d =", text)

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
    return [line for line in response.split("</think>")[0].splitlines() if "=" in line and not line.startswith("check")]


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
    assert [round(spec.error_at(lvl), 2) for lvl in (1, 2, 3, 4)] == [0.05, 0.15, 0.25, 0.35]
    rates = teachers.teacher_pass_rates(spec, _problems(600), samples=8)
    probs = {p.question: p for p in _problems(600)}
    by_level = {lvl: [r for q, r in rates.items() if probs[q].level == lvl] for lvl in LEVELS}
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
    distinct = {tuple(sorted(s.to_dict().items(), key=str)) for s in teachers.SOURCES.values()}
    assert len(distinct) == len(teachers.SOURCES)


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


# -- notebook 01's main condition: matched quality, different styles ------------------------------------------
def test_style_sources_write_the_same_chain_in_their_own_style():
    p = Problem("Compute (8 + 3 + 2) mod 10.", 3, 2, (8, 3, 2))
    # 8 + 3 = 11 -> 1, 1 + 2 = 3; reversed: 8 + 2 = 10 -> 0, 0 + 3 = 3
    expected = {
        "plain": "<think>\n8 + 3 = 1\n1 + 2 = 3\n</think>\n\\boxed{3}",
        "words": "<think>\n8 plus 3 is 1\n1 plus 2 is 3\n</think>\n\\boxed{3}",
        "compact": "<think>\n8+3=1\n1+2=3\n</think>\n\\boxed{3}",
        "inline": "<think>\n8 + 3 = 1; 1 + 2 = 3\n</think>\n\\boxed{3}",
        "reverse": "<think>\n8 + 2 = 0\n0 + 3 = 3\n</think>\n\\boxed{3}",
        "stated": "<think>\n8 + 3 = 1\n1 + 2 = 3\n</think>\nThe answer is \\boxed{3}.",
        "checked": "<think>\n8 + 3 = 1\ncheck 8 + 3 = 1 ok\n1 + 2 = 3\ncheck 1 + 2 = 3 ok\n</think>\n\\boxed{3}",
    }
    assert set(teachers.STYLE_SOURCES) == set(expected)
    for name, spec in teachers.STYLE_SOURCES.items():
        perfect = teachers.TeacherSpec(name, **{k: getattr(spec, k) for k in teachers.STYLE_CHOICES},
                                       verbosity=spec.verbosity)
        text = perfect.respond(p, random.Random(0))
        assert text == expected[name]
        assert exact_answer_reward(text, 3) == (1.0, "correct")


def test_style_sources_have_matched_quality():
    specs = list(teachers.STYLE_SOURCES.values())
    for lvl in LEVELS:
        assert len({round(teachers.spec_accuracy(s, lvl), 12) for s in specs}) == 1
    assert all(s.levels == tuple(LEVELS) and not s.format_noise and not s.skip_prob for s in specs)
    # measured: every style's answers are right at the same rate (level 4, 5 steps at 3%: 0.1 + 0.9 * 0.9667^5)
    want = 0.1 + 0.9 * (1 - 10 * 0.03 / 9) ** 5
    probs = _problems(1500, level=4, seed=4)
    for spec in specs:
        acc = sum(s["verdict"] for s in teachers.source_samples(spec, probs, 1500, seed=1)) / 1500
        assert abs(acc - want) < 0.035, (spec.name, acc, want)


def test_bad_style_names_the_field():
    with pytest.raises(ValueError, match="notation must be one of"):
        teachers.TeacherSpec("x", notation="latex")
    with pytest.raises(ValueError, match="order must be one of"):
        teachers.TeacherSpec("x", order="random")


def test_spec_accuracy_closed_form_hand_computed_and_against_sampling():
    g = teachers.GRADED_TEACHER
    assert teachers.spec_accuracy(g, 1) == pytest.approx(0.95)  # 0.1 + 0.9 * (1 - 0.05 * 10 / 9)
    assert teachers.spec_accuracy(g, 2) == pytest.approx(0.725)  # 0.1 + 0.9 * (5/6)^2
    rng = random.Random(5)
    for lvl in (3, 4):
        probs = _problems(4000, level=lvl, seed=lvl)
        acc = sum(exact_answer_reward(g.respond(p, rng), p.answer)[0] for p in probs) / len(probs)
        assert abs(acc - teachers.spec_accuracy(g, lvl)) < 0.025
    with pytest.raises(ValueError, match="closed form"):
        teachers.spec_accuracy(teachers.SOURCES["skipper"], 2)


def test_mixture_samples_draw_every_style_once_per_problem_at_the_given_error():
    probs = _problems(700, seed=6)
    samples = teachers.mixture_samples(teachers.STYLE_SOURCES.values(), probs, seed=0, step_error=0.0)
    assert [s["prompt"] for s in samples] == [p.question for p in probs]
    counts = {name: sum(s["source"] == name for s in samples) for name in teachers.STYLE_SOURCES}
    assert min(counts.values()) > 60  # ~100 each
    assert all(s["verdict"] for s in samples)  # step_error 0 everywhere
    noisy = teachers.mixture_samples(teachers.STYLE_SOURCES.values(), probs, seed=0, step_error=0.5)
    assert sum(s["verdict"] for s in noisy) / len(noisy) < 0.6


# -- notebook 02: the near-miss teacher ---------------------------------------------------------------------------
def test_near_miss_late_steps():
    t = teachers.NearMissTeacher("t", (1.0, 1.0, 1.0, 1.0))
    assert [list(t.late_steps(n)) for n in (1, 2, 3, 5)] == [[0], [1], [1, 2], [2, 3, 4]]
    assert list(teachers.NearMissTeacher("t", (1.0,) * 4, late_share=1.0).late_steps(3)) == [0, 1, 2]
    with pytest.raises(ValueError, match="accuracy"):
        teachers.NearMissTeacher("t", (0.5, 0.5))


def test_near_miss_teacher_keeps_graded_accuracy_with_one_late_wrong_step():
    nm = teachers.near_miss_matching(teachers.GRADED_TEACHER)
    graded = tuple(teachers.spec_accuracy(teachers.GRADED_TEACHER, lvl) for lvl in (1, 2, 3, 4))
    assert nm.accuracy == pytest.approx(graded)
    rng = random.Random(7)
    for lvl in LEVELS:
        probs = _problems(2500, level=lvl, seed=10 + lvl)
        right = 0
        for p in probs:
            text = nm.respond(p, rng)
            ok = exact_answer_reward(text, p.answer)[0] == 1.0
            right += ok
            lines = _steps(text)
            assert len(lines) == len(p.operands) - 1  # the full procedure, every step written
            value, wrong = p.operands[0], []
            for i, (line, b) in enumerate(zip(lines, p.operands[1:])):
                left, res = line.split(" = ")
                assert left == f"{value} + {b}"  # each step starts from the value written before it
                if int(res) != (value + b) % 10:
                    wrong.append(i)
                value = int(res)
            assert len(wrong) == (0 if ok else 1)  # a wrong answer has exactly one wrong step ...
            assert all(i in nm.late_steps(len(lines)) for i in wrong)  # ... in the late half
        assert abs(right / len(probs) - nm.accuracy[lvl - 1]) < 0.03, (lvl, right / len(probs))


def test_correct_counterparts_keep_prompts_and_count_and_correct_every_wrong_response():
    """Notebook 02's coverage-matched arm: the same questions in the same order, every response right; a right
    response is kept as it was, a wrong one becomes the teacher's chain without its wrong step (every step but one
    shared with the near miss)."""
    train, _ = tasks.make_splits(0, 400, 8)
    teacher = teachers.near_miss_matching(teachers.GRADED_TEACHER)
    pool = teachers.source_samples(teacher, train, 300, seed=1)
    wrong = [s for s in pool if not s["verdict"]]
    assert len(wrong) > 20
    fixed = teachers.correct_counterparts(pool, train, teacher)
    assert [s["prompt"] for s in fixed] == [s["prompt"] for s in pool] and all(s["verdict"] for s in fixed)
    assert all(f is s for f, s in zip(fixed, pool) if s["verdict"])
    by_q = {p.question: p for p in train}
    for f, s in zip(fixed, pool):
        if not s["verdict"]:
            assert tasks.exact_answer_reward(f["response"], by_q[f["prompt"]].answer)[0] == 1.0
            a, b = f["response"].splitlines(), s["response"].splitlines()
            assert len(a) == len(b) and sum(x != y for x, y in zip(a, b)) >= 1
            # the near miss is right up to its wrong step: the two chains share their first lines
            first = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
            assert a[:first] == b[:first] and first >= 1
    with pytest.raises(ValueError, match="not among the problems"):
        teachers.correct_counterparts(wrong[:1], train[:1] if train[0].question != wrong[0]["prompt"] else train[1:2],
                                      teacher)

"""The math judge (klear_lib/rewards/math.py, reference §5): format rule, robustness, agreement with mathematics."""

from __future__ import annotations

import functools
import signal
import threading
import time

import pytest

from klear_lib.rewards.math import OPTION_NAMES, REASONS, gold_source, score_math
from klear_lib.rewards.pool import RewardPool
from klear_lib.rewards.result import RewardResult

ANSWER = "<think>Let me work it out.</think>\nThe final answer is "


# ---------------------------------------------------------------------------------------------------------------
# Format rule: released code (default), paper, none; one hand-made response per reason
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("response, gold, score, reason", [
    ("<think>3+4=7</think> So $\\boxed{7}$.", "7", 1.0, "correct"),
    ("<think>3+4=8</think> So $\\boxed{8}$.", "7", -1.0, "wrong"),
    ("<think>3+4=7 and the answer is \\boxed{7}", "7", -0.5, "no_think_close"),  # cut off mid-thought
    ("3+4=7</think> \\boxed{7}", "7", -2.0, "no_think_open"),
    ("\\boxed{7}", "7", -0.5, "no_think_close"),  # both missing: </think> is checked first (released code)
    ("<think>it is 7</think>", "7", -1.0, "no_answer"),  # nothing after </think>
    ("<think>it is 7</think> I hope this helps!", "7", -1.0, "no_answer"),
    ("<think>it is 7</think> \\boxed{\\frac{1}{", "7", -1.0, "parse_error"),  # malformed LaTeX
    ("<think>x</think> \\boxed{7}", "\\frac{1}{", -1.0, "gold_error"),  # malformed gold
    ("<think>x</think> \\boxed{7}", "", -1.0, "gold_error"),
])
def test_released_rule_reasons(response, gold, score, reason):
    r = score_math(response, gold)
    assert (r.score, r.reason) == (score, reason), r
    assert isinstance(r, RewardResult) and r.reason in REASONS


# Pathological inputs run in a worker process, as in training. No signal (the judge's SIGPROF budget) interrupts a
# long C-level routine (a big-integer power, say): once in a while (seen once in ~10 full runs) score_math's own
# timeout only fires after minutes, and in the test process that hangs the suite. The pool's hard per-item limit
# kills the worker then; either way the item comes back as "timeout", which is the contract the trainer relies on.
HARD_LIMIT_S = 4.0
# What an item may take beyond the hard limit: the pool replacing a killed worker (a fresh one imports math-verify
# before the next item) on a loaded machine. 1 s was too little on a busy 2-core machine: an item took 5.78 s with
# four pytest workers beside it. A hang, the failure this catches, takes minutes.
RETURN_SLACK_S = 4.0


@pytest.fixture(scope="module")
def judge_pool():
    with RewardPool(score_math, workers=1, timeout_s=HARD_LIMIT_S, failure_score=-1.0) as pool:
        pool.score(response="<think>x</think> 1", gold="1")  # warm the worker (imports) outside the timings
        yield pool


def test_timeout_reason(judge_pool):
    t0 = time.monotonic()
    r = judge_pool.score(response="<think>x</think> $\\boxed{9^{9^{9^{9}}}}$", gold="3", timeout_s=1.0)
    assert (r.score, r.reason) == (-1.0, "timeout")
    assert time.monotonic() - t0 < HARD_LIMIT_S + RETURN_SLACK_S


# ---------------------------------------------------------------------------------------------------------------
# The budget is CPU time of the grading process: waiting costs nothing, computing does, and a timeout that lands
# where Python swallows it (a finalizer, a broad except) comes again. In this process's main thread, as a worker.
# ---------------------------------------------------------------------------------------------------------------
def spin_cpu(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


class SpinsWhenCollected:
    def __del__(self):
        spin_cpu(3.0)  # SIGPROF's raise ends this, and Python swallows it at the finalizer's end


def test_the_budget_is_cpu_time_not_wall_time(monkeypatch):
    import klear_lib.rewards.math as judge

    real_parse = judge.parse

    def slow_machine_parse(*args, **kwargs):  # a loaded machine: wall time passes, this process gets no CPU
        time.sleep(0.8)
        return real_parse(*args, **kwargs)
    monkeypatch.setattr(judge, "parse", slow_machine_parse)
    t0 = time.monotonic()
    assert score_math("<think>x</think> \\boxed{7}", "7", timeout_s=0.5).reason == "correct"
    assert score_math("<think>x</think> $0.5$", "\\frac{1}{2}", timeout_s=0.5).reason == "correct"
    assert time.monotonic() - t0 >= 2 * 0.8  # past the budget in wall time, answer parses alone


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the finalizer's lost raise
@pytest.mark.parametrize("verify_does", ["computes", "swallows_once", "swallows_in_a_finalizer_then_answers"])
def test_computing_past_the_budget_is_timeout_even_if_the_timeout_is_swallowed(monkeypatch, verify_does):
    import klear_lib.rewards.math as judge

    def busy_verify(gold, answer, **kwargs):
        if verify_does == "computes":
            spin_cpu(30.0)
        elif verify_does == "swallows_once":
            try:
                spin_cpu(30.0)
            except BaseException:  # noqa: BLE001 - the judge's library swallowing the timeout
                pass
            spin_cpu(30.0)  # the budget's next SIGPROF, REFIRE_S later, ends this
        else:
            SpinsWhenCollected()  # collected at once: its finalizer computes past the budget, the raise is lost
        return True  # a verdict that came after the budget was spent: not trusted
    monkeypatch.setattr(judge, "verify", busy_verify)
    t0 = time.process_time()
    r = score_math("<think>x</think> \\boxed{7}", "7", timeout_s=0.3)
    cpu = time.process_time() - t0
    assert (r.score, r.reason) == (-1.0, "timeout") and r.detail == "verifying the answer (more than 0.3 s of CPU time)"
    spent = 0.3 + judge.REFIRE_S * (verify_does == "swallows_once")  # the finalizer's spin ends at the budget too
    # at least the budget, at most one refire past it (and a margin): the kernel charges ITIMER_PROF by scheduler
    # ticks, so a signal can land several ticks before process_time says it is due (0.35 s seen for 0.4, 0.242 s
    # for 0.3 on a loaded 2-core machine): the lower bound says the budget was spent, not that it was exact
    assert 0.3 - 0.1 <= cpu < spent + 0.5, cpu
    assert signal.getitimer(signal.ITIMER_PROF) == (0.0, 0.0) and signal.getsignal(signal.SIGPROF) in (
        signal.SIG_DFL, None)  # disarmed and given back
    monkeypatch.undo()
    assert score_math("<think>x</think> \\boxed{8}", "7", timeout_s=0.3).reason == "wrong"  # the next judgement


@pytest.mark.parametrize("response, reason", [
    ("<think>no close \\boxed{7}", "no_think_close"),
    ("no open</think> \\boxed{7}", "no_think_open"),
])
def test_paper_rule_format_failure_is_wrong(response, reason):
    r = score_math(response, "7", format_rule="paper")
    assert (r.score, r.reason) == (-1.0, reason)
    # the paper rule takes its penalty from wrong_score
    assert score_math(response, "7", format_rule="paper", wrong_score=0.0).score == 0.0


def test_no_format_rule_grades_the_whole_response():
    assert score_math("The answer is \\boxed{7}", "7", format_rule="none").reason == "correct"
    assert score_math("<think>\\boxed{7}</think> \\boxed{8}", "7", format_rule="none").reason == "wrong"


def test_custom_scores():
    kw = dict(correct_score=2.0, wrong_score=0.0, no_think_close_score=-0.25, no_think_open_score=-3.0)
    assert score_math("<think>a</think>\\boxed{1}", "1", **kw) == RewardResult(2.0, "correct")
    assert score_math("<think>a</think>\\boxed{2}", "1", **kw).score == 0.0
    assert score_math("<think>a \\boxed{1}", "1", **kw) == RewardResult(-0.25, "no_think_close")
    assert score_math("a</think>\\boxed{1}", "1", **kw) == RewardResult(-3.0, "no_think_open")


def test_answer_is_after_the_last_think_close():
    assert score_math("<think>\\boxed{7}</think> \\boxed{8}", "7").reason == "wrong"
    assert score_math("<think>\\boxed{8}</think> \\boxed{7}", "7").reason == "correct"
    assert score_math("<think>a</think> \\boxed{7} </think> \\boxed{8}", "8").reason == "correct"


def test_options_are_strict():
    with pytest.raises(TypeError) as e:
        score_math("<think></think>1", "1", timeout=3)
    for name in OPTION_NAMES:  # the message lists the valid options
        assert name in str(e.value)
    with pytest.raises(ValueError, match="format_rule"):
        score_math("<think></think>1", "1", format_rule="strict")
    with pytest.raises(ValueError, match="timeout_s"):
        score_math("<think></think>1", "1", timeout_s=0)


def test_refuses_to_run_outside_the_main_thread():
    errors = []
    t = threading.Thread(target=lambda: errors.append(_capture(score_math, "<think></think>\\boxed{1}", "1")))
    t.start()
    t.join(10)
    assert isinstance(errors[0], RuntimeError) and "RewardPool" in str(errors[0])


def _capture(fn, *args):
    try:
        fn(*args)
    except Exception as e:  # noqa: BLE001 - whatever the call raises is what the test looks at
        return e
    return None


@pytest.mark.parametrize("gold, detail", [
    (None, "gold answer is None"),
    (float("nan"), "gold answer is nan (a missing value)"),  # what a data frame holds for a missing value
    ("", "gold answer is blank"),
    ("  \n", "gold answer is blank"),
    (["3"], "gold answer is list (['3']), expected str or a number"),
    (True, "gold answer is bool (True), expected str or a number"),
    ("\\frac{1}{", "math-verify finds no math expression in gold \\frac{1}{"),  # parses only as raw text
    ("$", "math-verify finds no math expression in gold $"),  # parses to nothing
])
def test_missing_or_unparsable_gold_is_gold_error_not_wrong(gold, detail):
    r = score_math("<think>x</think> \\boxed{7}", gold)
    assert r == RewardResult(-1.0, "gold_error", detail=detail)


def test_gold_error_comes_before_the_format_and_has_its_own_score():
    """Every completion of a prompt with a bad gold gets the same score, format failures included: under GRPO's
    group normalisation that prompt then has zero advantage (bad data teaches nothing)."""
    responses = ["<think>x</think> \\boxed{7}", "<think>no close \\boxed{7}", "no open</think> 7", ""]
    assert {score_math(r, None, gold_error_score=0.0) for r in responses} == {
        RewardResult(0.0, "gold_error", detail="gold answer is None")}
    # a good gold keeps the released format rule and math-verify's verdicts
    assert [score_math(r, 7).reason for r in responses] == ["correct", "no_think_close", "no_think_open",
                                                            "no_think_close"]


def test_gold_source_wraps_bare_gold_only():
    assert gold_source("3/4") == "\\boxed{3/4}"
    assert gold_source(7) == "\\boxed{7}"  # datasets may hold numbers
    assert gold_source(" \\boxed{3/4} ") == "\\boxed{3/4}"
    assert gold_source("$\\frac{3}{4}$") == "$\\frac{3}{4}$"
    assert gold_source("\\(3\\)") == "\\(3\\)"
    assert gold_source("\\$12.50") == "\\boxed{\\$12.50}"  # an escaped dollar is currency, not math mode


@pytest.mark.parametrize("gold", ["3/4", "\\frac{3}{4}", "\\boxed{\\frac34}", "$0.75$", "\\(3/4\\)", "0.75"])
def test_every_gold_form_is_read(gold):
    assert score_math("<think>x</think> \\boxed{\\frac{3}{4}}", gold).reason == "correct"
    assert score_math("<think>x</think> \\boxed{\\frac{4}{3}}", gold).reason == "wrong"


# ---------------------------------------------------------------------------------------------------------------
# Robustness: every pathological answer returns in time (the judge's budget, else the pool's limit), with a reason
# ---------------------------------------------------------------------------------------------------------------
ROBUST_TIMEOUT_S = 1.0
_N = 100_000
ROBUST_CASES = {
    # name: (answer after </think>, gold, reasons allowed)
    "huge_exponent": ("$9^{9^{9^{9}}}$", "3", {"timeout"}),
    "huge_exponent_gold": ("$3$", "9^{9^{9^{9}}}", {"timeout"}),
    "huge_factorial": ("\\boxed{(10^{8})!}", "3", {"timeout"}),
    "nested_fractions_200": ("$" + "\\frac{1}{" * 200 + "2" + "}" * 200 + "$", "3", {"timeout", "parse_error"}),
    "nested_parens_5000": ("$" + "(" * 5000 + "1" + ")" * 5000 + "$", "1", {"timeout", "parse_error"}),
    "100KB_sum": ("$" + "1+" * (_N // 2) + "1$", "3", {"timeout", "wrong", "parse_error"}),
    "100KB_digits": ("\\boxed{" + "7" * _N + "}", "7", {"timeout", "parse_error", "wrong"}),
    "100KB_prose": ("so x = 3 and " * (_N // 13), "3", {"correct", "timeout"}),
    "malformed_latex": ("\\boxed{\\frac{1}{", "1", {"parse_error"}),
    "unbalanced_dollars": ("$$ $\\sqrt{ $", "1", {"parse_error", "no_answer", "wrong"}),
    "unicode": ("½ √2 π 答案是３", "1/2", {"parse_error", "no_answer"}),
}


@pytest.mark.parametrize("name", list(ROBUST_CASES))
def test_pathological_answers_return_in_time(name, judge_pool):
    answer, gold, allowed = ROBUST_CASES[name]
    t0 = time.monotonic()
    r = judge_pool.score(response=ANSWER + answer, gold=gold, timeout_s=ROBUST_TIMEOUT_S)
    elapsed = time.monotonic() - t0
    print(f"{name}: {r.reason} in {elapsed:.2f} s")
    # score_math's own budget (timeout_s of CPU) normally; the pool's hard limit when SIGPROF is stuck behind C code
    assert elapsed < HARD_LIMIT_S + RETURN_SLACK_S, f"{name} took {elapsed:.2f} s"
    assert r.reason in allowed, r
    assert r.score == (1.0 if r.reason == "correct" else -1.0)


# ---------------------------------------------------------------------------------------------------------------
# Agreement: the verdict a mathematician gives, against math-verify's. Cases written for this project.
# `expected` is True when the answer is mathematically the gold answer. Where math-verify disagrees the case is
# kept and marked xfail(strict=True) with the reason, so the table documents the judge's real behaviour.
# ---------------------------------------------------------------------------------------------------------------
def case(answer, gold, expected, xfail=None, raw=False):
    response = answer if raw else ANSWER + answer
    marks = [pytest.mark.xfail(strict=True, reason=xfail)] if xfail else []
    return pytest.param(response, gold, expected, marks=marks, id=f"{answer[-40:]!r}~{gold!r}")


AGREEMENT = [
    # equivalent forms of a rational number
    case("$\\boxed{\\frac{3}{4}}$", "0.75", True),
    case("$0.75$.", "3/4", True),
    case("3/4", "\\frac{3}{4}", True),
    case("\\boxed{\\dfrac{6}{8}}", "3/4", True),
    case("\\boxed{0.7500}", "\\frac34", True),
    case("\\boxed{0.7}", "3/4", False),
    case("\\boxed{4/3}", "3/4", False),
    case("\\boxed{\\frac{1}{2}}", "\\boxed{0.5}", True),  # gold given boxed
    case("\\boxed{2/4}", "1/2", True),
    case("\\boxed{1.5}", "3/2", True),
    case("\\boxed{1/3}", "0.333", False),
    case("\\boxed{\\frac{7}{2}}", "3.5", True),
    case("\\boxed{1\\frac{1}{2}}", "3/2", True),  # a mixed number
    case("\\boxed{.5}", "0.5", True),
    case("\\boxed{2^{-1}}", "1/2", True),
    case("\\boxed{\\tfrac{1}{2}}", "1/2", True),
    case("\\boxed{0.3333333}", "1/3", False,
         xfail="math-verify compares numbers after rounding (float_rounding=6): a 7-digit decimal passes for 1/3"),
    case("\\boxed{0.\\overline{3}}", "1/3", True, xfail="repeating-decimal notation \\overline is not parsed"),
    # integers as RL data has them (most training and AIME answers)
    case("\\boxed{042}", "42", True),
    case("\\boxed{ 17 }", "17", True),
    case("**Answer:** 17", "17", True),
    case("$\\boxed{17}$.", "17", True),
    case("There are 17 ways.", "17", True),
    case("the answer is \\(17\\)", "17", True),
    case("\\[ \\boxed{17} \\]", "17", True),
    case("\\boxed{\\mathbf{17}}", "17", True),
    case("\\boxed{18}", "17", False),
    case("Final answer: 171", "17", False),
    case("\\boxed{17}\\boxed{18}", "17", False),  # hedging between two answers is not an answer
    case("\\boxed{1,000,000}", "1000000", True),
    case("\\boxed{10^{6}}", "1000000", True),
    case("\\boxed{10^{-3}}", "0.001", True),
    case("\\boxed{1.0}", "1", True),
    case("\\boxed{3}", "3.0", True),
    case("\\boxed{-0}", "0", True),
    # negative numbers
    case("\\boxed{-2}", "-2", True),
    case("\\boxed{2}", "-2", False),
    case("\\boxed{-\\frac{1}{2}}", "-0.5", True),
    case("$-3$", "-3", True),
    case("\\boxed{\u22123}", "-3", True),  # U+2212 minus sign
    case("\\boxed{-(-5)}", "5", True),
    case("\\boxed{-5}", "5", False),
    case("\\boxed{1}", "-1", False),
    # radicals, expressions, special values
    case("\\boxed{2\\sqrt{2}}", "\\sqrt{8}", True),
    case("\\boxed{\\frac{\\sqrt{2}}{2}}", "\\frac{1}{\\sqrt{2}}", True),
    case("\\boxed{3\\sqrt{3}}", "\\sqrt{27}", True),
    case("\\boxed{\\sqrt{3}}", "3", False),
    case("\\boxed{x^2+2x+1}", "(x+1)^2", True),
    case("\\boxed{x^2-1}", "(x-1)(x+1)", True),
    case("\\boxed{\\frac{x+1}{x-1}}", "\\frac{x-1}{x+1}", False),
    case("\\boxed{y^2+2y+1}", "(x+1)^2", False),
    case("\\boxed{2^{10}}", "1024", True),
    case("\\boxed{\\sqrt[3]{8}}", "2", True),
    case("\\boxed{\\binom{5}{2}}", "10", True),
    case("\\boxed{\\log_2 8}", "3", True),
    case("\\boxed{24}", "4!", True),
    case("\\boxed{\\sin^2 x+\\cos^2 x}", "1", True),
    case("\\boxed{\\pi}", "\\pi", True),
    case("\\boxed{3.14}", "\\pi", False),
    case("\\boxed{\\infty}", "\\infty", True),
    case("\\boxed{\\infty}", "-\\infty", False),
    case("\\boxed{\\pm 2}", "\\pm 2", True),
    case("\\boxed{2}", "\\pm 2", False),
    case("\\boxed{3+2i}", "3+2i", True),
    case("\\boxed{3-2i}", "3+2i", False),
    case("\\boxed{\\frac{1}{\\sqrt{3}}}", "\\frac{\\sqrt{3}}{3}", True),
    case("\\boxed{2\\sqrt{3}+1}", "1+2\\sqrt{3}", True),
    case("\\boxed{\\frac{n(n+1)}{2}}", "\\frac{n^2+n}{2}", True),
    case("\\boxed{a+b}", "b+a", True),
    case("\\boxed{\\ln 8}", "3\\ln 2", True),
    case("\\boxed{e^2}", "e^{2}", True),
    case("\\boxed{e^{i\\pi}}", "-1", True, xfail="Euler's identity is not simplified: e^{i pi} is not evaluated to -1"),
    case("\\boxed{\\sqrt{-1}}", "i", True, xfail="sqrt(-1) is not identified with the imaginary unit i"),
    # equations as answers
    case("\\boxed{x = 3}", "3", True),
    case("\\boxed{3}", "x=3", True),
    case("$x = \\frac{3}{4}$", "3/4", True),
    # intervals
    case("\\boxed{[1, 3)}", "[1,3)", True),
    case("\\boxed{(1, 3)}", "[1,3)", False),
    case("\\boxed{(-\\infty, 2]}", "(-\\infty, 2]", True),
    case("\\boxed{(1,2)\\cup(3,4)}", "(1,2)\\cup(3,4)", True),
    case("\\boxed{(1,2)\\cup(3,5)}", "(1,2)\\cup(3,4)", False),
    case("\\boxed{[0, 1]}", "[0,1)", False),
    case("\\boxed{x \\in [0, 1]}", "[0,1]", True),
    case("\\boxed{x \\le 2}", "(-\\infty, 2]", True,
         xfail="an inequality is compared with an interval only when the prediction is the set "
               "(verify's allow_set_relation_comp=False)"),
    # sets
    case("\\boxed{\\{1, 2, 3\\}}", "\\{3,2,1\\}", True),
    case("\\boxed{\\{1, 2\\}}", "\\{1,2,3\\}", False),
    case("\\boxed{1, 2, 3}", "\\{1,2,3\\}", True),
    case("\\boxed{x=2 \\text{ or } x=3}", "2, 3", True),
    case("\\boxed{\\emptyset}", "\\emptyset", True),
    case("\\boxed{\\varnothing}", "\\{\\}", True, xfail="\\varnothing and the empty braces \\{\\} are not matched"),
    # tuples and matrices
    case("\\boxed{(1, 2)}", "(1,2)", True),
    case("\\boxed{(2, 1)}", "(1,2)", False),
    case("\\boxed{(3, -1)}", "(3,-1)", True),
    case("\\boxed{\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}}", "\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}", True),
    case("\\boxed{\\begin{pmatrix} 1 & 2 \\\\ 3 & 5 \\end{pmatrix}}", "\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}",
         False),
    case("\\boxed{\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}", True),
    case("\\boxed{\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}}", "(1,2)", True,
         xfail="strict mode keeps a column vector and the ordered pair with the same entries apart"),
    # units and \text{}
    case("\\boxed{5\\text{ cm}}", "5", True),
    case("\\boxed{5}", "5\\text{ cm}", True),
    case("\\boxed{7\\text{ cm}}", "5\\text{ cm}", False),
    case("\\boxed{\\$12.50}", "12.5", True),
    case("\\boxed{3\\text{ apples}}", "3", True),
    case("\\boxed{\\text{Monday}}", "\\text{Monday}", True),
    case("\\boxed{\\text{Tuesday}}", "\\text{Monday}", False),
    case("\\boxed{\\text{(B)}}", "B", True),
    case("\\boxed{C}", "B", False),
    # degrees: the degree sign is dropped (30^\circ == 30); radians and degrees are not converted
    case("\\boxed{30^\\circ}", "30", True),
    case("\\boxed{30}", "30^\\circ", True),
    case("\\boxed{45^\\circ}", "30^\\circ", False),
    case("\\boxed{\\frac{\\pi}{6}}", "30^\\circ", True, xfail="degrees are not converted to radians (30° vs π/6)"),
    # percentages: p\% equals p/100 (50\% == 0.5 == 1/2) ...
    case("\\boxed{50\\%}", "0.5", True),
    case("\\boxed{0.5}", "50\\%", True),
    case("\\boxed{1/2}", "50\\%", True),
    case("\\boxed{12}", "0.12", False),
    # ... and a bare p also passes for a p\% gold (and vice versa): lenient, what graders accept for "what percent"
    case("\\boxed{50}", "50\\%", False, xfail="a bare 50 is accepted for a 50\\% gold (50 is not 0.5)"),
    # where the answer is: only the text after the last </think> counts
    case("<think>so it is \\boxed{7}</think> I am done.", "7", False, raw=True),
    case("<think>so it is \\boxed{7}</think>", "7", False, raw=True),
    case("<think>maybe \\boxed{8}</think> \\boxed{7}", "7", True, raw=True),
    case("<think>maybe \\boxed{7}</think> \\boxed{8}", "7", False, raw=True),
    case("<think>a</think> \\boxed{8} </think> \\boxed{7}", "7", True, raw=True),
    # boxed vs bare: the boxed answer wins over other numbers; a bare one is found too
    case("\\boxed{7}, not 8", "7", True),
    case("I first thought 8, but it is 7", "7", True),
    case("$7$", "$7$", True),
    # unicode math
    case("½", "1/2", True, xfail="unicode vulgar fractions are not parsed (no answer found)"),
    case("√2", "\\sqrt{2}", True, xfail="the unicode radical sign is not parsed (no answer found)"),
    case("π", "\\pi", True, xfail="the unicode letter π is not parsed (no answer found)"),
]


@functools.lru_cache(maxsize=None)
def judge_correct(response: str, gold: str) -> bool:
    return score_math(response, gold).reason == "correct"


@pytest.mark.parametrize("response, gold, expected", AGREEMENT)
def test_agreement(response, gold, expected):
    assert judge_correct(response, gold) == expected


def test_agreement_summary():
    """The share of the table where math-verify gives the mathematically expected verdict (xfails included)."""
    rows = [p.values for p in AGREEMENT]
    marked = {(p.values[0], p.values[1]) for p in AGREEMENT if p.marks}
    disagree = [(r, g, e) for r, g, e in rows if judge_correct(r, g) != e]
    rate = 1 - len(disagree) / len(rows)
    print(f"\nmath-verify agrees with the expected verdict on {len(rows) - len(disagree)}/{len(rows)} "
          f"cases ({rate:.1%}); disagreements:")
    for r, g, e in disagree:
        print(f"  expected {'correct' if e else 'not correct'}: {r.removeprefix(ANSWER)!r} vs gold {g!r}")
    assert len(rows) >= 40
    assert {(r, g) for r, g, _ in disagree} == marked  # every disagreement is documented as an xfail, no more
    assert rate >= 0.90

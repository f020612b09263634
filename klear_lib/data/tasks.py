"""Synthetic reasoning tasks for the tiny CPU stand-in (no hub access needed).

Modular arithmetic with a ``<think>`` chain of thought at graded difficulty: the question is a sum of
single digits modulo 10; the teacher writes one line per addition inside ``<think>...</think>`` (the running
value mod 10) and ends with ``\\boxed{answer}``, as the long-CoT responses Klear-Reasoner trains on do.
Each step is one fact of a 10×10 table, which a ≈1M-parameter model learns in a minute of SFT on a CPU;
the level sets the number of steps, so accuracy falls with the level as a real model's falls with problem
difficulty (an error at any step spoils the answer).

    level 1: 2 operands   level 2: 3 operands   level 3: 4 operands   level 4: 6 operands

(Plain multi-digit arithmetic was tried first: after 8,000 SFT samples the tiny model answered 2-5% of it,
too little for RL to start from.)
"""

from __future__ import annotations

import random
import re
from dataclasses import asdict, dataclass

LEVELS = {1: 2, 2: 3, 3: 4, 4: 6}  # level -> number of single-digit operands
MODULUS = 10
MAX_STEP = 3  # operands after the first are 1..MAX_STEP: a 10×3 table of facts per step


@dataclass(frozen=True)
class Problem:
    question: str
    answer: int
    level: int
    operands: tuple[int, ...]

    def to_dict(self) -> dict:
        return asdict(self)


def make_problem(rng: random.Random, level: int) -> Problem:
    """Draw one problem of the given difficulty level (see the module docstring)."""
    if level not in LEVELS:
        raise ValueError(f"level must be one of {sorted(LEVELS)}, got {level!r}")
    operands = (rng.randint(0, 9),) + tuple(rng.randint(1, MAX_STEP) for _ in range(LEVELS[level] - 1))
    expr = " + ".join(map(str, operands))
    return Problem(
        question=f"Compute ({expr}) mod {MODULUS}.",
        answer=sum(operands) % MODULUS,
        level=level,
        operands=operands,
    )


def question_space(level: int) -> int:
    """Distinct questions of ``level``: 10 first digits × ``MAX_STEP`` choices for each later operand."""
    if level not in LEVELS:
        raise ValueError(f"level must be one of {sorted(LEVELS)}, got {level!r}")
    return MODULUS * MAX_STEP ** (LEVELS[level] - 1)


def fair_quotas(total: int, caps: list[int]) -> list[int]:
    """Max-min fair split of ``total`` over slots with capacities ``caps`` (in order): each slot gets an equal
    share; a slot with less room takes all it has and its shortfall is split among the others; what is left
    after equal shares goes one each to the first slots. Raises ValueError when ``total`` exceeds ``sum(caps)``.

    >>> fair_quotas(10, [2, 9, 9])   # 2 is full; 8 left over two slots
    [2, 4, 4]
    >>> fair_quotas(7, [9, 9])       # the odd one goes to the first slot
    [4, 3]
    """
    if total < 0 or any(c < 0 for c in caps):
        raise ValueError(f"fair_quotas: total and caps must be >= 0, got {total}, {caps}")
    if total > sum(caps):
        raise ValueError(f"fair_quotas: {total} does not fit in capacities {caps} (sum {sum(caps)})")
    out, active, left = [0] * len(caps), list(range(len(caps))), total
    while active:
        share = left // len(active)
        full = [i for i in active if caps[i] <= share]
        if not full:
            break
        for i in full:
            out[i], left = caps[i], left - caps[i]
        active = [i for i in active if i not in full]
    if active:
        share, extra = divmod(left, len(active))
        for rank, i in enumerate(active):
            out[i] = share + (rank < extra)
    return out


MAX_HELDOUT_SHARE = 0.5  # of a level's distinct questions: the rest stay available to the training split


def make_splits(
    seed: int, n_train: int, n_heldout: int, levels: tuple[int, ...] = (1, 2, 3, 4)
) -> tuple[list[Problem], list[Problem]]:
    """Fixed train / held-out splits from one seed, with per-level quotas; no held-out question appears in train.

    Held-out: ``n_heldout`` distinct questions split as evenly as possible over ``levels`` (``fair_quotas``),
    each level holding out at most ``MAX_HELDOUT_SHARE`` of its distinct questions; what a small level cannot
    take goes to the others (with the default 128 over levels 1-4: 15 / 38 / 38 / 37 of 30 / 90 / 270 / 2,430
    questions). Train: ``n_train`` problems split evenly over the levels (the first levels get the remainder),
    drawn with replacement from the questions that are not held out, so every level keeps distinct training
    questions (level 1 keeps 15). Both lists are shuffled, so any prefix mixes the levels. The held-out split is
    drawn first, so it does not change when ``n_train`` changes.

    (Before, levels were drawn uniformly and held-out duplicates rejected: level 1's 30 questions filled up, and
    the training split kept only 10 of them, each repeated ~150 times.)
    """
    rng = random.Random(seed)
    levels = tuple(dict.fromkeys(levels))
    for lvl in levels:
        question_space(lvl)  # an unknown level is an error here
    caps = [int(question_space(lvl) * MAX_HELDOUT_SHARE) for lvl in levels]
    if n_heldout > sum(caps):
        space = sum(question_space(lvl) for lvl in levels)
        raise ValueError(f"n_heldout={n_heldout} is too large for levels {levels}: they have {space} distinct "
                         f"questions and at most half of each level may be held out ({sum(caps)})")
    heldout, seen = [], set()
    for lvl, quota in zip(levels, fair_quotas(n_heldout, caps)):
        got = 0
        while got < quota:
            p = make_problem(rng, lvl)
            if p.question not in seen:
                seen.add(p.question)
                heldout.append(p)
                got += 1
    rng.shuffle(heldout)
    train = []
    for lvl, quota in zip(levels, fair_quotas(n_train, [n_train] * len(levels))):
        got = 0
        while got < quota:  # repeats inside train are allowed (level 1 has 30 questions)
            p = make_problem(rng, lvl)
            if p.question not in seen:
                train.append(p)
                got += 1
    rng.shuffle(train)
    return train, heldout


# -- systematic teacher errors: the "fork facts" of the RL stand-in ---------------------------------------------
# A teacher that errs i.i.d. leaves the student's most likely digit right everywhere, so RL at a low temperature
# has nothing to build: it can only sharpen. The RL notebooks' SFT teacher is right everywhere except on a few
# fixed facts of the addition table, where it writes one fixed wrong result most of the time. After SFT the
# student's mode on those facts is wrong and the right digit has probability ≈ 1 - wrong_rate: RL must move the
# mode. Those digits are the "forks" where the clip variants differ (their ratio can leave the trust region).


@dataclass(frozen=True)
class ForkFact:
    """One fact of the addition table that the systematic teacher gets wrong: ``value + addend`` (mod 10) is
    written as ``wrong`` instead of the right result."""

    value: int
    addend: int
    wrong: int

    @property
    def right(self) -> int:
        return (self.value + self.addend) % MODULUS

    def __str__(self) -> str:
        return f"{self.value}+{self.addend}->{self.wrong}"


# Four of the 30 facts (value 0..9, addend 1..MAX_STEP); the wrong result is one off, as a plausible slip.
DEFAULT_FORK_FACTS = "2+3->6,5+1->7,7+2->8,9+3->1"


def parse_fork_facts(text: str) -> tuple[ForkFact, ...]:
    """``"2+3->6,5+1->7"`` -> the facts (value + addend written as the wrong result); an empty string: none."""
    facts = []
    for item in (s.strip() for s in text.split(",")):
        if not item:
            continue
        m = re.fullmatch(r"(\d)\+(\d)->(\d)", item)
        if not m:
            raise ValueError(f"fork fact {item!r}: expected VALUE+ADDEND->WRONG with single digits, e.g. '2+3->6'")
        fact = ForkFact(*map(int, m.groups()))
        if not 1 <= fact.addend <= MAX_STEP:
            raise ValueError(f"fork fact {item!r}: the addend must be in 1..{MAX_STEP} (the task's addends)")
        if fact.wrong == fact.right:
            raise ValueError(f"fork fact {item!r}: {fact.value} + {fact.addend} = {fact.right} mod {MODULUS} is right; "
                             f"a fork fact writes a wrong result")
        facts.append(fact)
    keys = [(f.value, f.addend) for f in facts]
    if len(set(keys)) != len(keys):
        raise ValueError(f"fork facts {text!r}: a fact is listed twice")
    return tuple(facts)


def fork_steps(problem: Problem, facts: tuple[ForkFact, ...]) -> list[int]:
    """Indices (0-based) of the steps of the *correct* chain of ``problem`` that use a fork fact."""
    keys = {(f.value, f.addend) for f in facts}
    steps, value = [], problem.operands[0]
    for i, b in enumerate(problem.operands[1:]):
        if (value, b) in keys:
            steps.append(i)
        value = (value + b) % MODULUS
    return steps


def is_fork_problem(problem: Problem, facts: tuple[ForkFact, ...]) -> bool:
    """Whether solving ``problem`` correctly needs at least one fork fact."""
    return bool(fork_steps(problem, facts))


def teacher_solution(problem: Problem, rng: random.Random | None = None, *, error_rate: float = 0.0,
                     fork_facts: tuple[ForkFact, ...] = (), fork_wrong_rate: float = 0.0) -> str:
    """A teacher's long-CoT response: one ``<think>`` line per addition, then ``\\boxed{}``.

    With ``error_rate`` > 0 each step is wrong (off by one to nine) with that probability and the error
    propagates, as an imperfect teacher's would (the SFT data ablations' synthetic sources use this). With
    ``fork_facts``, a step that uses one of them (on the chain as written so far) writes the fact's wrong result
    with probability ``fork_wrong_rate``: a systematic error, the same wrong digit every time.
    """
    rng = rng or random.Random(0)
    forks = {(f.value, f.addend): f.wrong for f in fork_facts}
    lines, value = [], problem.operands[0]
    for b in problem.operands[1:]:
        new = (value + b) % MODULUS
        if (value, b) in forks and fork_wrong_rate and rng.random() < fork_wrong_rate:
            new = forks[(value, b)]
        elif error_rate and rng.random() < error_rate:
            new = (new + rng.randint(1, MODULUS - 1)) % MODULUS
        lines.append(f"{value} + {b} = {new}")
        value = new
    return "<think>\n" + "\n".join(lines) + "\n</think>\n\\boxed{" + str(value) + "}"


_STEP_LINE = re.compile(r"(\d) \+ (\d) = (\d)")


def fork_token_mask(tokenizer, completion_ids, completion_mask, facts: tuple[ForkFact, ...]):
    """(B, T) bool: the completion tokens that write the result of a fork fact, as the completion wrote the step
    (``v + b = c`` with (v, b) a fork fact: the token of c), within ``completion_mask``. The trainer restricts its
    clip statistics to these tokens (``actor/*_fork``): there the clip variants differ."""
    import torch

    keys = {(f.value, f.addend) for f in facts}
    out = torch.zeros_like(completion_mask, dtype=torch.bool)
    if not keys:
        return out
    for row, (ids, mask) in enumerate(zip(completion_ids.tolist(), completion_mask.tolist())):
        n = int(sum(mask))
        pieces = tokenizer.batch_decode([[i] for i in ids[:n]])
        ends, total = [], 0
        for piece in pieces:
            total += len(piece)
            ends.append(total)
        text = "".join(pieces)
        for m in _STEP_LINE.finditer(text):
            if (int(m.group(1)), int(m.group(2))) in keys:
                pos = m.start(3)  # the result digit's character: the token whose span holds it
                tok = next((i for i, e in enumerate(ends) if e > pos), None)
                if tok is not None:
                    out[row, tok] = True
    return out & completion_mask.bool()


def fork_probe_prefixes(facts: tuple[ForkFact, ...]) -> list[tuple[Problem, str, ForkFact]]:
    """Fixed probes of the fork facts: for each fact, a level-1 problem that is the fact itself and a level-3
    problem that reaches the fact at its second step, each with the correct response up to the fork digit.
    Returns ``(problem, response prefix, fact)``; the next token after the prefix is the fork digit."""
    probes = []
    for f in facts:
        one = Problem(f"Compute ({f.value} + {f.addend}) mod {MODULUS}.", f.right, 1, (f.value, f.addend))
        probes.append((one, f"<think>\n{f.value} + {f.addend} = ", f))
        start, first = (f.value - 1) % MODULUS, 1
        ops = (start, first, f.addend, 1)
        expr = " + ".join(map(str, ops))
        three = Problem(f"Compute ({expr}) mod {MODULUS}.", sum(ops) % MODULUS, 3, ops)
        probes.append((three, f"<think>\n{start} + {first} = {f.value}\n{f.value} + {f.addend} = ", f))
    return probes


REST_PROBE_PROBLEMS = 32  # non-fork problems of the rest probe (klear/p_correct_rest)


def rest_probe_prefixes(problems: list[Problem], facts: tuple[ForkFact, ...],
                        k: int = REST_PROBE_PROBLEMS) -> list[tuple[Problem, str, int]]:
    """Fixed probes of what the model already knows: the first ``k`` problems of ``problems`` whose correct chain
    uses no fork fact, each step's result digit with the correct response up to it. Returns ``(problem, response
    prefix, right digit)``; the next token after the prefix is that digit."""
    probes = []
    for p in [q for q in problems if not is_fork_problem(q, facts)][:k]:
        lines, value = [], p.operands[0]
        for b in p.operands[1:]:
            new = (value + b) % MODULUS
            probes.append((p, "<think>\n" + "".join(line + "\n" for line in lines) + f"{value} + {b} = ", new))
            lines.append(f"{value} + {b} = {new}")
            value = new
    return probes


def prompt_messages(problem: Problem) -> list[dict]:
    """The chat prompt for one problem (conversational format, as TRL trainers take it)."""
    return [{"role": "user", "content": problem.question}]


_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
FORMAT_RULES = ("released", "paper", "none")
"""How a judge treats the ``<think>`` format (``klear_lib.rewards.math`` has the penalties; ``RLExperimentConfig``'s
``format_rule``): ``none`` reads the answer from the whole response, the others after the last ``</think>``."""


def extract_answer(completion: str, format_rule: str = "released") -> str | None:
    """The content of the last ``\\boxed{}`` after the last ``</think>`` (None if either is missing); under
    ``format_rule="none"`` the last ``\\boxed{}`` anywhere."""
    if format_rule not in FORMAT_RULES:
        raise ValueError(f"format_rule={format_rule!r}; valid: {', '.join(FORMAT_RULES)}")
    if format_rule == "none":
        tail = completion
    elif "</think>" not in completion:
        return None
    else:
        tail = completion.rsplit("</think>", 1)[1]
    found = _BOXED.findall(tail)
    return found[-1].strip() if found else None


def exact_answer_reward(completion: str, answer: int | str, format_rule: str = "released") -> tuple[float, str]:
    """1.0 if the boxed answer after ``</think>`` equals the gold answer, else 0.0; with a reason. Under
    ``format_rule="none"`` the last boxed answer anywhere is read (a model without a think format).

    Reasons: ``correct``, ``wrong``, ``no_think_close``, ``no_answer``. The math-verify judge with Klear's
    format penalties lives in ``klear_lib.rewards.math``; this exact-match reward is enough for integers.
    """
    if format_rule not in FORMAT_RULES:
        raise ValueError(f"format_rule={format_rule!r}; valid: {', '.join(FORMAT_RULES)}")
    if format_rule != "none" and "</think>" not in completion:
        return 0.0, "no_think_close"
    got = extract_answer(completion, format_rule)
    if got is None:
        return 0.0, "no_answer"
    return (1.0, "correct") if got == str(answer) else (0.0, "wrong")


def corpus(problems: list[Problem]) -> list[str]:
    """Every text a tokenizer for this task must cover: questions and teacher solutions."""
    rng = random.Random(0)
    return [p.question for p in problems] + [teacher_solution(p, rng) for p in problems]


# -- program synthesis (the code reward's tiny task) -------------------------------------------------------------
# From four input/output examples the model writes a two-branch Python function, f(x) = x + a for even x and
# x + b for odd x (a, b in 0..9). The hidden tests are other inputs, half even and half odd, so a program with
# one branch right passes half of them: partial credit, which the soft (pass-rate) reward sees and the hard
# (all-or-nothing) one does not. The chain of thought reads a off f(0) and b off f(1) - 1.

CODE_EXAMPLE_INPUTS = (0, 1, 2, 3)
CODE_TEST_INPUTS = tuple(range(4, 20))  # 16 hidden tests: Klear runs up to 16 per sample


@dataclass(frozen=True)
class CodeProblem:
    question: str
    even_add: int
    odd_add: int

    def f(self, x: int) -> int:
        return x + (self.even_add if x % 2 == 0 else self.odd_add)

    @property
    def tests(self) -> list[dict]:
        """Function-call tests in the format of klear_lib.rewards.code (``fn_name``, ``args``, ``expected``)."""
        return [{"fn_name": "f", "args": [x], "expected": self.f(x)} for x in CODE_TEST_INPUTS]

    def to_dict(self) -> dict:
        return asdict(self)


def code_problem(even_add: int, odd_add: int) -> CodeProblem:
    """The problem whose function adds ``even_add`` to even and ``odd_add`` to odd inputs."""
    probe = CodeProblem("", even_add, odd_add)
    examples = ", ".join(f"f({x}) = {probe.f(x)}" for x in CODE_EXAMPLE_INPUTS)
    return CodeProblem(f"Write a Python function f with {examples}.", even_add, odd_add)


def make_code_splits(seed: int, n_train: int, n_heldout: int) -> tuple[list[CodeProblem], list[CodeProblem]]:
    """Train / held-out code problems from one seed; the 100 (a, b) pairs are split, never shared."""
    rng = random.Random(seed)
    pairs = [(a, b) for a in range(10) for b in range(10)]
    rng.shuffle(pairs)
    if not 0 < n_heldout < len(pairs):
        raise ValueError(f"n_heldout must be in 1..{len(pairs) - 1}, got {n_heldout}")
    held_pairs, train_pairs = pairs[:n_heldout], pairs[n_heldout:]

    heldout = [code_problem(a, b) for a, b in held_pairs]
    train = [code_problem(*rng.choice(train_pairs)) for _ in range(n_train)]
    return train, heldout


def code_teacher_solution(problem: CodeProblem, rng: random.Random | None = None, *, error_rate: float = 0.0) -> str:
    """The teacher's response: read the offsets off the examples, then one fenced ``python`` block.

    With ``error_rate`` > 0 each of the two offsets is wrong with that probability (the program then fails the
    tests of that branch only).
    """
    rng = rng or random.Random(0)
    a, b = problem.even_add, problem.odd_add
    if error_rate and rng.random() < error_rate:
        a = (a + rng.randint(1, 9)) % 10
    if error_rate and rng.random() < error_rate:
        b = (b + rng.randint(1, 9)) % 10
    think = f"<think>\nf(0) = {problem.f(0)} so even x adds {a}\nf(1) = {problem.f(1)} so odd x adds {b}\n</think>\n"
    code = f"def f(x):\n    if x % 2 == 0:\n        return x + {a}\n    return x + {b}\n"
    return think + "```python\n" + code + "```"


def code_prompt_messages(problem: CodeProblem) -> list[dict]:
    return [{"role": "user", "content": problem.question}]


def code_corpus(problems: list[CodeProblem]) -> list[str]:
    rng = random.Random(0)
    return [p.question for p in problems] + [code_teacher_solution(p, rng) for p in problems]


# -- program synthesis with more branches (notebook 05): full passes rare, partial credit common -------------------
# A lookup program: f(x) = c[x mod B], one value c_k in 0..9 per branch k (B = 4 by default), shown through the
# examples f(0) .. f(B-1); the chain of thought writes each example again, the program a table {k: c_k}.
# Hidden tests cover every branch equally, so a program with j of B values right passes j/B of them. With a
# per-branch error p the teacher's program is fully right (1-p)^B of the time (p = 0.4: 13%) while most programs
# pass some tests: the regime in which the paper's soft reward should beat the all-or-nothing one. (Two first tries
# were not learned in 250 SFT steps: f(x) = x + c[x mod 4] with c read off f(k) - k, 1% of programs passing every
# test; the lookup after lines `x % 4 == k: c` that do not repeat the examples, 30% of branches right where the
# teacher was right on 60%. Copying `f(k) = c` into the chain first, and 500 steps, made it learnable.)

BRANCH_TEST_INPUTS = tuple(range(4, 8))  # 4 hidden tests, one per branch of four (a second per branch adds nothing)


@dataclass(frozen=True)
class BranchCodeProblem:
    question: str
    values: tuple[int, ...]

    def f(self, x: int) -> int:
        return self.values[x % len(self.values)]

    @property
    def tests(self) -> list[dict]:
        """Function-call tests in the format of klear_lib.rewards.code, every branch equally often."""
        return [{"fn_name": "f", "args": [x], "expected": self.f(x)} for x in BRANCH_TEST_INPUTS]

    def to_dict(self) -> dict:
        return asdict(self)


def branch_code_problem(values: tuple[int, ...]) -> BranchCodeProblem:
    """The problem whose function returns ``values[x % len(values)]``; its examples are f(0) .. f(len(values)-1)."""
    values = tuple(values)
    if not values or not all(0 <= v <= 9 for v in values) or len(BRANCH_TEST_INPUTS) % len(values):
        raise ValueError(f"values must be digits, as many as divide the {len(BRANCH_TEST_INPUTS)} tests evenly; "
                         f"got {values!r}")
    examples = ", ".join(f"f({x}) = {v}" for x, v in enumerate(values))
    return BranchCodeProblem(f"Write a Python function f of period {len(values)} with {examples}.", values)


def make_branch_code_splits(seed: int, n_train: int, n_heldout: int, branches: int = 4
                            ) -> tuple[list[BranchCodeProblem], list[BranchCodeProblem]]:
    """Train / held-out problems from one seed; a held-out function (its values) never appears in train.
    Held-out: ``n_heldout`` distinct functions; train: ``n_train`` draws from the others (repeats allowed)."""
    space = 10 ** branches
    if not 0 < n_heldout <= space // 2:
        raise ValueError(f"n_heldout must be in 1..{space // 2} (half of the {space} functions), got {n_heldout}")
    rng = random.Random(seed)

    def draw():
        return tuple(rng.randint(0, 9) for _ in range(branches))

    held = []
    while len(held) < n_heldout:
        values = draw()
        if values not in held:
            held.append(values)
    taken, train = set(held), []
    while len(train) < n_train:
        values = draw()
        if values not in taken:
            train.append(values)
    return [branch_code_problem(v) for v in train], [branch_code_problem(v) for v in held]


def branch_code_solution(problem: BranchCodeProblem, rng: random.Random | None = None, *,
                         error_rate: float = 0.0) -> str:
    """The teacher's response: one line per branch with its value, then one ``python`` block. With
    ``error_rate`` > 0 each value is wrong (another digit) with that probability, in the line and in the program
    alike: the program fails that branch's tests only."""
    rng = rng or random.Random(0)
    values = list(problem.values)
    for k in range(len(values)):
        if error_rate and rng.random() < error_rate:
            values[k] = (values[k] + rng.randint(1, 9)) % 10
    b = len(values)
    lines = [f"f({k}) = {v}" for k, v in enumerate(values)]
    table = ", ".join(f"{k}: {v}" for k, v in enumerate(values))
    code = f"def f(x):\n    return {{{table}}}[x % {b}]\n"
    return "<think>\n" + "\n".join(lines) + "\n</think>\n```python\n" + code + "```"


def branch_code_corpus(problems: list[BranchCodeProblem]) -> list[str]:
    rng = random.Random(0)
    return [p.question for p in problems] + [branch_code_solution(p, rng, error_rate=0.3) for p in problems]

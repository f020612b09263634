"""The tiny stand-in: task generation and rewards, tokenizer, model building and offline save/reload."""

import random

import pytest
import torch

from klear_lib import models
from klear_lib.data import tasks


def test_problem_answer_is_the_modular_sum_and_levels_set_the_chain_length():
    rng = random.Random(0)
    for level, n_operands in tasks.LEVELS.items():
        for _ in range(50):
            p = tasks.make_problem(rng, level)
            assert len(p.operands) == n_operands
            assert p.answer == sum(p.operands) % tasks.MODULUS
            assert all(1 <= b <= tasks.MAX_STEP for b in p.operands[1:])
            assert p.question == f"Compute ({' + '.join(map(str, p.operands))}) mod 10."
    with pytest.raises(ValueError, match="level must be one of"):
        tasks.make_problem(rng, 9)


def test_teacher_solution_is_a_correct_chain_and_scores_one():
    p = tasks.Problem("Compute (8 + 3 + 2) mod 10.", 3, 2, (8, 3, 2))
    sol = tasks.teacher_solution(p)
    # 8 + 3 = 11 -> 1; 1 + 2 = 3
    assert sol == "<think>\n8 + 3 = 1\n1 + 2 = 3\n</think>\n\\boxed{3}"
    assert tasks.exact_answer_reward(sol, 3) == (1.0, "correct")


def test_noisy_teacher_errs_at_about_its_rate():
    rng = random.Random(1)
    train, _ = tasks.make_splits(0, 2000, 10)
    wrong = sum(tasks.exact_answer_reward(tasks.teacher_solution(p, rng, error_rate=0.3), p.answer)[0] == 0
                for p in train if p.level == 1)
    n1 = sum(p.level == 1 for p in train)
    assert 0.22 < wrong / n1 < 0.38  # one step at error rate 0.3


@pytest.mark.parametrize("text,reward,reason", [
    ("<think>\n1 + 2 = 3\n</think>\n\\boxed{3}", 1.0, "correct"),
    ("<think>\n1 + 2 = 4\n</think>\n\\boxed{4}", 0.0, "wrong"),
    ("<think>\n\\boxed{3}", 0.0, "no_think_close"),
    ("<think>\n</think>\nthe answer is 3", 0.0, "no_answer"),
    ("\\boxed{3}</think>\\boxed{5}", 0.0, "wrong"),  # only the answer after the last </think> counts
])
def test_exact_answer_reward_reasons(text, reward, reason):
    assert tasks.exact_answer_reward(text, 3) == (reward, reason)


def test_a_held_out_split_larger_than_half_the_question_space_is_refused():
    # level 1 has 10 first digits x 3 steps = 30 questions
    with pytest.raises(ValueError, match="n_heldout=16 is too large for levels \\(1,\\): they have 30"):
        tasks.make_splits(0, 10, 16, levels=(1,))
    assert len(tasks.make_splits(0, 10, 15, levels=(1,))[1]) == 15


def test_splits_are_fixed_by_the_seed_and_disjoint():
    a_train, a_held = tasks.make_splits(7, 300, 40)
    b_train, b_held = tasks.make_splits(7, 300, 40)
    assert a_train == b_train and a_held == b_held
    assert not {p.question for p in a_held} & {p.question for p in a_train}
    # the held-out split does not move when the train split grows
    _, c_held = tasks.make_splits(7, 900, 40)
    assert c_held == a_held


def test_fair_quotas_hand_computed():
    assert tasks.fair_quotas(128, [15, 45, 135, 1215]) == [15, 38, 38, 37]  # 113 = 38 + 38 + 37 after level 1
    assert tasks.fair_quotas(6, [9, 9, 9, 9]) == [2, 2, 1, 1]
    assert tasks.fair_quotas(0, [3, 0]) == [0, 0]
    assert tasks.fair_quotas(5, [0, 5]) == [0, 5]
    with pytest.raises(ValueError, match="does not fit"):
        tasks.fair_quotas(4, [1, 2])


def test_splits_have_level_quotas_and_every_level_keeps_training_questions():
    """Pinned per-level counts of both splits (the notebooks' default split: data_seed 1234, 6,000 / 128)."""
    train, held = tasks.make_splits(1234, 6000, 128)
    def count(ps):
        return {lvl: sum(p.level == lvl for p in ps) for lvl in tasks.LEVELS}

    assert count(held) == {1: 15, 2: 38, 3: 38, 4: 37}  # level 1: half of its 30 questions, never all
    assert count(train) == {1: 1500, 2: 1500, 3: 1500, 4: 1500}
    assert len({p.question for p in held}) == 128
    assert not {p.question for p in held} & {p.question for p in train}
    assert len({p.question for p in train if p.level == 1}) == 15  # every level-1 question not held out
    assert {p.level for p in train[:40]} == set(tasks.LEVELS)  # shuffled: a prefix mixes the levels
    # notebook 01's validation + test draw (192) and odd sizes: remainders go to the first levels
    _, held = tasks.make_splits(1234, 0, 192)
    assert count(held) == {1: 15, 2: 45, 3: 66, 4: 66}  # level 2 holds out half of its 90
    train, held = tasks.make_splits(0, 10, 7, levels=(2, 4))
    assert count(held) == {1: 0, 2: 4, 3: 0, 4: 3} and count(train) == {1: 0, 2: 5, 3: 0, 4: 5}


@pytest.fixture(scope="module")
def tokenizer():
    train, _ = tasks.make_splits(0, 200, 10)
    return models.build_tokenizer(tasks.corpus(train))


def test_tokenizer_digits_are_single_tokens_and_specials_are_atomic(tokenizer):
    ids = tokenizer("<think>\n123 + 45 = 168\n</think>", add_special_tokens=False)["input_ids"]
    toks = tokenizer.convert_ids_to_tokens(ids)
    assert toks[0] == "<think>" and toks[-1] == "</think>"
    digits = [t for t in toks if any(c.isdigit() for c in t)]
    assert digits == list("12345168")
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.padding_side == "left"


def test_chat_template_is_chatml(tokenizer):
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Compute (1 + 2) mod 10."}],
                                         tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\nCompute (1 + 2) mod 10.<|im_end|>\n<|im_start|>assistant\n"


def test_tiny_model_size_and_offline_roundtrip(tmp_path, tokenizer):
    model = models.build_tiny_model(tokenizer)
    n = models.count_parameters(model)
    assert 0.5e6 < n < 1.5e6, n
    models.save_model_and_tokenizer(model, tokenizer, tmp_path / "m")
    model2, tok2 = models.load_model_and_tokenizer(tmp_path / "m", dtype=torch.float32)
    ids = torch.tensor([tokenizer("Compute (1 + 2) mod 10.")["input_ids"]])
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, model2(ids).logits, atol=1e-6)
    assert tok2.get_vocab() == tokenizer.get_vocab()
    assert model2.generation_config.eos_token_id == tokenizer.eos_token_id


# -- the program-synthesis task, judged by the real sandbox ----------------------------------------------------
def test_code_splits_hold_out_whole_functions():
    train, held = tasks.make_code_splits(3, 500, 20)
    held_pairs = {(p.even_add, p.odd_add) for p in held}
    assert len(held_pairs) == 20
    assert not held_pairs & {(p.even_add, p.odd_add) for p in train}
    p = tasks.code_problem(4, 7)
    # f(0) = 0 + 4, f(1) = 1 + 7, f(2) = 2 + 4, f(3) = 3 + 7
    assert p.question == "Write a Python function f with f(0) = 4, f(1) = 8, f(2) = 6, f(3) = 10."
    assert [t["expected"] for t in p.tests[:2]] == [8, 12] and len(p.tests) == 16


@pytest.mark.skipif(__import__("shutil").which("bwrap") is None, reason="bubblewrap is not installed")
def test_teacher_programs_pass_in_the_sandbox_and_one_wrong_branch_passes_half():
    from klear_lib.rewards.code import score_code

    p = tasks.code_problem(4, 7)
    good = tasks.code_teacher_solution(p)
    assert score_code(good, p.tests, mode="soft").score == 1.0
    wrong_odd = good.replace("return x + 7", "return x + 6")
    res = score_code(wrong_odd, p.tests, mode="soft")
    assert (res.passed, res.total, res.score) == (8, 16, 0.5)
    assert score_code(wrong_odd, p.tests, mode="hard").score == 0.0
    assert score_code(wrong_odd, p.tests, mode="signed").score == 0.0  # 2 * 0.5 - 1


# -- the fork facts: systematic teacher errors of the RL stand-in ----------------------------------------------
def test_fork_teacher_writes_the_fixed_wrong_result_at_its_rate_and_is_right_elsewhere():
    facts = tasks.parse_fork_facts("2+3->6,7+2->8")
    rng = random.Random(0)
    seen = {"2+3": [], "7+2": [], "other_wrong": 0, "other": 0}
    for _ in range(4000):
        p = tasks.make_problem(rng, 4)
        sol = tasks.teacher_solution(p, rng, fork_facts=facts, fork_wrong_rate=0.8)
        for line in sol.split("\n")[1:-2]:
            a, b, c = (int(x) for x in line.replace("+", " ").replace("=", " ").split())
            key = f"{a}+{b}"
            if key in seen:
                seen[key].append(c)
            else:
                seen["other"] += 1
                seen["other_wrong"] += c != (a + b) % 10
    assert seen["other_wrong"] == 0 and seen["other"] > 1000  # right everywhere else (on its own chain)
    for key, wrong in (("2+3", 6), ("7+2", 8)):
        vals = seen[key]
        assert set(vals) == {wrong, (int(key[0]) + int(key[2])) % 10}  # one fixed wrong digit, never another
        share = sum(v == wrong for v in vals) / len(vals)
        assert len(vals) > 300 and abs(share - 0.8) < 0.05, (key, share, len(vals))


def test_fork_steps_follow_the_correct_chain():
    facts = tasks.parse_fork_facts("2+3->6,5+1->7")
    p = tasks.Problem("", 7, 3, (1, 1, 3, 1, 1))  # 1+1->2, 2+3->5 (fork), 5+1->6 (fork), 6+1->7
    assert tasks.fork_steps(p, facts) == [1, 2] and tasks.is_fork_problem(p, facts)
    assert not tasks.is_fork_problem(tasks.Problem("", 3, 1, (1, 2)), facts)
    assert tasks.parse_fork_facts("") == ()
    with pytest.raises(ValueError, match="listed twice"):
        tasks.parse_fork_facts("2+3->6,2+3->7")


def _probe_model(train):
    """A small untrained model and tokenizer for the probes' tests (random, so every digit has some mass)."""
    tok = models.build_tokenizer(tasks.corpus(train))
    spec = models.TinyModelSpec(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                intermediate_size=64)
    return tok, models.build_tiny_model(tok, spec, seed=3)


def test_fork_probe_is_the_next_token_probability_of_the_right_and_wrong_digit():
    """Second implementation: the full text's logits, one probe at a time, without padding."""
    from klear_lib.evaluation.heldout import fork_probe

    train, _ = tasks.make_splits(0, 64, 4)
    tok, model = _probe_model(train)
    facts = tasks.parse_fork_facts("2+3->6,9+3->1")
    got = fork_probe(model, tok, facts)
    right, wrong = [], []
    for problem, prefix, fact in tasks.fork_probe_prefixes(facts):
        head = tok.apply_chat_template(tasks.prompt_messages(problem), tokenize=False, add_generation_prompt=True)
        ids = torch.tensor([tok(head + prefix, add_special_tokens=False)["input_ids"]])
        with torch.no_grad():
            probs = torch.softmax(model(input_ids=ids).logits[0, -1].float(), -1)
        right.append(float(probs[tok.convert_tokens_to_ids(str(fact.right))]))
        wrong.append(float(probs[tok.convert_tokens_to_ids(str(fact.wrong))]))
    assert got["p_correct_fork"] == pytest.approx(sum(right) / len(right), abs=1e-5)
    assert got["p_wrong_fork"] == pytest.approx(sum(wrong) / len(wrong), abs=1e-5)
    assert len(right) == 4  # two probes per fact


def test_rest_probe_is_the_right_result_digit_at_every_step_of_the_non_fork_problems():
    """Second implementation: each step's prefix written out by hand from the operands, one forward pass per probe
    without padding; the fork problems are left out."""
    from klear_lib.evaluation.heldout import rest_probe

    train, held = tasks.make_splits(0, 64, 48)
    tok, model = _probe_model(train)
    facts = tasks.parse_fork_facts("2+3->6,9+3->1")
    got = rest_probe(model, tok, held, facts)
    rest = [p for p in held if not tasks.is_fork_problem(p, facts)][:tasks.REST_PROBE_PROBLEMS]
    assert 0 < len(rest) < len(held)  # some held-out problems need a fork fact and are left out
    expected = []
    for p in rest:
        ops, value, lines = p.operands, p.operands[0], ""
        head = tok.apply_chat_template(tasks.prompt_messages(p), tokenize=False, add_generation_prompt=True)
        for b in ops[1:]:
            ids = torch.tensor([tok(head + "<think>\n" + lines + f"{value} + {b} = ", add_special_tokens=False)
                                ["input_ids"]])
            with torch.no_grad():
                probs = torch.softmax(model(input_ids=ids).logits[0, -1].float(), -1)
            expected.append(float(probs[tok.convert_tokens_to_ids(str((value + b) % 10))]))
            lines += f"{value} + {b} = {(value + b) % 10}\n"
            value = (value + b) % 10
    assert got["p_correct_rest"] == pytest.approx(sum(expected) / len(expected), abs=1e-5)


# -- the branch program-synthesis task (notebook 05) --------------------------------------------------------------
def test_branch_code_problem_hand_computed_and_splits_hold_out_whole_functions():
    p = tasks.branch_code_problem((7, 2, 5, 1))
    assert p.question == "Write a Python function f of period 4 with f(0) = 7, f(1) = 2, f(2) = 5, f(3) = 1."
    # inputs 4..7 take branches 0, 1, 2, 3
    assert [t["expected"] for t in p.tests] == [7, 2, 5, 1]
    assert sorted(x % 4 for x in tasks.BRANCH_TEST_INPUTS) == [0, 1, 2, 3]  # every branch once
    train, held = tasks.make_branch_code_splits(3, 500, 20)
    assert len({q.values for q in held}) == 20 and not {q.values for q in held} & {q.values for q in train}
    assert tasks.make_branch_code_splits(3, 500, 20) == (train, held)
    with pytest.raises(ValueError, match="values must be digits"):
        tasks.branch_code_problem((1, 2, 3))  # 4 tests do not split over 3 branches
    with pytest.raises(ValueError, match="n_heldout"):
        tasks.make_branch_code_splits(0, 1, 60, branches=2)  # 100 functions: at most 50 held out


def test_branch_code_teacher_errs_per_value():
    p = tasks.branch_code_problem((7, 2, 5, 1))
    assert tasks.branch_code_solution(p) == ("<think>\nf(0) = 7\nf(1) = 2\nf(2) = 5\nf(3) = 1\n</think>\n```python\n"
                                             "def f(x):\n    return {0: 7, 1: 2, 2: 5, 3: 1}[x % 4]\n```")
    rng = random.Random(0)
    right = [tasks.branch_code_solution(p, rng, error_rate=0.4).endswith("{0: 7, 1: 2, 2: 5, 3: 1}[x % 4]\n```")
             for _ in range(3000)]
    assert abs(sum(right) / len(right) - 0.6 ** 4) < 0.02  # fully right: 0.6^4 = 0.13


@pytest.mark.skipif(__import__("shutil").which("bwrap") is None, reason="bubblewrap is not installed")
def test_branch_programs_in_the_sandbox_earn_partial_credit_per_branch():
    from klear_lib.rewards.code import score_code

    p = tasks.branch_code_problem((7, 2, 5, 1))
    good = tasks.branch_code_solution(p)
    assert score_code(good, p.tests, mode="soft").score == 1.0
    one_wrong = good.replace("2: 5", "2: 6")
    res = score_code(one_wrong, p.tests, mode="soft")
    assert (res.passed, res.total, res.score, res.reason) == (3, 4, 0.75, "some_passed")
    assert score_code(one_wrong, p.tests, mode="hard").score == 0.0
    one_branch = tasks.branch_code_problem((4,))
    assert score_code(tasks.branch_code_solution(one_branch), one_branch.tests, mode="hard").score == 1.0

"""Held-out accuracy of the tiny task: avg@n under the evaluation protocol's sampling (reference section 7).

avg@n = mean over problems of the fraction of n samples judged correct (an unbiased pass@1 estimate).
"""

from __future__ import annotations

from collections import defaultdict

import torch

from klear_lib.data.tasks import (
    ForkFact,
    Problem,
    exact_answer_reward,
    fork_probe_prefixes,
    is_fork_problem,
    prompt_messages,
    rest_probe_prefixes,
)
from klear_lib.rollout import generate


def evaluate_heldout(
    model,
    tokenizer,
    problems: list[Problem],
    *,
    n: int = 4,
    temperature: float = 0.6,
    top_p: float = 0.95,
    max_new_tokens: int = 64,
    batch_size: int = 128,
    fork_facts: tuple[ForkFact, ...] = (),
    format_rule: str = "released",
) -> dict:
    """Returns ``{"avg_at_n": float, "format_rate": float, "by_level": {level: avg@n}, "n": n}``, and with
    ``fork_facts`` also ``avg_at_n_fork`` / ``avg_at_n_rest``: avg@n over the problems whose correct chain uses a
    fork fact and over the others (NaN where a part is empty).

    ``format_rate`` is the fraction of samples with a ``</think>`` and a boxed answer after it (under
    ``format_rule="none"``, the judge of a model without a think format: with a boxed answer anywhere, which is then
    the answer judged; ``tasks.exact_answer_reward``).
    """
    completions = generate(
        model,
        tokenizer,
        [prompt_messages(p) for p in problems],
        n=n,
        temperature=temperature,
        top_p=top_p,
        max_new_tokens=max_new_tokens,
        batch_size=batch_size,
    )
    per_problem, formatted, by_level, by_fork = [], 0, defaultdict(list), defaultdict(list)
    for p, samples in zip(problems, completions):
        scores = [exact_answer_reward(c, p.answer, format_rule) for c in samples]
        acc = sum(s for s, _ in scores) / n
        formatted += sum(r in ("correct", "wrong") for _, r in scores)
        per_problem.append(acc)
        by_level[p.level].append(acc)
        by_fork["fork" if is_fork_problem(p, fork_facts) else "rest"].append(acc)
    out = {
        "avg_at_n": sum(per_problem) / max(len(per_problem), 1),
        "format_rate": formatted / max(n * len(problems), 1),
        "by_level": {lvl: sum(v) / len(v) for lvl, v in sorted(by_level.items())},
        "n": n,
    }
    if fork_facts:
        for part in ("fork", "rest"):
            v = by_fork[part]
            out[f"avg_at_n_{part}"] = sum(v) / len(v) if v else float("nan")
    return out


def _digit_probabilities(model, tokenizer, probes: list[tuple[Problem, str, tuple[int, ...]]]) -> torch.Tensor:
    """For each ``(problem, response prefix, digits)``, the next-token probability of each digit after the chat
    prompt and the prefix, at temperature 1, in one forward pass: (P, len(digits)). Each digit must be one token
    after the prefix."""
    texts, ids = [], []
    for problem, prefix, digits in probes:
        head = tokenizer.apply_chat_template(prompt_messages(problem), tokenize=False, add_generation_prompt=True)
        ids_prefix = tokenizer(head + prefix, add_special_tokens=False)["input_ids"]
        row = []
        for digit in digits:
            full = tokenizer(head + prefix + str(digit), add_special_tokens=False)["input_ids"]
            if full[:-1] != ids_prefix:
                raise ValueError(f"probe of {problem.question!r}: the digit {digit} is not one token after the prefix "
                                 f"{prefix!r} with this tokenizer (the probes need single-token digits)")
            row.append(full[-1])
        texts.append(head + prefix)
        ids.append(row)
    was_training = model.training
    model.eval()
    enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
    logits = model(**enc).logits[:, -1, :].float()  # (P, V), left padding: the last position is the prefix's end
    probs = torch.softmax(logits, dim=-1)
    model.train(was_training)
    return probs.gather(1, torch.tensor(ids, device=probs.device))  # (P, len(digits))


@torch.no_grad()
def fork_probe(model, tokenizer, facts: tuple[ForkFact, ...]) -> dict:
    """Mean probability of the right digit at the fork positions of fixed probes (``tasks.fork_probe_prefixes``:
    each fork fact alone and at the second step of a chain, with the correct response up to the fork digit), in
    one forward pass at temperature 1. Returns ``{"p_correct_fork": mean p(right), "p_wrong_fork": mean p(the
    teacher's wrong digit)}``; this is the metric ``klear/p_correct_fork``.
    """
    probes = fork_probe_prefixes(facts)
    if not probes:
        return {}
    p = _digit_probabilities(model, tokenizer, [(prob, prefix, (f.right, f.wrong)) for prob, prefix, f in probes])
    return {"p_correct_fork": float(p[:, 0].mean()), "p_wrong_fork": float(p[:, 1].mean())}


@torch.no_grad()
def rest_probe(model, tokenizer, problems: list[Problem], facts: tuple[ForkFact, ...]) -> dict:
    """Mean probability of the right result digit at every step of the first ``tasks.REST_PROBE_PROBLEMS``
    non-fork problems of ``problems`` (``tasks.rest_probe_prefixes``: the correct chain up to each result), in one
    forward pass at temperature 1: ``{"p_correct_rest": ...}``, the metric ``klear/p_correct_rest``. What the
    SFT start already knows (≈0.99): a run that loses it is unstable, whatever it does at the forks."""
    probes = rest_probe_prefixes(problems, facts)
    if not probes:
        return {}
    p = _digit_probabilities(model, tokenizer, [(prob, prefix, (right,)) for prob, prefix, right in probes])
    return {"p_correct_rest": float(p[:, 0].mean())}


def arithmetic_probes(model, tokenizer, facts: tuple[ForkFact, ...], problems: list[Problem]) -> dict:
    """Both probes of the arithmetic task with fork facts, as ``run_rl`` logs them every rollout."""
    return {**fork_probe(model, tokenizer, facts), **rest_probe(model, tokenizer, problems, facts)}

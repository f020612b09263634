"""Held-out accuracy of the tiny task: avg@n under the evaluation protocol's sampling (reference section 7).

avg@n = mean over problems of the fraction of n samples judged correct (an unbiased pass@1 estimate).
"""

from __future__ import annotations

from collections import defaultdict

from klear_lib.data.tasks import Problem, exact_answer_reward, prompt_messages
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
) -> dict:
    """Returns ``{"avg_at_n": float, "format_rate": float, "by_level": {level: avg@n}, "n": n}``.

    ``format_rate`` is the fraction of samples with a ``</think>`` and a boxed answer after it.
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
    per_problem, formatted, by_level = [], 0, defaultdict(list)
    for p, samples in zip(problems, completions):
        scores = [exact_answer_reward(c, p.answer) for c in samples]
        acc = sum(s for s, _ in scores) / n
        formatted += sum(r in ("correct", "wrong") for _, r in scores)
        per_problem.append(acc)
        by_level[p.level].append(acc)
    return {
        "avg_at_n": sum(per_problem) / max(len(per_problem), 1),
        "format_rate": formatted / max(n * len(problems), 1),
        "by_level": {lvl: sum(v) / len(v) for lvl, v in sorted(by_level.items())},
        "n": n,
    }

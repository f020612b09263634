"""Held-out evaluation of the tiny code task: n samples per problem, every sample run against the problem's
hidden tests in the sandbox (through a ``RewardPool`` of ``score_code``).

avg@n counts a sample correct only if every test passes (reference section 7); ``pass_rate`` is the mean
fraction of tests passed (the soft reward's view of the same samples).
"""

from __future__ import annotations

from klear_lib.data.tasks import CodeProblem, code_prompt_messages
from klear_lib.rollout import generate


def evaluate_code_heldout(model, tokenizer, problems: list[CodeProblem], pool, *, n: int = 4,
                          temperature: float = 1.0, top_p: float = 0.95, max_new_tokens: int = 96,
                          batch_size: int = 128) -> dict:
    """Returns ``{"avg_at_n", "pass_rate", "format_rate", "n"}``; ``pool`` is an open RewardPool(score_code)."""
    completions = generate(model, tokenizer, [code_prompt_messages(p) for p in problems], n=n,
                           temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens,
                           batch_size=batch_size)
    items = [{"response": c, "tests": p.tests, "mode": "soft"} for p, cs in zip(problems, completions) for c in cs]
    results = pool.score_batch(items)
    total = max(len(results), 1)
    return {
        "avg_at_n": sum(r.reason == "all_passed" for r in results) / total,
        "pass_rate": sum(r.score for r in results) / total,
        "format_rate": sum(r.reason not in ("no_code", "no_think_close") for r in results) / total,
        "n": n,
    }

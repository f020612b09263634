"""A real pretrained model through every path of the package (notebook 08, the ``small-real`` preset): a format SFT,
GRPO with GPPO + ERC through ``KlearGRPOTrainer`` on rewards from math-verify, held-out evaluation before and after.
A pipeline check: it reproduces no claim of the papers.

The task is the tiny stand-in's (``klear_lib.data.tasks``: sums of single digits mod 10, the teacher's
``<think>`` chain and ``\\boxed{}`` answer), which a 135M instruct model can sometimes solve after a short SFT on
the teacher's format, so that RL has groups whose rewards vary. The judge is ``rewards.math.score_math`` in a
``RewardPool`` (math-verify in worker processes), under the run's ``format_rule`` in training and evaluation alike;
the evaluation also judges every sample under ``format_rule="none"`` (the answer alone), so that "did not keep the
format" and "answered wrong" stay apart.
"""

from __future__ import annotations

import collections
import math
import random
import time

from klear_lib.data.tasks import Problem, prompt_messages, teacher_solution
from klear_lib.rollout import generate

FORMAT_REASONS = ("no_think_close", "no_think_open")


def math_reward(pool, format_rule: str):
    """A TRL reward function judging ``gold`` through ``pool`` (a ``RewardPool(score_math, group_key="gold")``) under
    ``format_rule``; it keeps each batch's results and its rule (``KlearGRPOTrainer`` names both when no step is
    made)."""
    from klear_lib.rewards.pool_wrappers import make_trl_reward_func

    reward = make_trl_reward_func(pool, {"gold": "gold"}, "math", score_kwargs={"format_rule": format_rule})
    reward.format_rule = format_rule
    return reward


def rl_rows(problems: list[Problem]) -> list[dict]:
    """Dataset rows for ``run_rl``: the chat prompt and the gold answer the math judge reads."""
    return [{"prompt": prompt_messages(p), "gold": str(p.answer)} for p in problems]


def format_sft_samples(problems: list[Problem], *, error_rate: float = 0.0, seed: int = 0) -> list[dict]:
    """The format SFT's samples: each problem with the teacher's ``<think>`` chain and boxed answer, each step wrong
    with probability ``error_rate`` (``tasks.teacher_solution``): a teacher that errs leaves the student's answers
    uncertain enough for GRPO's groups to disagree."""
    rng = random.Random(f"format-sft:{seed}")
    return [{"prompt": prompt_messages(p), "completion": [
        {"role": "assistant", "content": teacher_solution(p, rng, error_rate=error_rate)}]} for p in problems]


def evaluate_real(model, tokenizer, problems: list[Problem], pool, *, n: int, temperature: float, top_p: float,
                  max_new_tokens: int, format_rule: str, batch_size: int = 64) -> dict:
    """Held-out evaluation judged by math-verify: ``avg_at_n`` (correct under ``format_rule``, the training reward's
    rule), ``answer_avg_at_n`` (correct under ``format_rule="none"``: the answer alone), ``format_rate`` (samples
    with ``<think>`` and ``</think>``), ``mean_tokens`` (completion length in tokens), ``reasons`` (the judge's,
    under ``format_rule``), ``n``, ``seconds``. Samples at ``temperature`` (0: greedy)."""
    start = time.perf_counter()
    completions = generate(model, tokenizer, [prompt_messages(p) for p in problems], n=n, temperature=temperature,
                           top_p=top_p, max_new_tokens=max_new_tokens, batch_size=batch_size)
    flat = [(c, str(p.answer)) for p, row in zip(problems, completions) for c in row]
    ruled = pool.score_batch([{"response": c, "gold": g, "format_rule": format_rule} for c, g in flat])
    plain = pool.score_batch([{"response": c, "gold": g, "format_rule": "none"} for c, g in flat])
    reasons = collections.Counter(r.reason for r in ruled)
    total = max(len(flat), 1)
    return {
        "avg_at_n": sum(r.reason == "correct" for r in ruled) / total,
        "answer_avg_at_n": sum(r.reason == "correct" for r in plain) / total,
        "format_rate": sum("<think>" in c and "</think>" in c for c, _ in flat) / total,
        "mean_tokens": sum(len(tokenizer(c, add_special_tokens=False)["input_ids"]) for c, _ in flat) / total,
        "reasons": dict(reasons),
        "n": n,
        "seconds": time.perf_counter() - start,
        "example": completions[0][0] if completions and completions[0] else "",
    }


def rollout_table(records: list[dict]) -> list[dict]:
    """The records of ``metrics.jsonl`` reduced to one row per rollout: its reward and groups (the rollout record),
    and the mean over its optimizer steps of the clip and ERC fractions, the gradient norm and the entropy."""
    by_rollout = collections.defaultdict(list)
    for r in records:
        if "actor/pg_loss" in r:
            by_rollout[r.get("rollout")].append(r)
    rollouts = {r["rollout"]: r for r in records if "klear/kept_groups" in r}

    def mean(rows, key):
        vals = [float(r[key]) for r in rows if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
        return sum(vals) / len(vals) if vals else None

    step_keys = ("grad_norm", "actor/pg_clipfrac_low", "actor/pg_clipfrac_high", "actor/gppo_preserved_frac",
                 "actor/erc_frac_low", "actor/erc_frac_high", "entropy")
    return [{"rollout": k, "updates": len(by_rollout.get(k, [])),
             **{key: rollouts[k].get(key) for key in ("reward", "reward_std", "klear/generated_groups",
                                                      "klear/kept_groups")},
             **{key: mean(by_rollout.get(k, []), key) for key in step_keys}}
            for k in sorted(rollouts)]

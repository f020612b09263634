"""Units of work of the code-reward notebook (05): one reward mode × one group filter × one seed, RL on the
branch program-synthesis task (``tasks.make_branch_code_splits``), every program run in the sandbox.

Each unit opens its own ``RewardPool`` of ``score_code`` (its own processes), wrapped in a ``MemoPool`` (a
distinct response to a problem is run once per unit: the programs are pure functions). Besides what ``run_rl``
logs, every rollout record carries the share of generated groups that have a learning signal under each filter
(``group_signal``), whichever filter the unit trains with: that Klear's filter discards the groups whose
programs all pass only some tests is what separates the arms.
"""

from __future__ import annotations

import random

import torch

from klear_lib import models, runs
from klear_lib.config import RLExperimentConfig
from klear_lib.data import tasks
from klear_lib.experiment import unit_tracking_dir

ALL_PASSED = "all_passed"
PARTIAL = "some_passed"


def group_signal(scores: list[float], reasons: list[str], group: int) -> dict:
    """The share of groups (``group`` consecutive completions of one prompt) that have a non-zero GRPO advantage
    under DAPO's filter (the rewards differ) and under Klear's (the all-tests indicator differs), and the share of
    completions that pass every test and some but not all of them.

    >>> group_signal([1, 1, 0.5, 0.5], ["all_passed", "all_passed", "some_passed", "some_passed"], 2)
    {'group_signal_dapo': 0.0, 'group_signal_klear': 0.0, 'full_pass_frac': 0.5, 'partial_pass_frac': 0.5}
    """
    if group < 1 or len(scores) != len(reasons) or len(scores) % group:
        raise ValueError(f"group_signal: {len(scores)} scores and {len(reasons)} reasons in groups of {group}")
    n_groups = len(scores) // group
    dapo = klear = 0
    for g in range(n_groups):
        s, r = scores[g * group:(g + 1) * group], reasons[g * group:(g + 1) * group]
        dapo += max(s) != min(s)
        klear += len({x == ALL_PASSED for x in r}) > 1
    n = max(len(scores), 1)
    return {"group_signal_dapo": dapo / max(n_groups, 1), "group_signal_klear": klear / max(n_groups, 1),
            "full_pass_frac": reasons.count(ALL_PASSED) / n, "partial_pass_frac": reasons.count(PARTIAL) / n}


class SignalLog:
    """Wraps a TRL reward function made by ``make_trl_reward_func``: remembers ``group_signal`` of every call, and
    as a ``run_rl`` probe returns the mean over the calls since the previous probe (one rollout's generation
    batches), logged as ``klear/<key>``. Before the first call it returns nothing."""

    def __init__(self, reward_func, group: int):
        self.reward_func, self.group, self.pending = reward_func, group, []
        self.__name__ = reward_func.__name__

    def __call__(self, completions, **kwargs):
        scores = self.reward_func(completions, **kwargs)
        reasons = [r.reason for r in self.reward_func.last_results]
        self.pending.append(group_signal(scores, reasons, self.group))
        return scores

    def probe(self, model=None) -> dict:
        done, self.pending = self.pending, []
        if not done:
            return {}
        return {k: sum(d[k] for d in done) / len(done) for k in done[0]}


def teacher_seed(data_seed: int, seed: int) -> str:
    """The seed of seed ``seed``'s teacher draws (which values its SFT programs get wrong): one stream per
    (``data_seed``, ``seed``), so that each replicate's start learns from its own teacher samples, as a replication
    elsewhere would draw them. ``random.Random`` of a str is deterministic (sha512 of the text), across processes."""
    return f"branch-code-teacher/{data_seed}/{seed}"


def start_samples(train: list, error_rate: float, data_seed: int, seed: int) -> tuple[list[dict], random.Random]:
    """The SFT samples of seed ``seed``'s warm start: one teacher program per training problem, each value wrong
    with probability ``error_rate`` (``tasks.branch_code_solution``), from ``random.Random(teacher_seed(data_seed,
    seed))``; and that generator, to draw the teacher's held-out programs after them (the design figure)."""
    rng = random.Random(teacher_seed(data_seed, seed))
    samples = [{"prompt": tasks.code_prompt_messages(p), "completion": [{"role": "assistant", "content":
                tasks.branch_code_solution(p, rng, error_rate=error_rate)}]} for p in train]
    return samples, rng


TEACHER_HELDOUT_SAMPLES = 8  # the teacher's programs per held-out problem in its full-pass share


def teacher_full_pass(heldout: list, rng: random.Random, error_rate: float) -> float:
    """The share of the teacher's held-out programs (``TEACHER_HELDOUT_SAMPLES`` per problem, drawn from ``rng``) that
    are fully right: equal to the error-free program (a wrong value is always another digit, and each branch has its
    test, so such a program passes every test and no other does; no sandbox needed)."""
    right = [tasks.branch_code_solution(p) for p in heldout]
    drawn = [tasks.branch_code_solution(p, rng, error_rate=error_rate) == r for p, r in zip(heldout, right)
             for _ in range(TEACHER_HELDOUT_SAMPLES)]
    return sum(drawn) / max(len(drawn), 1)


def start_unit(*, config: dict, error_rate: float, branches: int, cache_root: str, out_dir: str, tags: dict,
               metrics_path: str, reward_workers: int = 2, test_timeout_s: float = 2.0) -> dict:
    """One regime's SFT warm start of one seed (``config["seed"]``: the model's initialisation, the data order and
    the teacher's draws, ``start_samples``) as a unit of work, so that every seed's starts train side by side (one
    thread each): ``sft_jobs.base_model`` on ``start_samples`` with the SFT stage of ``config``
    (``RLExperimentConfig`` fields), cached under ``cache_root``. Then the start's held-out evaluation at the
    evaluation protocol, every program run in the sandbox (``reward_workers`` processes), and the teacher's own share
    of fully right held-out programs (``teacher_full_pass``). Its record goes to ``out_dir/sft_start.json``. Returns
    the model's folder, the evaluation and the sha256 of the weights (``cache.weights_sha256``), with ``tags``."""
    from pathlib import Path

    from klear_lib.cache import weights_sha256
    from klear_lib.evaluation.code_heldout import evaluate_code_heldout
    from klear_lib.rewards.pool_wrappers import MemoPool
    from klear_lib.train import sft_jobs
    from klear_lib.train.sft import SFTStageConfig

    cfg = RLExperimentConfig.from_params(config)
    train, heldout = tasks.make_branch_code_splits(cfg.data_seed, cfg.n_train, cfg.n_heldout, branches)
    samples, rng = start_samples(train, error_rate, cfg.data_seed, cfg.seed)
    model_dir = sft_jobs.base_model(cfg, tasks.branch_code_corpus(train), samples,
                                    SFTStageConfig.from_experiment(cfg), cache_root=cache_root, out_dir=out_dir,
                                    progress=lambda *_: None)
    model, tok = models.load_model_and_tokenizer(model_dir, dtype=torch.float32)
    runs.set_seed(cfg.seed)  # the start's sampled evaluation from the config alone, on a cache hit and a miss
    with reward_pool(reward_workers, "soft", test_timeout_s) as raw_pool:
        start = evaluate_code_heldout(model, tok, heldout, MemoPool(raw_pool), n=cfg.eval_n,
                                      temperature=cfg.eval_temperature, top_p=cfg.eval_top_p,
                                      max_new_tokens=cfg.max_completion_length)
    start.update(temperature=cfg.eval_temperature, teacher_full_pass=teacher_full_pass(heldout, rng, error_rate))
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    runs.write_atomic(Path(out_dir) / "sft_start.json", runs.to_json_text(
        {"model_dir": str(model_dir), "start": start, **tags}, "sft_start", indent=2) + "\n")
    return {"model_dir": str(model_dir), "start": start, "weights_sha256": weights_sha256(Path(model_dir)), **tags}


def pool_limit_s(test_timeout_s: float) -> float:
    """The units' reward pool's limit per sample: ``rewards.code.pool_limit_s``, the sandbox's own deadline for
    the most tests a sample runs at ``test_timeout_s`` each, plus the worker's start-up (one budget for every
    caller of the code reward)."""
    from klear_lib.rewards.code import pool_limit_s as code_pool_limit_s

    return code_pool_limit_s(test_timeout_s)


def reward_pool(reward_workers: int, reward_mode: str, test_timeout_s: float):
    """The units' pool of ``score_code``: its limit per sample is ``pool_limit_s(test_timeout_s)``, the budget the
    sandbox itself gives the tests the units run, and a failure of the pool scores the mode's failure score (an
    honest wrong answer)."""
    from klear_lib.rewards.code import failure_score, score_code
    from klear_lib.rewards.pool import RewardPool

    return RewardPool(score_code, workers=reward_workers, timeout_s=pool_limit_s(test_timeout_s),
                      failure_score=failure_score(reward_mode))


def code_unit(*, config: dict, start: str, reward_mode: str, branches: int, reward_workers: int, test_timeout_s: float,
              tags: dict, metrics_path: str) -> dict:
    """RL from the SFT model saved at ``start`` with ``config`` (``RLExperimentConfig`` fields; ``seed`` is the
    run's, ``filter_rule`` the group filter), rewards ``score_code`` in ``reward_mode`` (soft / hard / signed).
    Records tagged with ``tags``; returns the last evaluation, the reward reasons and the sandbox counts."""
    from klear_lib.evaluation.code_heldout import evaluate_code_heldout
    from klear_lib.rewards.pool_wrappers import MemoPool, make_trl_reward_func
    from klear_lib.rewards.sandbox import require_metered
    from klear_lib.train.rl_run import run_rl

    require_metered("the code-reward RL unit")  # no training on a sandbox that cannot count CPU time, unless asked
    cfg = RLExperimentConfig.from_params(config)
    train, heldout = tasks.make_branch_code_splits(cfg.data_seed, cfg.n_train, cfg.n_heldout, branches)
    runs.set_seed(cfg.seed)
    model, tok = models.load_model_and_tokenizer(start, dtype=torch.float32)
    with reward_pool(reward_workers, reward_mode, test_timeout_s) as raw_pool:
        pool = MemoPool(raw_pool)
        reward = make_trl_reward_func(pool, {"tests": "tests"}, f"code_{reward_mode}",
                                      score_kwargs={"mode": reward_mode, "timeout_s": test_timeout_s})
        signal = SignalLog(reward, cfg.num_generations)
        def evaluate(m):
            return evaluate_code_heldout(m, tok, heldout, pool, n=cfg.eval_n, temperature=cfg.eval_temperature,
                                         top_p=cfg.eval_top_p, max_new_tokens=cfg.max_completion_length)

        rows = [{"prompt": tasks.code_prompt_messages(p), "tests": p.tests} for p in train]
        with runs.MetricsWriter(metrics_path) as writer:
            _, history = run_rl(cfg, model, tok, train, heldout, writer, tags=tags, rows=rows,
                                reward_funcs=[signal], evaluate=evaluate, probe=signal.probe,
                                progress=lambda *_: None,
                                tracking_dir=unit_tracking_dir(metrics_path, cfg.report_to))
    last = history[-1] if history else {}
    return {"final": {k: v for k, v in last.items() if k.startswith("eval/")}, "steps": last.get("step", 0),
            "reasons": dict(reward.reason_counts), "sandbox_runs": pool.judged, "memo_hits": pool.hits}

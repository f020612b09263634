"""RL from a config file, for runs too big for a notebook: one GPU, many GPUs (accelerate), one command.

    python -m klear_lib.train.launch --config configs/rl/gpu_1x.yaml --out outputs/rl/gpu_1x
    accelerate launch --config_file configs/accelerate/zero3.yaml -m klear_lib.train.launch \\
        --config configs/rl/paper_math.yaml --out outputs/rl/paper_math -p rl_lr=5e-7

The config is a flat YAML mapping: the keys of ``klear_lib.config.RLExperimentConfig`` plus the launch keys of
``LaunchConfig`` (what to train on). ``-p key=value`` overrides one (read as YAML). The run starts from
``model`` (an SFT checkpoint: Klear's RL starts from its long-CoT SFT model) and writes a run directory to
``--out`` (config, versions, commit, metrics, summary; the final model under ``model/``); every process of a
multi-GPU run computes, only the main one writes. With ``save_steps`` > 0, an interrupted run started again
with the same ``--out`` resumes from its last checkpoint.

Data (``data``): ``tiny`` (the synthetic arithmetic task, judged by exact match), or Klear's RL records from the
hub or a local file (``hub.load_klear_rl``; MathSub-30K judged by math-verify, CodeSub-15K by the sandboxed
tests, both through ``RewardPool`` worker processes).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from klear_lib import models, runs
from klear_lib.config import RLExperimentConfig, from_dict


@dataclass
class LaunchConfig:
    """What a launched run trains on (the rest is ``RLExperimentConfig``)."""

    data: str = "tiny"
    """``tiny``, or a hub name / local path of Klear RL records (``Kwai-Klear/...``, a jsonl or parquet file)."""
    split: str = "train"
    """Dataset split of ``data``."""
    ability: str = "math"
    """Which records to keep and how to judge them: ``math`` (math-verify) or ``code`` (sandboxed tests)."""
    max_prompts: int = 0
    """Keep the first this many prompts (0: all)."""
    reward_workers: int = 8
    """Grader processes (Klear: 10 for code)."""
    completion_prefix: str = ""
    """Text put before each completion when judging, e.g. ``<think>`` when the chat template opens it."""
    unsloth: str = "off"
    """Load the model with unsloth (opt-in; one CUDA GPU, unsloth's environment): ``off``, ``full`` fine-tuning, or
    ``lora``."""
    lora_rank: int = 32
    """LoRA rank when ``unsloth: lora``."""
    weights_dtype: str = "float32"
    """dtype of the trained weights and of AdamW's state: ``float32`` (master weights; a bf16 checkpoint is upcast
    on load, and ``bf16: true`` adds bf16 autocast) or, only when set here, ``bfloat16`` (pure bf16 training: at
    lr 1e-6 most updates are below bf16's resolution and round away)."""


def load_config(path: str | os.PathLike, overrides: dict) -> tuple[RLExperimentConfig, LaunchConfig]:
    """Split the flat mapping into the two configs; an unknown key names the file and the valid keys."""
    from klear_lib.presets import load_yaml_file

    raw = load_yaml_file(path) or {}
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a flat mapping of keys to values")
    raw.update(overrides)
    launch_keys = {f.name for f in dataclasses.fields(LaunchConfig)}
    rl_keys = {f.name for f in dataclasses.fields(RLExperimentConfig)}
    unknown = sorted(set(raw) - launch_keys - rl_keys)
    if unknown:
        raise ValueError(f"{path}: unknown key(s) {unknown}; valid: {sorted(launch_keys | rl_keys)}")
    launch = from_dict(LaunchConfig, {k: v for k, v in raw.items() if k in launch_keys}, where=str(path))
    rl = from_dict(RLExperimentConfig, {k: v for k, v in raw.items() if k in rl_keys}, where=str(path))
    if launch.ability not in ("math", "code"):
        raise ValueError(f"{path}: ability must be 'math' or 'code', got {launch.ability!r}")
    if launch.unsloth not in ("off", "full", "lora"):
        raise ValueError(f"{path}: unsloth must be 'off', 'full' or 'lora', got {launch.unsloth!r}")
    models.weights_dtype(launch.weights_dtype, where=f"{path}: weights_dtype")
    return rl, launch


class _NullWriter:
    """The metrics writer of the processes that are not the main one."""

    def write(self, record) -> None:
        pass


def _is_main() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def _klear_rows(launch: LaunchConfig, format_rule: str = "released"):
    """Dataset rows, reward functions and the pool to close, from Klear's RL records; math judged under
    ``format_rule`` (the run config's)."""
    from klear_lib.data.hub import load_klear_rl
    from klear_lib.rewards.pool import RewardPool
    from klear_lib.rewards.pool_wrappers import make_trl_reward_func

    records = load_klear_rl(launch.data, split=launch.split, ability=launch.ability)
    if launch.max_prompts:
        records = records[: launch.max_prompts]
    if launch.ability == "math":
        from klear_lib.rewards.math import score_math

        rows = [{"prompt": r.prompt, "gold": r.ground_truth} for r in records]
        pool = RewardPool(score_math, workers=launch.reward_workers, timeout_s=10.0, group_key="gold")
        reward = make_trl_reward_func(pool, {"gold": "gold"}, "math", completion_prefix=launch.completion_prefix,
                                      score_kwargs={"format_rule": format_rule})
        reward.format_rule = format_rule  # read by KlearGRPOTrainer's message when no step is made
    else:
        rows = [{"prompt": r.prompt, "tests": r.ground_truth} for r in records]
        reward, pool = code_reward(launch)
    return rows, [reward], pool


def code_reward(launch: LaunchConfig, *, mode: str = "soft", test_timeout_s: float | None = None):
    """The code reward of a launched run and the pool to close: ``score_code`` in ``mode`` with
    ``test_timeout_s`` seconds of CPU per test (default ``CodeRewardOptions``' 6 s), through a ``RewardPool``
    whose limit per sample is derived from that same number (``rewards.code.pool_limit_s``: 511 s at the
    defaults). Before, the pool gave a sample 120 s while the sandbox's own budget for 16 tests at 6 s is
    506 s, so a correct program with slow tests scored 0.0 ``timeout`` here and 1.0 everywhere else.
    Refuses to start where the sandbox could not count CPU time (``sandbox.require_metered``)."""
    from klear_lib.rewards import sandbox
    from klear_lib.rewards.code import CodeRewardOptions, failure_score, pool_limit_s, score_code
    from klear_lib.rewards.pool import RewardPool
    from klear_lib.rewards.pool_wrappers import make_trl_reward_func

    sandbox.require_metered("klear launch (ability: code)")
    timeout_s = CodeRewardOptions().timeout_s if test_timeout_s is None else test_timeout_s
    pool = RewardPool(score_code, workers=launch.reward_workers, timeout_s=pool_limit_s(timeout_s),
                      failure_score=failure_score(mode))  # a pool failure scores as an honest wrong answer
    reward = make_trl_reward_func(pool, {"tests": "tests"}, "code", completion_prefix=launch.completion_prefix,
                                  score_kwargs={"mode": mode, "timeout_s": timeout_s})
    return reward, pool


def launch(cfg: RLExperimentConfig, launch_cfg: LaunchConfig, out: str | os.PathLike) -> Path:
    """Run RL as configured into the run directory ``out``; returns it."""
    from klear_lib.data import tasks
    from klear_lib.train.rl_run import run_rl

    if not cfg.model:
        raise ValueError("model: set it to the SFT checkpoint RL starts from (a folder or hub name), e.g. "
                         "-p model=/path/to/sft")
    if cfg.model == "tiny":
        raise ValueError("model: launch starts RL from a saved SFT model (a path or hub name), not 'tiny'; the tiny "
                         "SFT stage lives in the notebooks (train.sft.arithmetic_warm_start)")
    out = Path(out)
    main = _is_main()
    if main:
        out.mkdir(parents=True, exist_ok=True)
        from klear_lib import sampler
        from klear_lib.rewards.sandbox import sandbox_mode

        runs.write_run_metadata(out, {"rl": cfg, "launch": launch_cfg,
                                      "world_size": int(os.environ.get("WORLD_SIZE", 1))},
                                versions={"sandbox": sandbox_mode(), "sampler": sampler.setting()})
    runs.set_seed(cfg.seed)
    if launch_cfg.unsloth == "off":  # fp32 master weights unless weights_dtype says otherwise (LaunchConfig)
        model, tokenizer = models.load_model_and_tokenizer(cfg.model, dtype=models.weights_dtype(
            launch_cfg.weights_dtype))
    else:
        from klear_lib.train.sft import load_for_sft

        model, tokenizer = load_for_sft(cfg.model, max_length=cfg.max_completion_length + 4096, bf16=cfg.bf16,
                                        use_unsloth=True, weights_dtype=launch_cfg.weights_dtype,
                                        lora_rank=launch_cfg.lora_rank if launch_cfg.unsloth == "lora" else 0)
    train = heldout = []
    rows = reward_funcs = evaluate = pool = None
    if launch_cfg.data == "tiny":
        train, heldout = tasks.make_splits(cfg.data_seed, cfg.n_train, cfg.n_heldout, cfg.level_list)
    else:
        rows, reward_funcs, pool = _klear_rows(launch_cfg, cfg.format_rule)
        evaluate = lambda m: {"avg_at_n": math.nan, "n": 0}  # noqa: E731  (benchmarks: notebook 07, with vLLM)
    metrics_path = out / runs.METRICS_FILE
    writer = runs.MetricsWriter(metrics_path) if main else _NullWriter()
    try:
        _, history = run_rl(cfg, model, tokenizer, train, heldout, writer, tags={"variant": cfg.loss_name},
                            output_dir=str(out / "checkpoints"), rows=rows, reward_funcs=reward_funcs,
                            evaluate=evaluate, save_dir=out / "model",
                            progress=print if main else (lambda *_: None))
    finally:
        if main:
            writer.close()
        if pool is not None:
            pool.close()
    if main:
        last = history[-1] if history else {}
        runs.write_summary(out, {"final": {k: v for k, v in last.items() if k.startswith("eval/")},
                                 "model": str(out / "model")})
    return out


def main(argv=None) -> int:
    from klear_lib.presets import parse_overrides

    ap = argparse.ArgumentParser(prog="python -m klear_lib.train.launch", description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True, help="flat YAML: RLExperimentConfig keys + LaunchConfig keys")
    ap.add_argument("--out", required=True, help="the run directory (the same on every node)")
    ap.add_argument("-p", "--param", action="append", default=[], metavar="KEY=VALUE", help="override one key")
    args = ap.parse_args(argv)
    try:
        cfg, launch_cfg = load_config(args.config, parse_overrides(args.param))
    except ValueError as err:
        print(f"launch: error: {err}", file=sys.stderr)
        return 2
    try:
        out = launch(cfg, launch_cfg, args.out)
        if _is_main():
            print(out)
    except ValueError as err:
        print(f"launch: error: {err}", file=sys.stderr)
        return 2
    finally:
        _end_process_group()
    return 0


def _end_process_group() -> None:
    """Destroy the torchrun process group before the interpreter exits: left alive, gloo's threads are torn down with
    it, and a rank can abort at exit ("terminate called without an active exception") after a successful run."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def exit_rank(code: int) -> None:
    """End a torchrun rank without running C++ static destructors: even with the process group destroyed
    (``_end_process_group``), a gloo rank could still abort at interpreter exit after a successful run ("terminate
    called without an active exception": a native thread torn down while joinable; 1 in 3 fresh-clone runs of the
    2-process test, more under load). Everything klear writes is closed by then (``runs.write_atomic``, the metrics
    writer closed in ``launch``); stdout and stderr are flushed here. A single process exits as usual."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    exit_rank(main())

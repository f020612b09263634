"""The SFT data notebooks' units of work (klear_lib.train.sft_jobs) and the code notebook's signal read-outs
(klear_lib.train.code_jobs): hand-computed values, a cached base trained once, one unit end to end."""

import json
import random

import pytest

from klear_lib.config import SFTExperimentConfig
from klear_lib.data import tasks, teachers
from klear_lib.train import code_jobs, sft_jobs
from klear_lib.train.sft import SFTStageConfig


def test_data_stats_hand_computed():
    samples = [{"prompt": "a", "verdict": True, "level": 1}, {"prompt": "a", "verdict": False, "level": 1},
               {"prompt": "b", "verdict": True, "level": 4}, {"prompt": "c", "verdict": True, "level": 4}]
    assert sft_jobs.data_stats(samples) == {"samples": 4, "distinct_prompts": 3, "teacher_correct": 0.75,
                                            "level_1": 2, "level_4": 2}
    stats = sft_jobs.data_stats([{"prompt": "a"}])
    assert stats["samples"] == 1 and stats["teacher_correct"] != stats["teacher_correct"]  # NaN: no verdicts


def test_evaluation_record_names_every_level():
    rec = sft_jobs.evaluation_record({"avg_at_n": 0.5, "format_rate": 1.0, "by_level": {1: 0.75, 4: 0.25}, "n": 2})
    assert rec == {"eval/avg_at_n": 0.5, "eval/format_rate": 1.0, "eval/avg_at_n_level1": 0.75,
                   "eval/avg_at_n_level4": 0.25}


def test_samples_round_trip(tmp_path):
    samples = [{"prompt": "q", "response": "r", "level": 2}, {"prompt": [{"role": "user", "content": "x"}]}]
    assert sft_jobs.read_samples(sft_jobs.write_samples(tmp_path / "d" / "s.jsonl", samples)) == samples


def _tiny_cfg():
    return SFTExperimentConfig.from_params({"tiny_hidden": 32, "tiny_layers": 1, "vocab_size": 400})


def test_base_key_follows_the_content():
    cfg, stage = _tiny_cfg(), SFTStageConfig(epochs=1.0, batch_size=4)
    corpus, samples = ["a b"], [{"prompt": "q", "response": "r"}]
    key = sft_jobs.base_key(cfg, corpus, samples, stage)
    assert key == sft_jobs.base_key(cfg, list(corpus), [dict(samples[0])], stage)
    assert key != sft_jobs.base_key(cfg, corpus, [{"prompt": "q", "response": "r2"}], stage)
    assert key != sft_jobs.base_key(cfg.replace(seed=1), corpus, samples, stage)
    assert key != sft_jobs.base_key(cfg, corpus, samples, SFTStageConfig(epochs=2.0, batch_size=4))


def test_cached_base_is_trained_once_and_a_unit_fine_tunes_and_evaluates_it(tmp_path):
    cfg = _tiny_cfg()
    train, held = tasks.make_splits(0, 64, 4)
    samples = teachers.source_samples(teachers.SOURCES["clean"], train, 32, seed=0)
    stage = SFTStageConfig(learning_rate=3e-3, epochs=1.0, batch_size=8, use_cpu=True, bf16=False)
    said = []
    first = sft_jobs.base_model(cfg, tasks.corpus(train), samples, stage, cache_root=tmp_path / "cache",
                                out_dir=tmp_path / "run1", progress=said.append)
    again = sft_jobs.base_model(cfg, tasks.corpus(train), samples, stage, cache_root=tmp_path / "cache",
                                out_dir=tmp_path / "run2", progress=said.append)
    assert first == again and (first / "config.json").is_file()
    assert any("reusing" in s for s in said) and sum("trained in" in s for s in said) == 1
    assert json.loads((tmp_path / "run2" / "base.json").read_text())["model_dir"] == str(first)
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [first.parent.name]  # no temporary folder left

    data = sft_jobs.write_samples(tmp_path / "arm.jsonl", samples[:16])
    rec = sft_jobs.sft_unit(start=str(first), data=str(data), stage={**vars(stage), "seed": 3},
                            problems=[p.to_dict() for p in held], evaluation={"n": 2, "max_new_tokens": 8},
                            tags={"variant": "x", "seed": 3}, metrics_path=str(tmp_path / "units" / "x.jsonl"))
    assert rec["variant"] == "x" and rec["samples"] == 16 and 0 <= rec["eval/avg_at_n"] <= 1
    assert {f"eval/avg_at_n_level{p.level}" for p in held} <= set(rec)
    lines = (tmp_path / "units" / "x.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [rec]
    assert not (tmp_path / "units" / "x.model").exists()  # the fine-tuned model is not kept


def test_a_damaged_cached_base_is_trained_again_to_the_same_model(tmp_path):
    """The base's cache entry zeroed (same size), truncated, or given another base's weights: one line naming the
    path and the reason, then the same base trained again (bit for bit, on CPU); a hit seeds what follows."""
    import random

    import torch

    cfg = _tiny_cfg()
    train, _ = tasks.make_splits(0, 64, 4)
    samples = teachers.source_samples(teachers.SOURCES["clean"], train, 16, seed=0)
    stage = SFTStageConfig(learning_rate=3e-3, epochs=1.0, batch_size=8, use_cpu=True, bf16=False)

    def base(c=cfg, progress=None):
        return sft_jobs.base_model(c, tasks.corpus(train), samples, stage, cache_root=tmp_path / "cache",
                                   out_dir=tmp_path / "run", progress=progress or (lambda *_: None))

    final = base()
    after_miss = (torch.rand(2).tolist(), random.random())
    weights = final / "model.safetensors"
    original = weights.read_bytes()
    other = base(cfg.replace(seed=1)) / "model.safetensors"
    assert other.stat().st_size == len(original) and other.read_bytes() != original
    damages = {"zeroed": (lambda: weights.write_bytes(bytes(len(original))), "differs from the manifest's sha256"),
               "truncated": (lambda: weights.write_bytes(original[:4096]), "has 4,096 bytes"),
               "swapped": (lambda: weights.write_bytes(other.read_bytes()), "differs from the manifest's sha256")}
    for name, (damage, words) in damages.items():
        damage()
        said = []
        assert base(progress=said.append) == final
        assert any(f"not reusing the cached model {final.parent}: final/model.safetensors" in s and words in s
                   for s in said), (name, said)
        assert weights.read_bytes() == original, name
    said = []
    torch.rand(100)
    base(progress=said.append)
    assert any("reusing the cached model" in s for s in said)
    assert (torch.rand(2).tolist(), random.random()) == after_miss  # a hit leaves the streams as a miss does


# -- notebook 05: the share of groups with a signal ---------------------------------------------------------------
def test_group_signal_hand_computed():
    # three groups of two: [1, 0.5] (both rules), [0.5, 0.25] (partial only: DAPO's rule), [0.25, 0.25] (none)
    scores = [1.0, 0.5, 0.5, 0.25, 0.25, 0.25]
    reasons = ["all_passed", "some_passed", "some_passed", "some_passed", "some_passed", "none_passed"]
    got = code_jobs.group_signal(scores, reasons, 2)
    assert got == {"group_signal_dapo": pytest.approx(2 / 3), "group_signal_klear": pytest.approx(1 / 3),
                   "full_pass_frac": pytest.approx(1 / 6), "partial_pass_frac": pytest.approx(4 / 6)}
    # the hard reward of the same programs: only the first group varies
    hard = code_jobs.group_signal([1.0, 0, 0, 0, 0, 0], reasons, 2)
    assert (hard["group_signal_dapo"], hard["group_signal_klear"]) == (pytest.approx(1 / 3), pytest.approx(1 / 3))
    with pytest.raises(ValueError, match="in groups of 4"):
        code_jobs.group_signal(scores, reasons, 4)


def test_signal_log_wraps_a_reward_and_reports_per_rollout():
    class Reward:
        __name__ = "code_soft"

        def __call__(self, completions, **kwargs):
            from klear_lib.rewards.result import RewardResult

            self.last_results = [RewardResult(c, "all_passed" if c == 1 else "some_passed") for c in completions]
            return list(completions)

    log = code_jobs.SignalLog(Reward(), group=2)
    assert log.__name__ == "code_soft" and log.probe() == {}  # before the first rollout: nothing
    assert log([1, 0.5, 0.5, 0.5]) == [1, 0.5, 0.5, 0.5]
    log([0.5, 0.25, 1, 1])
    got = log.probe()
    # call 1: dapo 1/2, klear 1/2; call 2: dapo 1/2, klear 0 -> means 1/2 and 1/4
    assert got["group_signal_dapo"] == pytest.approx(0.5) and got["group_signal_klear"] == pytest.approx(0.25)
    assert log.probe() == {}  # reset after each probe


def test_a_code_start_trained_as_a_unit_is_the_cached_base_of_its_seeds_samples(tmp_path):
    """``code_jobs.start_unit`` (05's warm starts, one per regime and seed, side by side) trains
    ``sft_jobs.base_model`` on ``start_samples`` of its seed: its folder is the cache entry of exactly those samples,
    two seeds draw two teachers' samples (and two models), ``start_samples``' generator goes on where the training
    programs ended (the teacher's held-out programs come from it), and the start's evaluation and weights' sha256
    come back with it."""
    import hashlib

    from klear_lib.config import RLExperimentConfig

    cfg = RLExperimentConfig(n_train=40, n_heldout=4, tiny_hidden=32, tiny_layers=1, vocab_size=400, sft_epochs=0.2,
                             sft_batch_size=8, data_seed=7, eval_n=2, max_completion_length=32)
    train, heldout = tasks.make_branch_code_splits(cfg.data_seed, cfg.n_train, cfg.n_heldout, 4)
    samples, rng = code_jobs.start_samples(train, 0.4, cfg.data_seed, 0)
    again, rng2 = code_jobs.start_samples(train, 0.4, cfg.data_seed, 0)
    assert samples == again and len(samples) == 40
    assert tasks.branch_code_solution(heldout[0], rng, error_rate=0.4) == \
        tasks.branch_code_solution(heldout[0], rng2, error_rate=0.4)
    assert code_jobs.start_samples(train, 0.9, cfg.data_seed, 0)[0] != samples  # the error rate reaches the teacher
    assert code_jobs.start_samples(train, 0.4, cfg.data_seed, 1)[0] != samples  # so does the seed
    assert code_jobs.start_samples(train, 0.4, cfg.data_seed + 1, 0)[0] != samples  # and the data seed
    outs = {}
    for seed in (0, 1):
        c = cfg.replace(seed=seed)
        out = code_jobs.start_unit(config=vars(c), error_rate=0.4, branches=4, cache_root=str(tmp_path / "cache"),
                                   out_dir=str(tmp_path / f"sft_main_{seed}"), tags={"regime": "main", "seed": seed},
                                   metrics_path=str(tmp_path / "u.jsonl"), reward_workers=1)
        seed_samples = code_jobs.start_samples(train, 0.4, cfg.data_seed, seed)[0]
        key = sft_jobs.base_key(c, tasks.branch_code_corpus(train), seed_samples, SFTStageConfig.from_experiment(c))
        final = tmp_path / "cache" / key / "final"
        assert out["model_dir"] == str(final) and (out["regime"], out["seed"]) == ("main", seed)
        assert out["weights_sha256"] == hashlib.sha256((final / "model.safetensors").read_bytes()).hexdigest()
        assert json.loads((tmp_path / f"sft_main_{seed}" / "base.json").read_text())["key"] == key
        record = json.loads((tmp_path / f"sft_main_{seed}" / "sft_start.json").read_text())
        assert record["model_dir"] == str(final) and record["start"] == out["start"]
        start = out["start"]
        assert start["temperature"] == cfg.eval_temperature and start["n"] == 2 and 0 <= start["avg_at_n"] <= 1
        rng_s = code_jobs.start_samples(train, 0.4, cfg.data_seed, seed)[1]
        assert start["teacher_full_pass"] == code_jobs.teacher_full_pass(heldout, rng_s, 0.4)
        outs[seed] = out
    # The teacher's fully right programs, found without the sandbox, are the ones the sandbox passes on every test.
    from klear_lib.rewards.code import score_code

    programs = [tasks.branch_code_solution(p, random.Random(i), error_rate=0.4) for i, p in enumerate(heldout * 8)]
    passed = [score_code(r, p.tests, mode="soft").reason == "all_passed" for r, p in zip(programs, heldout * 8)]
    right = [r == tasks.branch_code_solution(p) for r, p in zip(programs, heldout * 8)]
    assert passed == right and any(right) and not all(right)
    assert code_jobs.teacher_full_pass(heldout, random.Random(0), 0.0) == 1.0
    assert code_jobs.teacher_full_pass(heldout, random.Random(0), 1.0) == 0.0
    assert outs[0]["model_dir"] != outs[1]["model_dir"] and outs[0]["weights_sha256"] != outs[1]["weights_sha256"]
    # A second call is a cache hit: the same model and the same evaluation (seeded from the config alone).
    hit = code_jobs.start_unit(config=vars(cfg), error_rate=0.4, branches=4, cache_root=str(tmp_path / "cache"),
                               out_dir=str(tmp_path / "again"), tags={}, metrics_path=str(tmp_path / "v.jsonl"),
                               reward_workers=1)
    assert {k: hit[k] for k in ("model_dir", "start", "weights_sha256")} == \
        {k: outs[0][k] for k in ("model_dir", "start", "weights_sha256")}

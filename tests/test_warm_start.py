"""The RL notebooks' SFT warm start (train.sft.arithmetic_warm_start): a run that reuses the cached model is the same
experiment as the run that trained it (the same sft_start.json, the same random streams after it, the same first
rollout), and a damaged cache entry (zeroed at the same size, truncated) is trained again, with one line saying why,
to the same start, instead of being reused silently or failing every later run."""

import hashlib
import json
import random

import numpy as np
import torch

from klear_lib import runs
from klear_lib.config import RLExperimentConfig
from klear_lib.train import rl_jobs
from klear_lib.train.sft import arithmetic_warm_start, warm_start_key

CFG = dict(tiny_hidden=32, tiny_layers=1, vocab_size=400, n_train=128, n_heldout=8, levels="1", sft_epochs=1.0,
           sft_batch_size=16, sft_lr=1e-2, fork_facts="", eval_n=4, eval_temperature=1.0, max_completion_length=16,
           rollouts=1, rollout_prompts=2, mini_batch_prompts=1, num_generations=4, eval_every=1, filter_groups=False,
           sft_alpha=0.0)
TIMING = {"step_time", "seconds"}


def streams():
    """The next draws of every global random stream (torch, Python, numpy)."""
    return torch.rand(4).tolist(), random.random(), float(np.random.rand())


def scramble():
    """Whatever ran before in the process (other draws, another experiment): it must not matter."""
    torch.manual_seed(12345)
    torch.rand(1000)
    random.seed(12345)
    np.random.seed(12345)


def first_rollout(ws, path):
    rl_jobs.rl_unit(config=CFG, start=str(ws.sft_dir), tags={"seed": 0}, metrics_path=str(path))
    return [{k: v for k, v in r.items() if k not in TIMING} for r in runs.read_metrics(path)]


def test_a_cache_hit_is_the_same_experiment_as_the_miss_and_damage_retrains(tmp_path):
    cfg = RLExperimentConfig.from_params(CFG)
    cache_root, said = tmp_path / "cache", []
    miss = arithmetic_warm_start(cfg, tmp_path / "miss", cache_root=cache_root, progress=said.append)
    after_miss = streams()
    scramble()
    hit = arithmetic_warm_start(cfg, tmp_path / "hit", cache_root=cache_root, progress=said.append)
    after_hit = streams()
    assert sum("reusing the cached model" in s for s in said) == 1
    start_text = (tmp_path / "miss" / "sft_start.json").read_text()
    assert (tmp_path / "hit" / "sft_start.json").read_text() == start_text
    assert miss.start == hit.start and after_miss == after_hit
    rollout = first_rollout(miss, tmp_path / "miss.jsonl")
    assert rollout and first_rollout(hit, tmp_path / "hit.jsonl") == rollout

    weights = cache_root / warm_start_key(cfg) / "final" / "model.safetensors"
    original = weights.read_bytes()
    for damage, words in ((lambda b: bytes(len(b)), "differs from the manifest's sha256"),
                          (lambda b: b[: len(b) // 2], "(truncated or replaced)")):
        weights.write_bytes(damage(original))
        said.clear()
        scramble()
        again = arithmetic_warm_start(cfg, tmp_path / "again", cache_root=cache_root, progress=said.append)
        lines = [s for s in said if "not reusing" in s]
        assert len(lines) == 1 and words in lines[0] and str(weights.parent.parent) in lines[0], said
        assert weights.read_bytes() == original  # trained again, bit for bit the same model (CPU)
        assert json.loads((tmp_path / "again" / "sft_start.json").read_text()) == json.loads(start_text)
        assert again.start == miss.start and streams() == after_miss


def test_seed_starts_train_a_start_per_seed_side_by_side_and_are_the_notebooks_own_starts(tmp_path):
    # 03, 04 and 06 train one start per seed (rl_jobs.seed_starts: start_unit in worker processes): each seed's
    # model is the cache entry of its seed's key, its evaluation is what a call in this process gives on that entry
    # (a hit), two seeds are two different starts, and a second notebook into the same output root reuses them.
    cache_root = tmp_path / "cache"
    base = RLExperimentConfig.from_params({**CFG, "fork_facts": "2+3->6,5+1->7"})
    ss = rl_jobs.seed_starts(base, [0, 1], tmp_path / "nb_a", cache_root=cache_root, workers=2)
    cfgs = {s: base.replace(seed=s) for s in (0, 1)}
    for s, cfg in cfgs.items():
        assert ss.dirs[s] == str(cache_root / warm_start_key(cfg) / "final")
        said = []
        here = arithmetic_warm_start(cfg, tmp_path / f"here{s}", cache_root=cache_root, progress=said.append)
        assert sum("reusing the cached model" in line for line in said) == 1
        assert ss.starts[s] == here.start
        assert ss.table.loc[s, "the rest"] == here.start["avg_at_n_rest"]
        record = json.loads((tmp_path / "nb_a" / "sft" / f"seed={s}" / "sft_start.json").read_text())
        assert record["start"]["avg_at_n"] == ss.starts[s]["avg_at_n"] and record["model_dir"] == ss.dirs[s]
    weights = [(cache_root / warm_start_key(c) / "final" / "model.safetensors").read_bytes() for c in cfgs.values()]
    assert warm_start_key(cfgs[0]) != warm_start_key(cfgs[1]) and weights[0] != weights[1]
    assert [ss.weights[s] for s in (0, 1)] == [hashlib.sha256(w).hexdigest() for w in weights]
    # The check, computed a second way from the evaluations; this 1-epoch, 128-sample start cannot pass it.
    learned = all(st["avg_at_n_rest"] >= rl_jobs.START_REST_MIN and st["p_correct_fork"] <= rl_jobs.START_FORK_P_MAX
                  for st in ss.starts.values())
    assert ss.learned is learned is False
    declared = {"starts_learned": {"role": "check", "claim": "c", "source": "s", "metric": "m", "scope": "x"}}
    check = ss.check(declared)
    assert check["verdict"] == "fail" and check["effect"] == min(st["avg_at_n_rest"] for st in ss.starts.values())
    assert ss.summary() == {"sft_start": ss.starts[0], "sft_starts": {"0": ss.starts[0], "1": ss.starts[1]},
                            "start_per_seed": True, "sft_start_sha256": {"0": ss.weights[0], "1": ss.weights[1]}}
    # Another notebook into the same root: the starts come from the cache, the same models and evaluations.
    again = rl_jobs.seed_starts(base, [1, 0], tmp_path / "nb_b", cache_root=cache_root, workers=1)
    assert again.dirs == ss.dirs and again.starts == ss.starts and again.weights == ss.weights

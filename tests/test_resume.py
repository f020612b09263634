"""Resume: an RL notebook's units of work (klear_lib.experiment + train.rl_jobs.rl_unit) interrupted by Ctrl-C after
the first unit finished, then run again into the same run directory, give exactly the records of an uninterrupted
run: the finished unit is not redone, the interrupted one is redone from its start, nothing is written twice."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from test_cli import as_from_a_terminal

from klear_lib import models, runs
from klear_lib.data import tasks

TIMING_KEYS = {"step_time", "seconds"}  # wall-clock: the only fields two identical runs may differ in


@pytest.fixture(scope="module")
def start(tmp_path_factory):
    train, _ = tasks.make_splits(1234, 64, 4, (1, 2))
    tok = models.build_tokenizer(tasks.corpus(train))
    spec = models.TinyModelSpec(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                intermediate_size=64)
    return models.save_model_and_tokenizer(models.build_tiny_model(tok, spec, seed=0), tok,
                                           tmp_path_factory.mktemp("start") / "model")


SCRIPT = textwrap.dedent("""
    import sys
    from klear_lib import experiment
    cfg = dict(n_train=64, n_heldout=4, levels="1,2", rollouts=2, rollout_prompts=2, mini_batch_prompts=1,
               num_generations=4, max_completion_length=10, eval_n=1, eval_every=1, filter_groups=False,
               fork_facts="", sft_alpha=0.0)
    jobs = [experiment.Job(f"gppo/seed={s}", "klear_lib.train.rl_jobs:rl_unit",
                           {"config": {**cfg, "seed": s}, "start": sys.argv[2], "tags": {"seed": s}}) for s in (0, 1)]
    if __name__ == "__main__":
        experiment.run_jobs(jobs, sys.argv[1], workers=1, progress=lambda *_: None)
""")


def records(run_dir):
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in runs.read_metrics(run_dir / "metrics.jsonl")]


def test_an_interrupted_run_resumed_equals_an_uninterrupted_one(tmp_path, start):
    script = tmp_path / "units.py"
    script.write_text(SCRIPT)
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    subprocess.run([sys.executable, str(script), str(whole), str(start)], check=True, timeout=600)

    proc = subprocess.Popen([sys.executable, str(script), str(parts), str(start)], stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=as_from_a_terminal)
    first = parts / "units" / "gppo_seed=0.json"
    deadline = time.monotonic() + 300
    while not first.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert first.exists(), "the first unit never finished"
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in a terminal: the whole group; the second unit is lost
    proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert not (parts / "units" / "gppo_seed=1.json").exists()
    done_before = json.loads(first.read_text())
    subprocess.run([sys.executable, str(script), str(parts), str(start)], check=True, timeout=600)
    assert json.loads(first.read_text()) == done_before  # the finished unit was not redone
    got, expected = records(parts), records(whole)
    assert len(got) == len(expected) > 0
    assert got == expected

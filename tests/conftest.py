import pytest
import torch

from klear_lib import models
from klear_lib.data import tasks

# Fixture notebooks are inputs of tests/test_cli.py (one of them fails on purpose), not notebooks to validate.
collect_ignore = ["fixtures"]

# One torch thread in a test process: the suite runs several processes per core (two pytest-xdist workers, their
# tests' own processes), and torch's default of a thread per core then has OpenMP threads spin on cores another
# process needs (the tests that train in-process ran 2-5x slower in make test than alone). make test also sets
# OMP_NUM_THREADS=1 for every process the tests start; a test that wants more threads asks for them.
torch.set_num_threads(1)


# make test hands whole files to its two pytest-xdist workers (--dist loadfile) in collection order
# (--no-loadscope-reorder: pytest-xdist 3.6+ otherwise orders the files by their number of tests, and this list went
# unused until 2026-12-07). The files that take longest go first, longest first (make test, 2026-12-07: the seconds
# each file's tests took with the notebook streams beside), so that the pass ends on short files, not on one worker
# running a long file while the other waits (the workers had ended 58 s apart).
SLOW_FILES_FIRST = ("test_ray_executor.py", "test_schedule.py", "test_cli.py", "test_bench_scripts.py",  # 95-53 s
                    "test_reward_pool.py", "test_wheel.py", "test_gpu_check.py", "test_papermill_readme.py",  # 48-23
                    "test_reward_code.py", "test_disk_full.py", "test_launch.py", "test_sampler.py",  # 18-17
                    "test_sandbox.py", "test_resume.py", "test_reward_under_load.py", "test_reward_math.py",  # 17-14
                    "test_readme_trainer.py", "test_evaluate.py", "test_run_identity.py", "test_sft_pipeline.py",
                    "test_rl_trainer.py", "test_ddp.py", "test_lab.py", "test_sft_bases.py", "test_progress.py",
                    "test_tracking.py")  # 14-10 s


def pytest_collection_modifyitems(config, items):
    """The files of SLOW_FILES_FIRST first, in that order (the others and each file's tests keep theirs); tests
    marked `gpu` run where CUDA is present and are skipped (with the reason shown) elsewhere."""
    rank = {name: i for i, name in enumerate(SLOW_FILES_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (marked gpu); none on this machine")
    for item in items:
        # the marker, not `"gpu" in item.keywords`: keywords hold the parent folders' names too (a checkout in a
        # folder named gpu would skip every test)
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="module")
def tiny():
    """A small task split, its tokenizer and a tiny model spec for trainer tests (tests/test_rl_trainer.py)."""
    train, _ = tasks.make_splits(0, 64, 4)
    tok = models.build_tokenizer(tasks.corpus(train))
    spec = models.TinyModelSpec(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                intermediate_size=128)
    return train, tok, spec

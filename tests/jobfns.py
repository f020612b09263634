"""Job functions for tests/test_experiment.py: importable by the spawned worker processes."""

import os
from pathlib import Path

from klear_lib import runs


def count_and_write(*, n: int, log: str, metrics_path: str, fail: bool = False) -> dict:
    """Append one line to ``log`` (to count calls), write ``n`` records, optionally fail after writing them."""
    with open(log, "a", encoding="utf-8") as f:
        f.write(f"{n}\n")
    with runs.MetricsWriter(metrics_path) as w:
        for i in range(n):
            w.write({"n": n, "i": i})
    if fail:
        raise RuntimeError(f"job {n} failed on purpose")
    import torch

    return {"n": n, "threads": torch.get_num_threads(), "pid": os.getpid(), "log_exists": Path(log).is_file()}


def slow_unit(*, n: int, steps: int, step_s: float, pad: int, children: bool, metrics_path: str) -> dict:
    """Write ``steps`` records ``step_s`` apart (each padded with ``pad`` bytes); with ``children``, keep two child
    processes alive meanwhile (a plain one and one in its own session, which a process-group kill misses)."""
    import subprocess
    import sys
    import time

    sleeper = [sys.executable, "-c", "import time; time.sleep(300)"]
    kids = [subprocess.Popen(sleeper), subprocess.Popen(sleeper, start_new_session=True)] if children else []
    try:
        with runs.MetricsWriter(metrics_path) as w:
            for i in range(steps):
                w.write({"n": n, "i": i, "pad": "x" * pad})
                time.sleep(step_s)
    finally:
        for kid in kids:
            kid.kill()
            kid.wait()
    return {"n": n, "steps": steps}


def where_it_tracks(*, report_to: str, metrics_path: str) -> dict:
    """What klear_lib.experiment.unit_tracking_dir tells this unit (its tracker's folder and names)."""
    from klear_lib.experiment import unit_tracking_dir

    runs.MetricsWriter(metrics_path).close()
    t = unit_tracking_dir(metrics_path, report_to)
    return {"folder": os.fspath(t), "project": t.project, "run_name": t.run_name}


def fake_rollouts(*, rollouts: int, delay: float, metrics_path: str, config: dict | None = None) -> dict:
    """Write an RL unit's rollout records (and a step record between them) ``delay`` seconds apart."""
    import time

    with runs.MetricsWriter(metrics_path) as w:
        for r in range(rollouts + 1):
            if r:
                w.write({"step": r, "rollout": r, "actor/pg_loss": 0.1})
            w.write({"rollout": r, "step": r, "final": r == rollouts, "reward": 0.25 * r,
                     "klear/p_correct_fork": 0.5, "eval/avg_at_n": 0.1 * r})
            time.sleep(delay)
    return {"rollouts": rollouts}


def worker_facts(*, metrics_path: str, threads_op: bool = False) -> dict:
    """What a unit sees as it starts in its worker: which of the forkserver's preloaded modules are in place, its
    parent, the environment variable KLEAR_TEST_WORKER_VAR and the working directory; with ``threads_op``, the
    checksum of a matrix product on the worker's torch threads (it must not hang in a forked worker: a watchdog
    ends the process after 60 s)."""
    import faulthandler
    import sys

    runs.MetricsWriter(metrics_path).close()
    out = {"peft_imported": "peft" in sys.modules, "ppid": os.getppid(), "pid": os.getpid(),
           "var": os.environ.get("KLEAR_TEST_WORKER_VAR"), "cwd": os.getcwd()}
    if threads_op:
        import torch

        faulthandler.dump_traceback_later(60, exit=True)
        g = torch.Generator().manual_seed(0)
        a = torch.rand(384, 384, generator=g, dtype=torch.float64)
        out["checksum"] = float((a @ a).sum())
        out["threads"] = torch.get_num_threads()
        faulthandler.cancel_dump_traceback_later()
    return out


def build_entry(*, n: int, cache_root: str, out_dir: str, metrics_path: str, size: int = 4096) -> dict:
    """A verified cache entry ``entry-<n>`` (``klear_lib.cache.ensure``: one file of seeded bytes) and an artefact
    ``out_dir/made.json``, as a start unit makes its model and its record; returns the model's folder."""
    import json
    import random

    from klear_lib import cache

    def build(work: Path) -> None:
        (work / "final").mkdir(parents=True)
        (work / "final" / "weights.bin").write_bytes(random.Random(n).randbytes(size))

    final, reused = cache.ensure(cache_root, f"entry-{n}", {"n": n}, build, label="test entry",
                                 progress=lambda *_: None)
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    (Path(out_dir) / "made.json").write_text(json.dumps({"n": n}))
    with runs.MetricsWriter(metrics_path) as w:
        w.write({"n": n, "reused": reused})
    return {"model_dir": str(final), "node": os.environ.get("KLEAR_TEST_NODE")}


def seeded_numbers(*, seed: int, start: str, steps: int, step_s: float, metrics_path: str) -> dict:
    """Records of seeded float64 matrix products on the worker's torch threads, seeded by ``seed`` and the first
    byte of the start's weights (a unit whose start did not arrive intact computes other numbers); the node it ran
    on (``KLEAR_TEST_NODE`` of the Ray node, None in a local worker) beside them."""
    import time

    import torch

    first = (Path(start) / "weights.bin").read_bytes()[0]
    g = torch.Generator().manual_seed(1000 * seed + first)
    total = 0.0
    with runs.MetricsWriter(metrics_path) as w:
        for i in range(steps):
            a = torch.rand(96, 96, generator=g, dtype=torch.float64)
            value = float((a @ a).sum())
            total += value
            w.write({"seed": seed, "i": i, "value": value})
            time.sleep(step_s)
    return {"seed": seed, "checksum": total, "threads": torch.get_num_threads(),
            "node": os.environ.get("KLEAR_TEST_NODE")}

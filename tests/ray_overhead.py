"""The Ray executor's cost per unit on one machine against the local pool, in one process and on one cluster
(the figures in docs/scale.md): ``python tests/ray_overhead.py [--units 16] [--rounds 3]``.

A local Ray cluster of this machine's CPUs (started by ``ray_executor.connect``, ended with this process) and the
local pool with as many workers run the same short units (``jobfns.count_and_write``: a few records, torch already
imported), alternately, after one warm-up run each (the local pool's forkserver, Ray's workers and theirs). Per unit:
the round's wall time / units × concurrency, i.e. the time one unit holds a CPU; the Ray overhead is the difference
of the medians. Cold: the warm-up runs' wall times (what the first ``run_jobs`` of a process pays)."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from klear_lib import experiment, ray_executor  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--units", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cpus", type=int, default=os.cpu_count() or 2)
    args = ap.parse_args()
    import ray

    ray.init(address="local", num_cpus=args.cpus, include_dashboard=False, logging_level="ERROR",
             log_to_driver=False, object_store_memory=100 * 2**20, _temp_dir=tempfile.mkdtemp(prefix="kro-"))
    ray_executor.connect()
    work = Path(tempfile.mkdtemp(prefix="ray-overhead-"))

    def once(executor: str, name: str) -> float:
        jobs = [experiment.Job(f"u/{i}", "jobfns:count_and_write", {"n": 3, "log": str(work / "log")})
                for i in range(args.units)]
        clock = time.perf_counter()
        experiment.run_jobs(jobs, work / name, workers=args.cpus, executor=executor, progress=lambda *_: None)
        return time.perf_counter() - clock

    cold = {e: once(e, f"warm-{e}") for e in ("local", "ray")}
    walls: dict[str, list[float]] = {"local": [], "ray": []}
    for r in range(args.rounds):
        for e in ("local", "ray"):
            walls[e].append(once(e, f"{e}-{r}"))
    per_unit = {e: statistics.median(w) / args.units * args.cpus for e, w in walls.items()}
    for e in ("local", "ray"):
        print(f"{e:5s}: cold run {cold[e]:.1f}s; {args.units} units x {args.rounds} rounds: "
              f"{', '.join(f'{w:.2f}s' for w in walls[e])}; per unit (CPU-held) {per_unit[e]:.3f}s")
    print(f"ray overhead per unit: {per_unit['ray'] - per_unit['local']:+.3f}s on {args.cpus} CPUs")
    ray.shutdown()


if __name__ == "__main__":
    main()

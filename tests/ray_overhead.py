"""The Ray executor's cost per unit on one machine against the local pool, in one process and on one cluster
(the figures in docs/scale.md): ``python tests/ray_overhead.py [--units 16] [--rounds 3]``.

A local Ray cluster of this machine's CPUs (``ray_executor.start_local``, as ``connect`` starts one: on loopback;
ended with this process) and the local pool with as many workers run the same short units
(``jobfns.count_and_write``: a few records, torch already imported), alternately, after one warm-up run each (the
local pool's forkserver, Ray's workers and theirs). Per unit: the round's wall time / units × concurrency, i.e. the
time one unit holds a CPU; the Ray overhead is the difference of the medians. Cold: the warm-up runs' wall times
(what the first ``run_jobs`` of a process pays). With ``--start-mb M`` the units read a start of M MB (a cache entry)
and Ray runs twice a round, every node sharing the driver's disk (``KLEAR_RAY_FILES=shared``) and shipping the start
(``ship``)."""

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
    ap.add_argument("--start-mb", type=float, default=0.0, help="units read a start (a cache entry) of this size: "
                    "the Ray runs then go once with every node sharing the disk and once shipping the start")
    args = ap.parse_args()
    import shutil

    import ray

    work = Path(tempfile.mkdtemp(prefix="ray-overhead-"))
    os.environ[ray_executor.SCRATCH_ENV] = str(work / "scratch")  # the local cluster's node mirrors, removed below
    ray_executor.start_local(ray, num_cpus=args.cpus, object_store_memory=100 * 2**20, _temp_dir=str(work / "ray"))

    start = None
    if args.start_mb:
        made = experiment.run_jobs([experiment.Job("start", "jobfns:build_entry", {
            "n": 1, "cache_root": str(work / "nb" / ".cache"), "out_dir": str(work / "nb" / "made"),
            "size": int(args.start_mb * 2**20)})], work / "nb" / "starts", executor="local", progress=lambda *_: None)
        start = made["start"]["model_dir"]
    arms = {"local": ("local", None), "ray": ("ray", None)} if start is None else {
        "local": ("local", None), "ray shared": ("ray", "shared"), "ray ship": ("ray", "ship")}

    def once(arm: str, name: str) -> float:
        executor, files = arms[arm]
        if start is None:
            jobs = [experiment.Job(f"u/{i}", "jobfns:count_and_write", {"n": 3, "log": str(work / "log")})
                    for i in range(args.units)]
        else:
            jobs = [experiment.Job(f"u/{i}", "jobfns:seeded_numbers", {"seed": i, "start": start, "steps": 1,
                                                                       "step_s": 0.0}) for i in range(args.units)]
        os.environ[ray_executor.FILES_ENV] = files or "auto"
        clock = time.perf_counter()
        experiment.run_jobs(jobs, work / "nb" / name, workers=args.cpus, executor=executor,
                            progress=lambda *_: None)
        return time.perf_counter() - clock

    cold = {arm: once(arm, f"warm-{arm}".replace(" ", "-")) for arm in arms}
    walls: dict[str, list[float]] = {arm: [] for arm in arms}
    for r in range(args.rounds):
        for arm in arms:
            walls[arm].append(once(arm, f"{arm}-{r}".replace(" ", "-")))
    per_unit = {arm: statistics.median(w) / args.units * args.cpus for arm, w in walls.items()}
    for arm in arms:
        print(f"{arm:10s}: cold run {cold[arm]:.1f}s; {args.units} units x {args.rounds} rounds: "
              f"{', '.join(f'{w:.2f}s' for w in walls[arm])}; per unit (CPU-held) {per_unit[arm]:.3f}s")
    for arm in arms:
        if arm != "local":
            print(f"{arm} overhead per unit: {per_unit[arm] - per_unit['local']:+.3f}s on {args.cpus} CPUs"
                  + (f", a {args.start_mb:g} MB start" if start else ""))
    ray.shutdown()
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

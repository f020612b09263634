"""Units of work on a Ray cluster (klear_lib.ray_executor). The local cluster that `--executor ray` starts where none
runs listens on loopback only (every listening socket of its processes, through /proc). Then a real two-node cluster
on this machine (`ray start --head` and `ray start --address`, one CPU each, each with its own temp dir, scratch
folder and resources; loopback only, checked the same way). The same units give the same records and results as the
local pool, with or without a shared disk (a cache entry made on a node reaches the driver and the node of a later
unit, checked against its manifest); a run started on Ray resumes on the local pool and the other way round, redoing
no finished unit; SIGKILL of the driver, or the death of the run's owner (`klear run`), ends the units on every node
and records nothing more, and the resume keeps every unit finished before the kill; a node killed mid-unit makes
that unit fail with one line and run again, every record once. About 200 s on 2 cores at load 6 (the loopback check
about 35 s of it; the clusters' start and each node's forkserver are most of it)."""

import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid

import pytest

from klear_lib import cache, experiment, runs

ray = pytest.importorskip("ray", reason="Ray is not installed (the 'ray' extra: pip install 'ray==2.60.0')")
from klear_lib import ray_executor  # noqa: E402 (after the skip)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts processes through /proc")

TESTS = pathlib.Path(__file__).parent
REPO = TESTS.parent
MARK = "KLEAR_TEST_RAY_MARK"  # every process of the test's cluster carries it (and KLEAR_TEST_NODE=<its node>)
UNIT_MARK = "KLEAR_TEST_UNIT_MARK"  # a KLEAR_ variable of the driver: the units' processes see it (forwarded)
NOT_TIMING = ("seconds", "cpu_seconds", "started_at", "ended_at", "node")  # times and placement: all that may
# differ between executors


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def marked(name: str, value: str, node: str | None = None) -> list[int]:
    """Live processes whose environment holds ``name=value`` (and ``KLEAR_TEST_NODE=node`` when given)."""
    found = []
    want = [f"{name}={value}".encode()] + ([f"KLEAR_TEST_NODE={node}".encode()] if node else [])
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
            if not all(w in env for w in want):
                continue
            if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
        except OSError:
            continue
        found.append(int(entry.name))
    return found


def _kill(pids) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _start_time(pid: int) -> str | None:
    try:
        return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _state(pid: int) -> str:
    """The one-letter state of /proc/<pid>/stat (``Z``: exited, its status not yet read by its parent), or ``?``."""
    try:
        return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "?"


def _running(seen: dict[int, str]) -> list[int]:
    """The processes of ``seen`` (pid -> start time) still running: the same start time (not a reused pid) and not
    a zombie. A zombie has exited and holds no socket or memory; it waits only for whoever adopted it (PID 1 or a
    subreaper, once its parent is gone) to read its exit status, which a busy machine may do late."""
    return [pid for pid, start in seen.items() if _start_time(pid) == start and _state(pid) != "Z"]


def _cmdline(pid: int) -> str:
    """A process's command line (for a failure message), or why it cannot be read."""
    try:
        return pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:300]
    except OSError as exc:
        return f"({exc.__class__.__name__})"


def _tree(root: int) -> set[int]:
    """``root`` and every live process below it (through /proc/<pid>/stat's parent ids)."""
    parents = {}
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    found, todo = {root}, [root]
    while todo:
        pid = todo.pop()
        kids = [p for p, parent in parents.items() if parent == pid and p not in found]
        found.update(kids)
        todo.extend(kids)
    return found


def _address(hex_addr: str):
    """A /proc/net/{tcp,udp}[6] address (``0100007F:1F90``: 32-bit words in host order, the port big-endian)."""
    import ipaddress

    host, port = hex_addr.split(":")
    raw = bytes.fromhex(host)
    raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4)) if sys.byteorder == "little" else raw
    return ipaddress.ip_address(raw), int(port, 16)


def listening(pid: int) -> list[tuple[str, str, int]]:
    """The listening TCP and bound UDP sockets that process ``pid`` holds: ``(proto, address, port)``. Its open
    file descriptors name socket inodes; its network namespace's /proc tables give each inode's local address."""
    try:
        inodes = set()
        for fd in pathlib.Path(f"/proc/{pid}/fd").iterdir():
            try:
                link = os.readlink(fd)
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    except OSError:
        return []
    out = []
    for proto in ("tcp", "tcp6", "udp", "udp6"):
        try:
            rows = pathlib.Path(f"/proc/{pid}/net/{proto}").read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            f = row.split()
            if f[9] in inodes and (proto.startswith("udp") or f[3] == "0A"):  # TCP: LISTEN only; UDP: any bound
                addr, port = _address(f[1])
                out.append((proto, str(addr), port))
    return out


def _is_loopback(address: str) -> bool:
    import ipaddress

    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)  # ::ffff:127.0.0.1: an IPv6 socket bound to IPv4's loopback
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


def _describe(pid: int) -> str:
    try:
        comm = pathlib.Path(f"/proc/{pid}/comm").read_text().strip()
        args = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return f"pid {pid}"
    script = next((a.decode().split("site-packages/")[-1] for a in args if a.endswith(b".py")), "")
    return f"{comm} (pid {pid}{', ' + script if script else ''})"


def beyond_loopback(pids) -> tuple[list[str], dict[int, list], dict[int, str]]:
    """Each listening socket of ``pids`` on an address other than loopback, as ``<process>: <proto> <address> port
    <port>``; and every socket, and each process's name."""
    sockets = {pid: listening(pid) for pid in pids}
    names = {pid: _describe(pid) for pid in pids}
    return ([f"{names[pid]}: {proto} {addr} port {port}" for pid, rows in sockets.items()
             for proto, addr, port in rows if not _is_loopback(addr)], sockets, names)


# `ray start`, but a loopback --node-ip-address and --address stay loopback (Ray would rewrite them to this machine's
# routable address, services.resolve_ip_for_localhost, and its servers would then listen on every interface)
RAY_START = ("import sys; from ray._private import services; services.resolve_ip_for_localhost = lambda host: host; "
             "from ray.scripts.scripts import main; sys.argv[0] = 'ray'; sys.exit(main())")


class Cluster:
    """Two Ray nodes on this machine, started with ``ray start``; every process they start is marked, so that the
    test ends exactly those (never ``ray stop``, which would end every cluster of the machine)."""

    def __init__(self):
        self.mark = uuid.uuid4().hex
        self.base = pathlib.Path(tempfile.mkdtemp(prefix="kray-"))  # short: Ray's socket paths must fit 107 bytes
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.start("head")
        self.start("w")

    def scratch(self, node: str) -> pathlib.Path:
        return self.base / f"scratch-{node}"

    def start(self, node: str) -> None:
        env = {**os.environ, MARK: self.mark, "KLEAR_TEST_NODE": node, "RAY_USAGE_STATS_ENABLED": "0",
               "RAY_AUTH_MODE": "disabled",  # whatever ~/.ray/auth_token this machine's other users made
               "PYTHONPATH": os.pathsep.join([str(REPO), str(TESTS)]),
               ray_executor.SCRATCH_ENV: str(self.scratch(node))}
        ports = ["--dashboard-agent-listen-port", str(_free_port()), "--metrics-export-port", str(_free_port()),
                 "--runtime-env-agent-port", str(_free_port())]
        where = (["--head", "--port", str(self.port), "--ray-client-server-port", str(_free_port()),
                  "--include-dashboard", "false", "--dashboard-port", str(_free_port())] if node == "head"
                 else ["--address", self.address])
        cmd = [sys.executable, "-c", RAY_START, "start", *where, "--num-cpus", "1",
               "--object-store-memory", str(80 * 2**20), "--temp-dir", str(self.base / node),
               "--resources", json.dumps({f"node_{node}": 1}), "--node-ip-address", "127.0.0.1",
               "--disable-usage-stats", *ports]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
        assert out.returncode == 0, f"ray start {node} failed: {out.stderr[-2000:]}"

    def kill_node(self, node: str) -> None:
        _kill(marked(MARK, self.mark, node))

    def stop(self) -> None:
        pids = marked(MARK, self.mark)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGTERM)
            except OSError:
                pass
        deadline = time.monotonic() + 5
        while marked(MARK, self.mark) and time.monotonic() < deadline:
            time.sleep(0.2)
        _kill(marked(MARK, self.mark))
        shutil.rmtree(self.base, ignore_errors=True)


class _Started(Cluster):
    def __init__(self):  # a node that fails to start ends the ones already started
        try:
            super().__init__()
        except BaseException:
            self.stop()
            raise


@pytest.fixture(scope="module")
def cluster():
    saved = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"  # the driver's side (and the driver script's) of the same choice
    c = _Started()
    try:
        ray_executor.connect(c.address)
        pids = set().union(*(_tree(pid) for pid in marked(MARK, c.mark))) | {os.getpid()}
        open_, sockets, _ = beyond_loopback(pids)
        assert open_ == [] and any(sockets.values()), "the test's cluster listens beyond loopback:\n" + \
            "\n".join(open_)
        print(f"the test's cluster: {sum(map(len, sockets.values()))} sockets in {len(pids)} processes, on loopback")
        yield c
    finally:
        ray.shutdown()
        c.stop()
        if saved is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = saved


def _run_dir(root: pathlib.Path) -> pathlib.Path:
    """A notebook's run directory under the output root ``root`` (its config.json: units find their run by it)."""
    run_dir = root / "nb" / "stamp"
    run_dir.mkdir(parents=True)
    (run_dir / runs.CONFIG_FILE).write_text("{}\n")
    return run_dir


def _pipeline(root: pathlib.Path, run_dir: pathlib.Path, executor: str) -> tuple[dict, dict, list]:
    """Two stages, as a notebook's: starts (cache entries under the output root's .cache, an artefact each), then
    units reading them; returns both stages' results and the records."""
    starts = [experiment.Job(f"start/{n}", "jobfns:build_entry", {"n": n, "cache_root": str(root / ".cache"),
                                                                  "out_dir": str(run_dir / "made" / str(n))})
              for n in (1, 2)]
    first = experiment.run_jobs(starts, run_dir / "starts", executor=executor, progress=lambda *_: None)
    jobs = [experiment.Job(f"unit/seed={s}", "jobfns:seeded_numbers", {
        "seed": s, "start": first[f"start/{1 + s % 2}"]["model_dir"], "steps": 4, "step_s": 0.25}) for s in range(4)]
    second = experiment.run_jobs(jobs, run_dir, executor=executor, progress=lambda *_: None)
    return first, second, runs.read_metrics(run_dir / runs.METRICS_FILE)


def _same(results: dict) -> dict:
    return {k: {f: v for f, v in r.items() if f not in NOT_TIMING} for k, r in results.items()}


def _count_jobs(tmp_path, fail=()):
    log = str(tmp_path / "calls.log")
    return [experiment.Job(f"job/n={n}", "jobfns:count_and_write", {"n": n, "log": log, "fail": n in fail})
            for n in (1, 2, 3)]


def _calls(tmp_path):
    log = tmp_path / "calls.log"
    return sorted(int(x) for x in log.read_text().split()) if log.exists() else []


# ---- the local cluster that `--executor ray` starts: loopback only -----------------------------------------------

LOCAL_DRIVER = """
import json, sys
sys.path[:0] = [sys.argv[2], sys.argv[3]]
from klear_lib import experiment
jobs = [experiment.Job("job/n=2", "jobfns:count_and_write", {"n": 2, "log": sys.argv[4]})]
results = experiment.run_jobs(jobs, sys.argv[1], executor="ray", progress=lambda *_: None)
import ray
from ray._private import ray_constants
print(json.dumps({"gcs": ray.get_runtime_context().gcs_address, "node_ip": ray.util.get_node_ip_address(),
                  "clusters_back_on": ray_constants.ENABLE_RAY_CLUSTER, "results": sorted(results)}), flush=True)
sys.stdin.readline()  # the test lists the sockets now; the cluster ends with this process
"""


def test_the_local_cluster_that_executor_ray_starts_listens_on_loopback_only(tmp_path):
    """A driver runs a unit with ``executor="ray"`` and ``KLEAR_RAY_ADDRESS=local`` (``connect`` ->
    ``start_local``, the path ``auto`` takes when no cluster runs): every TCP socket listening and every UDP socket
    bound in any process of the cluster it started (the driver, everything below it, and whatever carries its
    mark) is on loopback; GCS, raylet, the driver and Ray's workers are among them (the scan sees them). The
    cluster ends with the driver. Ray's default token authentication applies (a token made in the driver's HOME)."""
    mark = uuid.uuid4().hex
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_MODE", "RAY_ADDRESS", ray_executor.ADDRESS_ENV)}
    env.update({MARK: mark, ray_executor.ADDRESS_ENV: "local", "HOME": str(home), "RAY_USAGE_STATS_ENABLED": "0",
                ray_executor.SCRATCH_ENV: str(tmp_path / "scratch")})
    script = tmp_path / "driver.py"
    script.write_text(LOCAL_DRIVER)
    clock = time.monotonic()
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "run"), str(REPO), str(TESTS),
                             str(tmp_path / "calls.log")], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    seen: dict[int, str | None] = {}
    try:
        line = proc.stdout.readline()
        assert line, f"the driver ended: {proc.stderr.read()[-3000:]}"
        facts = json.loads(line)
        pids = _tree(proc.pid) | set(marked(MARK, mark))
        # a process that ended before its start time was read is not kept: its None would equal a gone process's
        # None for ever (the "leak" of two fresh clones, 2026-12-07: the message named a pid without /proc entry)
        seen = {pid: start for pid in pids if (start := _start_time(pid)) is not None}
        open_, sockets, names = beyond_loopback(pids)
        assert open_ == [], "listening beyond loopback:\n" + "\n".join(open_)
        # not a vacuous pass: the cluster's servers are there, listening (on loopback)
        by_name = {}
        for pid, rows in sockets.items():
            by_name.setdefault(names[pid].split(" (")[0], []).extend(port for _, _, port in rows)
        gcs_port = int(facts["gcs"].rsplit(":", 1)[1])
        assert gcs_port in by_name.get("gcs_server", []), (facts, by_name)
        assert len(by_name.get("raylet", [])) >= 2, by_name  # its node manager and object manager
        assert sockets[proc.pid], "the driver's own core worker server was not found"
        assert facts["node_ip"] == "127.0.0.1" and facts["clusters_back_on"] is True, facts
        assert facts["results"] == ["job/n=2"], facts
        assert (home / ".ray" / "auth_token").is_file()  # RAY_AUTH_MODE unset: Ray's token mode for a new cluster
        print(f"{len(pids)} processes, {sum(map(len, sockets.values()))} sockets, all on loopback: "
              + "; ".join(f"{n} {sorted(p)}" for n, p in sorted(by_name.items()) if p))
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0, proc.stderr.read()[-3000:]
        # a margin, not a budget: under make test's load Ray's processes may take over 20 s to end (a fresh clone,
        # 2026-12-07: the call took 37 s where it takes 15-21 s alone); a process left names its state and command line
        deadline = time.monotonic() + 60
        left = _running(seen)
        while left and time.monotonic() < deadline:
            time.sleep(0.2)
            left = _running(seen)
        assert left == [], ("processes of the local cluster left 60 s after its driver ended: "
                            + "; ".join(f"{pid} (state {_state(pid)}) {_cmdline(pid)}" for pid in left))
        print(f"loopback check: {time.monotonic() - clock:.1f}s in all")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if not stream.closed:
                stream.close()
        _kill([pid for pid, start in seen.items() if _start_time(pid) == start] + marked(MARK, mark))


def test_auto_without_a_running_cluster_starts_the_local_one_on_loopback(monkeypatch):
    """``connect("auto")`` (the default) where Ray finds no cluster goes to ``start_local``, the path tested above;
    a named address that fails is that address's error, never a local cluster."""
    calls, started = [], []

    class FakeRay:
        __version__ = ray.__version__

        @staticmethod
        def is_initialized():
            return False

        @staticmethod
        def init(address, **kwargs):
            calls.append(address)
            raise ConnectionError("Could not find any running Ray instance. Please specify the one to connect to")

    monkeypatch.setattr(ray_executor, "require_ray", lambda: FakeRay)
    monkeypatch.setattr(ray_executor, "start_local", lambda r, **kw: started.append((r, kw)) or r)
    monkeypatch.delenv(ray_executor.ADDRESS_ENV, raising=False)
    assert ray_executor.connect() is FakeRay
    assert (calls, started) == (["auto"], [(FakeRay, {})])
    assert ray_executor.connect("local") is FakeRay and calls == ["auto"]  # local: no search first
    with pytest.raises(ConnectionError):
        ray_executor.connect("10.0.0.1:6379")
    assert len(started) == 2


@pytest.mark.parametrize("first,then", [("ray", "local"), ("local", "ray")])
def test_a_run_started_on_one_executor_resumes_on_the_other_redoing_no_finished_unit(cluster, tmp_path, first,
                                                                                       then):
    """On this machine every node sees the run directory (auto: shared). A failure stops the run as it does
    locally (the same line); the resume runs only what did not finish."""
    run_dir = tmp_path / "run"
    expected = r"unit 'job/n=2' \(jobfns:count_and_write\) failed: RuntimeError: job 2 failed on purpose"
    with pytest.raises(experiment.JobFailed, match=expected):
        experiment.run_jobs(_count_jobs(tmp_path, fail={2}), run_dir, workers=1, executor=first,
                            progress=lambda *_: None)
    done_before = sorted(p.name for p in (run_dir / "units").glob("*.json"))
    ran_before = _calls(tmp_path)
    lines = []
    results = experiment.run_jobs(_count_jobs(tmp_path), run_dir, workers=2, executor=then, progress=lines.append)
    rerun = _calls(tmp_path)
    for n in ran_before:
        rerun.remove(n)
    redone = {f"job_n={n}.json" for n in rerun}
    assert not redone & set(done_before), (done_before, rerun)  # no finished unit ran again
    assert lines[0] == f"resuming: {len(done_before)} of 3 units already done, {3 - len(done_before)} to run"
    assert sorted(results) == ["job/n=1", "job/n=2", "job/n=3"]
    records = runs.read_metrics(run_dir / "metrics.jsonl")
    assert [(r["n"], r["i"]) for r in records] == [(1, 0), (2, 0), (2, 1), (3, 0), (3, 1), (3, 2)]
    if "ray" in (first, then):
        assert ray_executor._MODES.get(str(tmp_path)) == "shared"


@pytest.mark.parametrize("files", ["shared", "ship"])
def test_a_unit_on_ray_tracks_where_a_local_unit_does(cluster, tmp_path, monkeypatch, files):
    """A unit's experiment tracker (experiment.unit_tracking_dir) gets the same folder, project and run name on Ray,
    in either layout, as on the local pool: the driver's run directory's tracking/ folder."""
    monkeypatch.setenv(ray_executor.FILES_ENV, files)
    got = {}
    for executor in ("local", "ray"):
        run_dir = _run_dir(tmp_path / executor)
        job = experiment.Job("gppo/seed=0", "jobfns:where_it_tracks", {"report_to": "tensorboard"})
        got[executor] = experiment.run_jobs([job], run_dir / "control", executor=executor,
                                            progress=lambda *_: None)[job.key]
    assert got["ray"]["folder"] == got["local"]["folder"].replace(str(tmp_path / "local"), str(tmp_path / "ray"))
    assert got["ray"]["folder"] == str(tmp_path / "ray" / "nb" / "stamp" / "tracking" / "tensorboard" / "gppo" /
                                       "seed=0")
    assert (got["ray"]["project"], got["ray"]["run_name"]) == ("nb", "gppo/seed=0")


DRIVER = """
import sys
sys.path.insert(0, sys.argv[3])
from klear_lib import experiment, ray_executor
jobs = [experiment.Job("done/n=2", "jobfns:count_and_write", {"n": 2, "log": sys.argv[4]})]
jobs += [experiment.Job(f"u/{n}", "jobfns:slow_unit", {"n": n, "steps": 60, "step_s": 0.5, "pad": 0, "children": True})
         for n in range(2)]
ray_executor.connect(sys.argv[2])
experiment.run_jobs(jobs, sys.argv[1], executor="ray", progress=lambda *_: None)
"""


def test_sigkill_of_the_driver_ends_its_units_on_every_node_and_the_resume_keeps_every_finished_unit(cluster,
                                                                                                     tmp_path):
    """The driver (here a script; under `klear run`, the kernel) is killed after one unit finished and while the
    two others run, one per node, each with two child processes (one in a session of its own): Ray ends the run's
    workers, the units' processes follow; no unit is marked done after the kill, the finished one keeps its mark
    and records. The resume (run_jobs on the same run directory: what `klear run --resume` does in the kernel, by
    default on the local pool) runs only the two, never the finished one again (its call count, its result read
    from its mark, the same bytes), and records every unit once."""
    mark = uuid.uuid4().hex
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    run_dir = tmp_path / "run"
    calls = tmp_path / "calls.log"
    proc = subprocess.Popen([sys.executable, str(script), str(run_dir), cluster.address, str(TESTS), str(calls)],
                            env={**os.environ, UNIT_MARK: mark}, stderr=subprocess.PIPE, text=True)
    finished = run_dir / "units" / "done_n=2.json"
    records = [run_dir / "units" / f"u_{n}.jsonl" for n in range(2)]

    def ready():  # the first unit done, both others running: their records arrived
        return finished.exists() and all(r.exists() and r.stat().st_size > 0 for r in records)

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None and not ready():
        time.sleep(0.05)
    assert ready(), proc.stderr.read()[-2000:] if proc.poll() is not None else "not ready after 120 s"
    done_before = sorted(p.name for p in (run_dir / "units").glob("*.json"))
    mark_before = finished.read_bytes()
    assert done_before == ["done_n=2.json"], done_before  # the two slow units still run (30 s each)
    before = [pid for pid in marked(UNIT_MARK, mark) if pid != proc.pid]
    assert len(before) == 4, before  # each unit's two children (a unit's own process shows the mark only to them)
    proc.kill()
    killed = time.monotonic()
    proc.wait(timeout=30)
    proc.stderr.close()
    left = marked(UNIT_MARK, mark)
    while left and time.monotonic() < killed + 15:
        time.sleep(0.1)
        left = marked(UNIT_MARK, mark)
    gone_s = time.monotonic() - killed
    _kill(left)
    late = sorted(p.name for p in (run_dir / "units").glob("*.json"))
    assert (left, late) == ([], done_before), f"{len(left)} unit processes left 15 s after the kill: {left}; " \
                                              f"done: {late}"
    assert finished.read_bytes() == mark_before and calls.read_text() == "2\n"
    print(f"driver SIGKILL: every unit process gone {gone_s:.1f}s after the kill")
    jobs = [experiment.Job("done/n=2", "jobfns:count_and_write", {"n": 2, "log": str(calls)})]
    jobs += [experiment.Job(f"u/{n}", "jobfns:slow_unit", {"n": n, "steps": 3, "step_s": 0.0, "pad": 0,
                                                           "children": False}) for n in range(2)]
    lines = []
    results = experiment.run_jobs(jobs, run_dir, workers=2, progress=lines.append)
    assert lines[0] == "resuming: 1 of 3 units already done, 2 to run", lines
    assert calls.read_text() == "2\n"  # the finished unit did not run again
    assert finished.read_bytes() == mark_before  # nor was its mark rewritten
    assert results["done/n=2"] == json.loads(mark_before) and results["done/n=2"]["n"] == 2, results
    assert sorted(p.name for p in (run_dir / "units").glob("*.json")) == ["done_n=2.json", "u_0.json", "u_1.json"]
    records = runs.read_metrics(run_dir / "metrics.jsonl")
    assert sorted((r["n"], r["i"]) for r in records) == [(n, i) for n in range(2) for i in range(3)] + [(2, 0),
                                                                                                         (2, 1)]


def test_the_death_of_the_runs_owner_cancels_its_units_on_every_node_within_seconds(cluster, tmp_path, monkeypatch):
    """`klear run` (the owner, KLEAR_RUN_OWNER) dies while a unit runs on each node: the driver stops with OwnerGone
    at its next check and cancels every task (the path Ctrl-C takes too); the units' processes are gone within
    seconds and nothing is marked done."""
    mark = uuid.uuid4().hex
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    monkeypatch.setenv(experiment.OWNER_ENV, experiment.process_identity(owner.pid))
    monkeypatch.setenv(UNIT_MARK, mark)
    run_dir = tmp_path / "run"
    records = [run_dir / "units" / f"u_{n}.jsonl" for n in range(2)]

    def kill_owner_when_both_run():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not all(r.exists() and r.stat().st_size > 0 for r in records):
            time.sleep(0.05)
        owner.kill()
        owner.wait()

    jobs = [experiment.Job(f"u/{n}", "jobfns:slow_unit", {"n": n, "steps": 30, "step_s": 0.5, "pad": 0,
                                                          "children": True}) for n in range(2)]
    killer = threading.Thread(target=kill_owner_when_both_run, daemon=True)
    killer.start()
    clock = time.monotonic()
    with pytest.raises(experiment.OwnerGone, match=str(owner.pid)):
        experiment.run_jobs(jobs, run_dir, executor="ray", progress=lambda *_: None)
    killer.join(timeout=5)
    stopped = time.monotonic()
    assert stopped - clock < 60  # not the units' 15 s each, twice over
    left = marked(UNIT_MARK, mark)
    while left and time.monotonic() < stopped + 15:
        time.sleep(0.1)
        left = marked(UNIT_MARK, mark)
    gone_s = time.monotonic() - stopped
    _kill(left)
    assert left == [] and not list((run_dir / "units").glob("*.json")), left
    print(f"owner death: the driver stopped, every unit process gone {gone_s:.1f}s later")


def test_units_on_two_nodes_without_a_shared_disk_equal_the_local_pool_even_when_a_node_is_lost(
        cluster, tmp_path, monkeypatch):
    """Two stages through the cluster without a shared disk (``ship``): the starts, made on the nodes, come back
    whole to the driver's paths, reach the nodes of the units that read them (checked against their manifests on
    arrival), and the units' numbers and records equal the local pool's, every record once, although node ``w`` is
    killed (every process of it) while it runs a unit of the second stage: that unit fails with one line naming it
    and runs again on the node left. (The cluster has one node after this test: the others need none.)"""
    local_first, local, local_records = _pipeline(tmp_path / "local", _run_dir(tmp_path / "local"), "local")
    monkeypatch.setenv(ray_executor.FILES_ENV, "ship")
    root = tmp_path / "ray"
    run_dir = _run_dir(root)
    lines, killed = [], {}
    armed = threading.Event()

    def kill_when_w_runs_a_unit():
        armed.wait(timeout=300)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if any(p.stat().st_size > 0 for p in cluster.scratch("w").rglob(".ray-*/unit_seed=*.jsonl")):
                cluster.kill_node("w")
                killed["at"] = time.monotonic()
                return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_when_w_runs_a_unit, daemon=True)
    killer.start()
    starts = [experiment.Job(f"start/{n}", "jobfns:build_entry", {"n": n, "cache_root": str(root / ".cache"),
                                                                  "out_dir": str(run_dir / "made" / str(n))})
              for n in (1, 2)]
    first = experiment.run_jobs(starts, run_dir / "starts", executor="ray", progress=lambda *_: None)
    jobs = [experiment.Job(f"unit/seed={s}", "jobfns:seeded_numbers", {
        "seed": s, "start": first[f"start/{1 + s % 2}"]["model_dir"], "steps": 4, "step_s": 0.25}) for s in range(4)]
    armed.set()
    clock = time.monotonic()
    second = experiment.run_jobs(jobs, run_dir, executor="ray", progress=lines.append)
    ended = time.monotonic()
    killer.join(timeout=1)
    assert "at" in killed, "node w never ran a unit of the second stage"
    # the starts: made on both nodes (in their scratch folders), back at the driver's paths, intact
    assert {r["node"] for r in first.values()} == {"head", "w"}, first
    assert {k: r["model_dir"] for k, r in first.items()} == {
        k: r["model_dir"].replace(str(tmp_path / "local"), str(root)) for k, r in local_first.items()}
    for n in (1, 2):
        assert cache.verify_files(root / ".cache" / f"entry-{n}") is None
        assert json.loads((run_dir / "made" / str(n) / "made.json").read_text()) == {"n": n}
    # the node loss: one line naming the unit, which ran again on the head node
    lost = [line for line in lines if "lost its node or worker" in line]
    assert len(lost) == 1 and "running it again (attempt 2 of 3)" in lost[0], lines
    key = lost[0].split("'")[1]
    assert second[key]["node"] == "head"
    # the same numbers and records as the local pool's, every record once, none missing
    assert _same(second) == _same(local)
    assert runs.read_metrics(run_dir / runs.METRICS_FILE) == local_records
    assert not list(run_dir.glob(".ray-*")), "a work folder was left in the run directory"
    print(f"node loss: {lost[0]!r}; the run ended {ended - killed['at']:.1f}s after the kill "
          f"({ended - clock:.1f}s in all)")


def test_klear_run_takes_the_executor_as_an_option_or_a_parameter(monkeypatch, tmp_path):
    """``--executor ray``/``--ray-address`` and ``-p executor=ray``/``-p ray_address=...`` reach the kernel's units
    (runner: KLEAR_EXECUTOR, KLEAR_RAY_ADDRESS) and are not notebook parameters; a bad executor is one line."""
    from klear_lib import cli, runner

    seen = []
    monkeypatch.setattr(runner, "run_notebook", lambda *a, **kw: seen.append((a, kw)) or tmp_path)
    monkeypatch.setattr(runner, "report_contract", lambda run_dir: [])
    assert cli.main(["run", "03", "--executor", "ray", "--ray-address", "10.0.0.1:6379", "-p", "seeds=0"]) == 0
    assert cli.main(["run", "03", "-p", "executor=ray", "-p", "ray_address=auto", "-p", "seeds=0"]) == 0
    assert cli.main(["run", "--resume", str(tmp_path), "--executor", "local"]) == 0
    assert [(a[2], kw["executor"], kw["ray_address"]) for a, kw in seen] == [
        (["seeds=0"], "ray", "10.0.0.1:6379"), (["seeds=0"], "ray", "auto"), ([], "local", None)]
    assert cli.main(["run", "03", "-p", "executor=slurm"]) == 2

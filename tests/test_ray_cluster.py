"""A real multi-node Ray cluster: a head and two more nodes, every one bound to 127.0.0.1.

Ray's own multi-node test cluster (ray.cluster_utils.Cluster) starts each node as its own
raylet with its own node id, object store and worker processes, on this host; binding them
to loopback keeps every byte of test traffic on the machine. `tokenbench run` and `sweep`
join it with `--ray 127.0.0.1:PORT` (Ray rewrites a loopback address to this host's outward
IP; bench.distributed connects anyway: the issue-31 hang) and through Ray Client
(`ray://127.0.0.1:PORT`), against the fake server. Counts are small: these pass on two
loaded cores. Skipped, loudly, without Ray (`pip install 'tokenbench[ray]'`).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from bench.distributed import DistributedProgress, run_distributed
from bench.metrics import summarize
from tests.test_runner import plan

try:
    import ray
    from ray.cluster_utils import Cluster
except ImportError:  # pragma: no cover - depends on the environment
    ray = None

pytestmark = pytest.mark.slow

LOOPBACK = "127.0.0.1"
NODES = 3  # the head and two more, one CPU each: one worker per node
RAY_MISSING = "Ray is not installed: multi-node Ray tests SKIPPED (pip install 'tokenbench[ray]')"
# Ray's "multi-node clusters off" switch, read by every Ray process at import: set in the
# head's environment so that Ray Client's per-connection server, which Ray starts on the
# head, joins the loopback-bound GCS instead of this host's outward IP (ray#59110).
# And Ray Client's per-connection server gets 120 s to answer instead of 30: on two loaded
# cores its start missed 30 s once in CI ("Initialization failure from server").
RAY_LOOPBACK_ENV = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_CLIENT_SERVER_CHECK_CHANNEL_TIMEOUT_S": "120",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


class LoopbackCluster:
    """A head and NODES-1 worker nodes on 127.0.0.1, plus the Ray Client server on the head."""

    def __init__(self) -> None:
        self.client_port = free_port()
        address_file = Path("/tmp/ray/ray_current_cluster")
        previous = address_file.read_text() if address_file.exists() else None
        saved = {k: os.environ.get(k) for k in RAY_LOOPBACK_ENV}
        os.environ.update(RAY_LOOPBACK_ENV)
        try:
            self.cluster = Cluster(
                initialize_head=True,
                head_node_args={
                    "num_cpus": 1,
                    "node_ip_address": LOOPBACK,
                    "include_dashboard": False,
                    "ray_client_server_port": self.client_port,
                    # a lost node is declared dead in ~2 s, not Ray's default ~30 s
                    "_system_config": {
                        "health_check_period_ms": 500,
                        "health_check_timeout_ms": 500,
                        "health_check_failure_threshold": 4,
                    },
                },
            )
            self.workers = [self.add_node() for _ in range(NODES - 1)]
        finally:
            for key, value in saved.items():
                os.environ.pop(key) if value is None else os.environ.__setitem__(key, value)
            # Cluster writes its address where a bare ray.init() looks for "the" local
            # cluster: put back what was there, so other tests' own Ray stays their own.
            if previous is None:
                address_file.unlink(missing_ok=True)
            else:
                address_file.write_text(previous)
        self.address = self.cluster.address
        assert self.address.startswith(f"{LOOPBACK}:"), self.address

    def add_node(self):
        node = self.cluster.add_node(num_cpus=1, node_ip_address=LOOPBACK)
        self.cluster.wait_for_nodes()
        return node

    def node_ids(self) -> set[str]:
        return {n.node_id for n in [self.cluster.head_node, *self.workers]}

    def shutdown(self) -> None:
        if ray.is_initialized():
            ray.shutdown()
        self.cluster.shutdown()


@pytest.fixture(scope="module")
def cluster():
    if ray is None:
        warnings.warn(RAY_MISSING, stacklevel=1)
        print(f"\n*** {RAY_MISSING} ***", file=sys.stderr)
        pytest.skip(RAY_MISSING)
    c = LoopbackCluster()
    try:
        yield c
    finally:
        c.shutdown()


def tokenbench(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "bench", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "250"},
    )


def show_json(run_id: str, db: str) -> dict:
    proc = tokenbench("show", run_id, "--db", db, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def run_id_of(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout.split("Stored as run ")[1].split()[0]


def assert_every_node_ran_its_share(workers: list[dict], nodes: set[str], share: int) -> None:
    """One worker per node, each sent its share, each measured and judged itself."""
    assert {w["node"] for w in workers} == nodes
    assert [w["sent"] for w in workers] == [share] * NODES
    for w in workers:
        assert w["alive"] and w["completed"] == share and w["received"] == share
        # its own read statistics and its self-check: the per-node telemetry of the client
        assert w["loop_lag_p99_ms"] is not None and w["cpu_s"] is not None
        assert w["loop_cpu_share"] is not None and "client_limited" in w
        # its start: first send within the run, and the start broadcast acknowledged
        assert w["start_error_ms"] is not None and w["start_error_ms"] >= 0
        assert w["start_ack_ms"] is not None and w["start_ack_ms"] > 0
        assert w["node_ip"] == LOOPBACK


@pytest.mark.parametrize("via", ["gcs", "client"])
def test_run_on_three_loopback_nodes(cluster, server_factory, tmp_path, via):
    server = server_factory("--ttft-ms", "50", "--itl-ms", "10")
    db = f"sqlite:///{tmp_path / 'tb.db'}"
    address = cluster.address if via == "gcs" else f"ray://{LOOPBACK}:{cluster.client_port}"
    n = 12 * NODES
    started = time.monotonic()
    proc = tokenbench(
        "run", "--base-url", server.url, "--model", "fake-model", "--request-rate", "24",
        "--num-prompts", str(n), "--random-input-len", "16", "--random-output-len", "6",
        "--ray", address, "--workers", str(NODES), "--db", db, "--disable-tqdm",
    )  # fmt: skip
    run_id = run_id_of(proc)
    assert time.monotonic() - started < 200  # bounded: the run waited past 200 s
    assert server.stats() == {"requests": n, "finished": n}  # the server's own count
    shown = show_json(run_id, db)
    assert shown["status"] == "completed"
    (summary,) = shown["summaries"].values()
    assert summary["completed"] == n and summary["failed"] == 0
    (workers,) = shown["workers"].values()
    assert_every_node_ran_its_share(workers, cluster.node_ids(), n // NODES)
    # `show` names every node in its table
    text = tokenbench("show", run_id, "--db", db).stdout
    assert all(node[:12] in text for node in cluster.node_ids()), text


def test_sweep_on_three_loopback_nodes(cluster, server_factory, tmp_path):
    server = server_factory("--ttft-ms", "30", "--itl-ms", "5")
    db = f"sqlite:///{tmp_path / 'tb.db'}"
    n = 6 * NODES
    proc = tokenbench(
        "sweep", "--base-url", server.url, "--model", "fake-model", "--request-rates", "12,24",
        "--num-prompts", str(n), "--random-input-len", "16", "--random-output-len", "4",
        "--ray", cluster.address, "--workers", str(NODES), "--db", db,
        "--summary-json", str(tmp_path / "sweep.json"),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run_id = json.loads((tmp_path / "sweep.json").read_text())["run_id"]
    assert server.stats()["requests"] == 2 * n
    shown = show_json(run_id, db)
    assert len(shown["workers"]) == 2  # every load point has its per-node detail
    for workers in shown["workers"].values():
        assert_every_node_ran_its_share(workers, cluster.node_ids(), n // NODES)
    for summary in shown["summaries"].values():
        assert summary["completed"] == n


def test_merged_percentiles_are_those_of_the_union_of_node_records(cluster, fake_server):
    """The merged run is not an average of per-node figures: its percentiles are those of
    every node's records pooled, computed here independently of bench.metrics."""
    batches: list[list] = []
    result = run_distributed(
        plan(fake_server.url, 8 * NODES, out_len=6, rate=24.0),
        workers=NODES,
        ray_address=cluster.address,
        handle_sigint=False,
    )
    assert {w.node for w in result.workers} == cluster.node_ids()
    # Open loop, one request per session: worker k sent requests k, k+NODES, ...
    for k in range(NODES):
        batches.append([r for r in result.records if r.index % NODES == k])
        assert len(batches[k]) == result.workers[k].received == 8
    union = [r for batch in batches for r in batch]
    summary = summarize(result.records)
    ttft = np.array([r.first_token_ns - r.sent_ns for r in union]) / 1e6
    e2el = np.array([r.end_ns - r.sent_ns for r in union]) / 1e6
    itl = np.concatenate([np.diff(r.chunk_times_ns) for r in union]) / 1e6
    for name, values in (("ttft", ttft), ("e2el", e2el), ("itl", itl)):
        got = summary.metrics[name].percentiles
        for p in (50, 90, 99):
            assert got[f"p{p}"] == pytest.approx(np.percentile(values, p), abs=1e-6), (name, p)


def test_node_lost_mid_run_is_reported_with_what_it_had_done(cluster, fake_server):
    """A fourth node joins, gets a worker, and is removed (its raylet and workers killed)
    mid-run: the run ends without a hang, partial, naming that worker, with its records."""
    extra = cluster.add_node()
    try:
        lost: list[str] = []

        def remove_once(p: DistributedProgress) -> None:
            victim = next(w for w in p.workers if w.node == extra.node_id)
            if not lost and victim.received >= 6:
                cluster.cluster.remove_node(extra)
                lost.append(extra.node_id)

        workers = NODES + 1
        started = time.monotonic()
        result = run_distributed(
            plan(fake_server.url, 30 * workers, out_len=6, rate=12.0 * workers),  # 2.5 s
            workers=workers,
            ray_address=cluster.address,
            on_tick=remove_once,
            handle_sigint=False,
        )
        assert lost, "the node was never removed"
        assert time.monotonic() - started < 120
        assert result.partial and result.interrupted
        dead = next(w for w in result.workers if w.node == extra.node_id)
        assert not dead.alive and dead.error
        assert 6 <= dead.received < 30
        kept = [r for r in result.records if r.index % workers == dead.worker]
        assert len(kept) == dead.received and all(r.ok for r in kept)
        for w in result.workers:
            if w is not dead:
                assert w.alive and w.completed == 30  # the other nodes finished their share
        assert len(result.records) == 30 * NODES + dead.received
        assert any(f"worker {dead.worker}" in m and "died" in m for m in result.warnings)
    finally:
        if extra in cluster.cluster.worker_nodes:
            cluster.cluster.remove_node(extra)

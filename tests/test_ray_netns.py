"""A real multi-node Ray cluster, each node in its own network namespace with its own address.

Where the machine allows it (root, iproute2), a head and two worker nodes each run
`ray start` in a network namespace of their own (10.231.7.1-3, joined by a bridge in a hub
namespace that also holds the fake server); the host's own network is not touched and
nothing leaves the machine. The driver (`tokenbench run`/`sweep --ray`) runs in the head's
namespace, as a driver on a real cluster runs on a node. Elsewhere this is skipped and
tests/test_ray_cluster.py's loopback cluster covers the same ground.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_ray_cluster import NODES, RAY_MISSING, ray, run_id_of, show_json

pytestmark = pytest.mark.slow


NETNS_NET = "10.231.7"  # a private /24 that exists only inside the namespaces made here


class NamespaceCluster:
    """A head and two worker nodes, each `ray start --block` in its own network namespace
    with its own address; the fake server in a hub namespace whose bridge joins them. The
    host's own network is not touched: every interface is made inside a namespace. Needs
    root (CAP_NET_ADMIN) and iproute2; `available()` says whether this machine allows it."""

    def __init__(self) -> None:
        tag = f"tb{os.getpid() % 100000}"
        self.hub = f"{tag}h"
        self.nodes = [f"{tag}n{k}" for k in range(NODES)]
        self.ips = [f"{NETNS_NET}.{k + 1}" for k in range(NODES)]
        self.address = f"{self.ips[0]}:6379"
        self.procs: list[subprocess.Popen] = []
        self.made: list[str] = []

    @staticmethod
    def available() -> bool:
        probe = f"tbprobe{os.getpid() % 100000}"
        if os.geteuid() != 0 or not shutil.which("ip"):
            return False
        made = subprocess.run(["ip", "netns", "add", probe], capture_output=True).returncode == 0
        if made:
            subprocess.run(["ip", "netns", "del", probe], capture_output=True)
        return made

    def ip(self, *args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)

    def start(self) -> None:
        self.ip("netns", "add", self.hub)
        self.made.append(self.hub)
        self.ip("-n", self.hub, "link", "set", "lo", "up")
        self.ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
        self.ip("-n", self.hub, "addr", "add", f"{NETNS_NET}.254/24", "dev", "br0")
        self.ip("-n", self.hub, "link", "set", "br0", "up")
        for k, (ns, addr) in enumerate(zip(self.nodes, self.ips, strict=True)):
            self.ip("netns", "add", ns)
            self.made.append(ns)
            self.ip("-n", ns, "link", "set", "lo", "up")
            self.ip("-n", self.hub, "link", "add", f"p{k}", "type", "veth", "peer", "name", "eth0",
                    "netns", ns)  # fmt: skip
            self.ip("-n", self.hub, "link", "set", f"p{k}", "master", "br0")
            self.ip("-n", self.hub, "link", "set", f"p{k}", "up")
            self.ip("-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
            self.ip("-n", ns, "link", "set", "eth0", "up")
        ray_cli = str(Path(sys.executable).with_name("ray"))
        common = ["--block", "--num-cpus=1", "--disable-usage-stats"]
        self.spawn(self.nodes[0], ray_cli, "start", "--head", f"--node-ip-address={self.ips[0]}",
                   "--port=6379", "--include-dashboard=false", *common)  # fmt: skip
        self.wait_for(1)  # the head first: a node that starts before its GCS may time out
        # Then one node at a time, each given a second try: on a loaded machine a raylet
        # now and then never completes its registration (seen 1 in 4 starts here).
        for k, (ns, addr) in enumerate(zip(self.nodes[1:], self.ips[1:], strict=True)):
            for _attempt in range(2):
                node = self.spawn(ns, ray_cli, "start", f"--address={self.address}",
                                  f"--node-ip-address={addr}", *common)  # fmt: skip
                if addr in self.wait_for(k + 2, within_s=100):
                    break
                node.terminate()
                node.wait(60)
        assert self.wait_for(NODES) == sorted(self.ips)

    def wait_for(self, nodes: int, within_s: float = 150) -> list[str]:
        """The addresses of the live nodes once `nodes` are, or after within_s, asked from
        inside the head's namespace."""
        wait = (
            "import json,ray,sys,time\n"
            "ray.init(address=sys.argv[1], log_to_driver=False)\n"  # Ray waits for the GCS
            "end = time.monotonic() + float(sys.argv[3])\n"
            "while time.monotonic() < end and sum(n['Alive'] for n in ray.nodes()) < int(sys.argv[2]):\n"
            "    time.sleep(0.5)\n"
            "print(json.dumps(sorted(n['NodeManagerAddress'] for n in ray.nodes() if n['Alive'])))\n"
        )
        joined = self.exec(self.nodes[0], sys.executable, "-c", wait, self.address, str(nodes),
                           str(within_s), timeout=within_s + 90)  # fmt: skip
        assert joined.returncode == 0, joined.stderr[-2000:]
        return json.loads(joined.stdout.strip().splitlines()[-1])

    def spawn(self, ns: str, *argv: str, **kw) -> subprocess.Popen:
        # Its own session: `ray start --block` stops its process group when told to stop.
        proc = subprocess.Popen(["ip", "netns", "exec", ns, *argv], env=self.env(),
                                start_new_session=True, **kw)  # fmt: skip
        self.procs.append(proc)
        return proc

    def exec(self, ns: str, *argv: str, timeout: float) -> subprocess.CompletedProcess:
        return subprocess.run(["ip", "netns", "exec", ns, *argv], capture_output=True, text=True,
                              timeout=timeout, env=self.env())  # fmt: skip

    @staticmethod
    def env() -> dict[str, str]:
        # Ray 2.60 heads turn token auth on when ~/.ray/auth_token exists; every process
        # here then needs it on too (they share that file), or the GCS refuses them.
        # A loaded machine starts a raylet slowly: give it 2 min to register, not Ray's 30 s.
        return {**os.environ, "RAY_AUTH_MODE": "token", "RAY_raylet_start_wait_time_s": "120",
                "COLUMNS": "250"}  # fmt: skip

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        for ns in self.made:  # anything of ours still in a namespace, then the namespace
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
            for pid in pids.stdout.split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


@pytest.fixture(scope="module")
def netns_cluster():
    if ray is None:
        pytest.skip(RAY_MISSING)
    if not NamespaceCluster.available():
        pytest.skip("network namespaces need root and iproute2: covered by the loopback cluster")
    address_file = Path("/tmp/ray/ray_current_cluster")
    previous = address_file.read_text() if address_file.exists() else None
    c = NamespaceCluster()
    try:
        c.start()
        yield c
    finally:
        c.stop()
        if previous is None:
            address_file.unlink(missing_ok=True)
        else:
            address_file.write_text(previous)


def test_run_and_sweep_on_three_nodes_in_their_own_network_namespaces(netns_cluster, tmp_path):
    c = netns_cluster
    server = c.spawn(c.hub, sys.executable, str(Path(__file__).with_name("fake_openai_server.py")),
                     "--port", "0", "--host", f"{NETNS_NET}.254", "--ttft-ms", "50",
                     "--itl-ms", "10", stdout=subprocess.PIPE, text=True)  # fmt: skip
    port = int(server.stdout.readline().split()[1])
    url = f"http://{NETNS_NET}.254:{port}"
    db = f"sqlite:///{tmp_path / 'tb.db'}"
    n = 8 * NODES
    common = ["--base-url", url, "--model", "fake-model", "--num-prompts", str(n),
              "--random-input-len", "16", "--random-output-len", "6", "--ray", c.address,
              "--workers", str(NODES), "--db", db]  # fmt: skip
    driver = c.nodes[0]  # a Ray driver joins through its own node's raylet: run it on the head
    run = c.exec(driver, sys.executable, "-m", "bench", "run", *common, "--request-rate", "24",
                 "--disable-tqdm", timeout=240)  # fmt: skip
    run_id = run_id_of(run)
    sweep = c.exec(driver, sys.executable, "-m", "bench", "sweep", *common, "--request-rates",
                   "12,24", "--summary-json", str(tmp_path / "sweep.json"), timeout=240)  # fmt: skip
    assert sweep.returncode == 0, sweep.stdout[-3000:] + sweep.stderr[-3000:]
    stats = c.exec(
        driver,
        sys.executable,
        "-c",
        "import sys,urllib.request as u;print(u.urlopen(sys.argv[1] + '/stats').read().decode())",
        url,
        timeout=30,
    )
    assert json.loads(stats.stdout)["requests"] == 3 * n  # one run + two sweep points
    sweep_id = json.loads((tmp_path / "sweep.json").read_text())["run_id"]
    for rid, points in ((run_id, 1), (sweep_id, 2)):
        shown = show_json(rid, db)
        assert len(shown["workers"]) == points
        for workers in shown["workers"].values():
            assert sorted(w["node_ip"] for w in workers) == c.ips  # one worker in each namespace
            assert len({w["node"] for w in workers}) == NODES
            assert [w["sent"] for w in workers] == [n // NODES] * NODES
            assert all(w["alive"] and w["start_error_ms"] is not None for w in workers)

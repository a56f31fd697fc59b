"""`tokenbench tune`: command lines from launch templates, the engine's process group,
health polling, one stored run per combination, resume, failures kept with their log, and
the ranking. The "engine" is tests/fake_openai_server.py, whose --ttft-ms is the setting."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from bench.cli import app
from bench.launchers import LAUNCHERS, LaunchSpecError, command_line, version_command
from bench.launchers._process import EngineProcess, LaunchError, engine_version, free_port
from bench.store import get_run
from bench.tune import (
    ExperimentError,
    combo_key,
    command_of,
    is_done,
    load_experiment,
    parse_experiment,
    rank,
    run_experiment,
    stored_runs,
)
from tests.helpers import wait_for

ROOT = Path(__file__).resolve().parent.parent
FAKE = ROOT / "tests" / "fake_openai_server.py"
PY = sys.executable


# ---------------------------------------------------------------- command lines


def test_named_engines_turn_settings_into_their_flags():
    argv = command_line(
        "llama-server", template=None, binary="/opt/llama-server", fixed={"model": "m.gguf"},
        settings={"parallel": 4, "ctx_size": 2048, "cont_batching": False}, port=9000,
    )  # fmt: skip
    assert argv == [
        "/opt/llama-server", "--host", "127.0.0.1", "--port", "9000", "--model", "m.gguf",
        "--parallel", "4", "--ctx-size", "2048", "--no-cont-batching",
    ]  # fmt: skip
    vllm = command_line(
        "vllm", template=None, binary=None, fixed={"model": "org/m"},
        settings={"max_num_seqs": 64, "enable_chunked_prefill": False, "kv_cache_dtype": "fp8"},
        port=1,
    )  # fmt: skip
    assert vllm[:2] == ["vllm", "serve"]
    assert vllm[6:] == [
        "org/m", "--max-num-seqs", "64", "--no-enable-chunked-prefill", "--kv-cache-dtype", "fp8",
    ]  # fmt: skip
    trt = command_line(
        "trtllm-serve", template=None, binary=None, fixed={"model": "org/m"},
        settings={"tp_size": 2, "--custom_flag": "x"}, port=1,
    )  # fmt: skip
    assert trt[5:] == ["org/m", "--tp_size", "2", "--custom_flag", "x"]
    sglang = command_line(
        "sglang", template=None, binary="/venv/bin/python", fixed={"model": "m"},
        settings={"tp_size": 2, "disable_radix_cache": True}, port=1,
    )  # fmt: skip
    assert sglang[:3] == ["/venv/bin/python", "-m", "sglang.launch_server"]
    assert sglang[-5:] == ["--model-path", "m", "--tp-size", "2", "--disable-radix-cache"]
    assert version_command("sglang", sglang, None)[0] == "/venv/bin/python"
    assert version_command("llama-server", ["/x/ls"], None) == ["/x/ls", "--version"]
    assert version_command("command", ["x"], "x --version") == ["x", "--version"]


def test_a_command_template_fills_port_and_settings():
    argv = command_line(
        "command", template="eng --port {port} --slots {slots} --fast {fast}", binary=None,
        fixed={}, settings={"slots": 3, "fast": True}, port=7,
    )  # fmt: skip
    assert argv == ["eng", "--port", "7", "--slots", "3", "--fast", "true"]


@pytest.mark.parametrize(
    ("engine", "template", "settings", "message"),
    [
        ("command", "eng --port {port} --x {nope}", {}, "placeholder {nope} names no setting"),
        ("command", "eng --port {port}", {"slots": 2}, "params.slots: the launch.command has no"),
        ("llama-server", None, {"slotz": 2}, "setting 'slotz' is not one llama-server knows"),
        ("vllm", None, {"enable_chunked_prefill": 1}, "is a switch: give true or false"),
    ],
)
def test_launch_spec_errors_say_what_to_fix(engine, template, settings, message):
    with pytest.raises(LaunchSpecError, match=message.replace("{", r"\{").replace("}", r"\}")):
        command_line(engine, template=template, binary=None, fixed={}, settings=settings, port=1)


def test_every_engine_launcher_has_a_health_path_and_a_version():
    for kind in LAUNCHERS.kinds():
        assert kind.obj.health.startswith("/")
        if kind.name != "command":
            assert kind.obj.version is not None and "{port}" in kind.obj.command


# ---------------------------------------------------------------- experiment files


def experiment(tmp_path: Path, **over) -> dict:
    """An experiment over the fake engine: its TTFT is the setting."""
    doc = {
        "name": "fake-tune",
        "launch": {
            "command": f"{PY} {FAKE} --port {{port}} --ttft-ms {{ttft_ms}} --itl-ms 1",
            "version": f"{PY} -c \"print('fake engine version 1.2')\"",
        },
        "health": {"path": "/health", "timeout_s": 60},
        "params": {"ttft_ms": [5, 80]},
        "target": {"model": "fake"},
        "load": {"num_prompts": 6},
        "workload": {"input": {"mean": 16}, "output": {"mean": 4}},
        "slo": "p99_ttft_ms<=40",
        "sweep": {"concurrency": [1, 2], "slo_iterations": 0},
        "warmup_requests": 1,
    }
    doc.update(over)
    return doc


def write(tmp_path: Path, doc: dict) -> Path:
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_experiment_files_are_checked_before_anything_starts(tmp_path):
    doc = experiment(tmp_path, params={"ttft_ms": [1, 2], "x": [3]})
    doc["launch"]["command"] += " --x {x}"
    exp = parse_experiment(doc, source="e")
    assert exp.combinations() == [{"ttft_ms": 1, "x": 3}, {"ttft_ms": 2, "x": 3}]
    assert [t.metric for t in exp.sweep.thresholds] == ["p99_ttft_ms"]
    cases = [
        ({"target": {"base_url": "http://x"}}, "target.base_url: leave it out"),
        ({"params": {"ttft_ms": []}}, "params: a mapping of setting"),
        ({"launch": {"engine": "nope"}}, "launch.engine 'nope': choose one of"),
        ({"sweep": {"concurrency": [1], "auto": 3}}, "give exactly one of"),
        ({"params": {"ttft_ms": [1], "slots": [2]}}, "params.slots: the launch.command has no"),
        ({"load": {"num_promts": 2}}, "num_promts"),
    ]
    for over, message in cases:
        with pytest.raises(ExperimentError, match=message):
            parse_experiment(experiment(tmp_path, **over), source="exp.yaml")
    typo = tmp_path / "typo.yaml"
    typo.write_text(
        "launch:\n  command: e --port {port} --a {a}\nparams:\n  a: [1, 2]\n"
        "load:\n  num_promts: 3\n"
    )
    with pytest.raises(ExperimentError, match=r"typo.yaml line 6: load.num_promts: unknown"):
        load_experiment(typo)  # the scenario's errors name the file's own lines
    path = write(tmp_path, experiment(tmp_path, params={"ttft_ms": []}))
    result = CliRunner().invoke(app, ["tune", str(path)])
    assert result.exit_code == 2 and "params: a mapping" in result.output


@pytest.mark.parametrize("path", sorted((ROOT / "experiments").glob("*.yaml")), ids=str)
def test_shipped_experiments_parse_and_name_their_engine(path):
    exp = load_experiment(path)
    assert exp.engine in LAUNCHERS and len(exp.combinations()) >= 2
    assert exp.scenario.slo and exp.sweep is not None


def test_binary_and_args_from_the_command_line_override_the_file(tmp_path):
    path = ROOT / "experiments" / "llama-server-slots.yaml"
    exp = load_experiment(path, binary="/opt/ls", args={"model": "/m/tiny.gguf", "threads": 1})
    argv = command_of(exp, exp.combinations()[0], port=5)
    assert argv[0] == "/opt/ls" and argv[argv.index("--model") + 1] == "/m/tiny.gguf"
    assert argv[argv.index("--threads") + 1] == "1" and argv.count("--threads") == 1
    bad = CliRunner().invoke(app, ["tune", str(path), "--arg", "model"])
    assert bad.exit_code == 2 and "--arg 'model': give NAME=VALUE" in bad.output


# ---------------------------------------------------------------- the engine process


def _gone(pid: int) -> bool:
    """The process no longer runs (absent, or a zombie waiting to be reaped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return True
    return state == "Z"


FORKS = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
open(sys.argv[1], "w").write(str(child.pid))
print("engine up", flush=True)
time.sleep(120)
"""


@pytest.mark.slow
def test_stop_ends_the_whole_process_group_even_on_ctrl_c(tmp_path):
    script = tmp_path / "forks.py"
    script.write_text(FORKS)
    pid_file = tmp_path / "child.pid"
    engine = EngineProcess([PY, str(script), str(pid_file)], tmp_path / "e.log")
    with pytest.raises(KeyboardInterrupt), engine:
        child = int(wait_for(lambda: pid_file.exists() and pid_file.read_text(), 60, "child"))
        assert os.getpgid(child) == engine.pgid != os.getpgid(0)
        raise KeyboardInterrupt  # what Ctrl-C raises while waiting or warming up
    assert engine.proc.poll() is not None
    wait_for(lambda: _gone(child), 30, "the engine's child to end with its group")
    assert "engine up" in engine.tail()


@pytest.mark.slow
def test_health_waits_and_failures_carry_the_log_tail(tmp_path):
    port = free_port()
    with EngineProcess([PY, str(FAKE), "--port", str(port)], tmp_path / "ok.log") as engine:
        assert engine.wait_healthy(f"http://127.0.0.1:{port}/health", 60) >= 0
    assert engine.proc.poll() is not None
    bad = EngineProcess([PY, str(FAKE), "--ttft-ms", "fast"], tmp_path / "bad.log")
    with bad, pytest.raises(LaunchError, match="exited with status 2") as info:
        bad.wait_healthy(f"http://127.0.0.1:{free_port()}/health", 60)
    assert "invalid float value: 'fast'" in info.value.tail
    mute = EngineProcess([PY, "-c", "import time; time.sleep(60)"], tmp_path / "mute.log")
    with mute, pytest.raises(LaunchError, match="did not answer 2xx within 0.5 s"):
        mute.wait_healthy(f"http://127.0.0.1:{free_port()}/health", 0.5)
    with pytest.raises(LaunchError, match="cannot start"):
        EngineProcess([str(tmp_path / "no-such-engine")], tmp_path / "none.log")
    assert engine_version([PY, "-c", "print('x'); print('eng version 9')"]) == "eng version 9"
    assert engine_version([str(tmp_path / "missing")]) is None


# ---------------------------------------------------------------- a whole experiment


@pytest.mark.slow
def test_tune_stores_one_run_per_combination_resumes_and_ranks(tmp_path):
    db = str(tmp_path / "t.db")
    doc = experiment(tmp_path)
    doc["params"]["ttft_ms"].append("slow")  # a launch that fails: argparse exits 2
    exp = load_experiment(write(tmp_path, doc))
    outcome = run_experiment(exp, db=db, log_dir=tmp_path / "logs")
    assert len(outcome.measured) == 2 and len(outcome.failed) == 1 and not outcome.skipped

    runs = stored_runs("fake-tune", db)
    assert set(runs) == {combo_key({"ttft_ms": v}) for v in (5, 80, "slow")}
    fast = runs[combo_key({"ttft_ms": 5})]
    tune = fast.extra_json["tune"]
    assert fast.status == "completed" and tune["outcome"] == "measured"
    assert tune["settings"] == {"ttft_ms": 5}
    assert tune["engine_version"] == "fake engine version 1.2"
    assert "--ttft-ms 5 --itl-ms 1" in tune["command"] and "--port " in tune["command"]
    points = get_run(fast.id, db).load_points  # the sweep's two points
    assert [(lp.load_point, lp.concurrency) for lp in points] == [(0, 1), (1, 2)]
    failed = runs[combo_key({"ttft_ms": "slow"})]
    assert failed.status == "failed"
    assert "exited with status 2" in failed.extra_json["tune"]["error"]
    assert "invalid float value: 'slow'" in failed.extra_json["tune"]["log_tail"]

    ranking = rank(exp, db)
    assert [r.settings for r in ranking.ranked] == [{"ttft_ms": 5}, {"ttft_ms": 80}]
    assert ranking.ranked[0].capacity.kind == "at_least"  # 5 ms meets 40 ms everywhere
    assert ranking.ranked[1].capacity.kind == "below"  # 80 ms never does
    assert ranking.failed == [({"ttft_ms": "slow"}, failed.extra_json["tune"]["error"])]
    assert ranking.verdict().startswith("Best: ttft_ms=5: at least ")

    # A rerun skips what is stored and retries only the failed combination.
    again = run_experiment(exp, db=db, log_dir=tmp_path / "logs")
    assert len(again.skipped) == 2 and len(again.failed) == 1 and not again.measured

    result = CliRunner().invoke(app, ["tune", str(write(tmp_path, doc)), "--db", db, "--rank-only"])
    assert result.exit_code == 0, result.output
    assert "ttft_ms=5" in result.output and "Best: ttft_ms=5" in result.output
    assert "failed ttft_ms=slow" in result.output
    top = " ".join(r.run_id[:8] for r in ranking.ranked)
    assert f"Side by side: tokenbench compare {top}" in result.output


@pytest.mark.slow
def test_an_engine_that_dies_during_the_measurement_is_recorded(tmp_path):
    db = str(tmp_path / "t.db")
    doc = experiment(tmp_path, params={"ttft_ms": [5]}, sweep={"concurrency": [1, 1, 1]})
    exp = load_experiment(write(tmp_path, doc))
    killed = []

    def kill_engine(point, _index):  # the engine crashes after the first load point
        if not killed:
            pid = int(stored_pid(tmp_path))
            os.kill(pid, 9)
            killed.append(pid)

    outcome = run_experiment(exp, db=db, log_dir=tmp_path / "logs", on_point=kill_engine)
    assert outcome.failed == [combo_key({"ttft_ms": 5})] and killed
    newest = stored_runs("fake-tune", db)[combo_key({"ttft_ms": 5})]
    assert newest.status == "failed"
    assert "died during the measurement" in newest.extra_json["tune"]["error"]
    assert rank(exp, db).ranked == []


def stored_pid(tmp_path: Path) -> str:
    """The fake engine's pid: the process listening on the port its log file is named by."""
    log = next((tmp_path / "logs").glob("fake-tune-1-*.log"))
    port = log.stem.rsplit("-", 1)[1]
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmd = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if str(FAKE).encode() in cmd and port.encode() in cmd:
                return proc.name
    raise AssertionError(f"no fake engine on port {port}")


def test_no_api_route_can_launch_an_engine():
    """Launch templates come from the command line only: the service never imports the
    launchers or the tune driver (DESIGN.md's safety rule for issue 30)."""
    from tests.test_layering import import_graph

    graph = import_graph(ROOT)
    reached = {m for m in graph if m.startswith(("server", "dashboards"))}
    todo = list(reached)
    while todo:  # everything the service imports, directly or not
        for name in graph.get(todo.pop(), {}):
            if name not in reached:
                reached.add(name)
                todo.append(name)
    assert "server.app" in reached
    assert not [m for m in reached if m.startswith(("bench.launchers", "bench.tune"))]


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_ctrl_c_or_sigterm_stops_the_engine_it_started(tmp_path, sig, code):
    """Ctrl-C or SIGTERM while the engine starts: tune exits 128 + the signal, the engine's
    group is gone, and nothing is stored as the engine's failure."""
    script = tmp_path / "forks.py"
    script.write_text(FORKS)
    pid_file = tmp_path / "child.pid"
    doc = experiment(tmp_path, launch={"command": f"{PY} {script} {pid_file} {{port}} {{n}}"})
    doc["params"] = {"n": [1]}
    path = write(tmp_path, doc)
    proc = subprocess.Popen(
        [PY, "-m", "bench", "tune", str(path), "--db", str(tmp_path / "t.db"),
         "--log-dir", str(tmp_path / "logs")],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        child = int(wait_for(lambda: pid_file.exists() and pid_file.read_text(), 60, "engine"))
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == code, out + err
    assert "Traceback" not in err
    wait_for(lambda: _gone(child), 30, "the engine's child to end with its group")
    assert stored_runs("fake-tune", str(tmp_path / "t.db")) == {}


# ---------------------------------------------------------------- the verdict


def _capacity(kind: str, value: float, low: float | None = None, high: float | None = None):
    from bench.curves import Capacity, CurvePoint

    point = CurvePoint(0, "c 4", 4, 1.0, value, value, value, value, 10, 0, {})
    return Capacity(kind, [], point, low, high)


def test_the_verdict_names_the_winner_and_its_margin():
    from bench.tune import Ranked, Ranking

    def verdict(*caps) -> str:
        ranked = [Ranked({"parallel": i + 1}, f"r{i}", c) for i, c in enumerate(caps)]
        return Ranking(ranked, [], []).verdict()

    clear = verdict(
        _capacity("interpolated", 900, 880, 920), _capacity("interpolated", 600, 590, 610)
    )
    assert clear.startswith("Best: parallel=1: 900 output tok/s per GPU")
    assert "1.50x (range 1.44x-1.56x) the runner-up (parallel=2)" in clear
    assert "could flip" not in clear
    close = verdict(
        _capacity("interpolated", 620, 560, 680), _capacity("interpolated", 600, 550, 650)
    )
    assert "1.03x" in close and "so the order could flip" in close
    swapped = verdict(
        _capacity("interpolated", 977, 990, 977), _capacity("interpolated", 927, 1282, 913)
    )
    assert "so the order could flip" in swapped  # an interval with its ends swapped
    bounds = verdict(_capacity("at_least", 1185), _capacity("at_least", 985))
    assert "1.20x the runner-up (parallel=2) at the highest loads tested" in bounds
    assert verdict(_capacity("peak", 10)).endswith("(the only combination measured)")
    below = verdict(_capacity("interpolated", 500, 450, 550), _capacity("below", 0))
    assert "against parallel=2: the second met the SLO at no load tested" in below


@pytest.mark.slow
def test_ctrl_c_while_measuring_keeps_the_partial_run_for_a_rerun_to_redo(tmp_path):
    import httpx

    db, logs = str(tmp_path / "t.db"), tmp_path / "logs"
    doc = experiment(tmp_path, params={"ttft_ms": [5]}, load={"num_prompts": 100000})
    doc["sweep"] = {"concurrency": [1], "slo_iterations": 0, "point_duration_s": 300}
    path = write(tmp_path, doc)
    cmd = [PY, "-m", "bench", "tune", str(path), "--db", db, "--log-dir", str(logs)]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        log = wait_for(lambda: next(logs.glob("fake-tune-1-*.log"), None), 60, "engine log")
        url = f"http://127.0.0.1:{log.stem.rsplit('-', 1)[1]}/stats"

        def measuring() -> bool:  # past the warm-up request: the measured point is running
            try:
                return httpx.get(url, timeout=2).json()["finished"] > 3
            except httpx.HTTPError:
                return False

        wait_for(measuring, 60, "the measurement to start")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out + err
    assert "Traceback" not in err
    run = stored_runs("fake-tune", db)[combo_key({"ttft_ms": 5})]
    assert run.status == "interrupted" and run.request_count > 0
    assert not is_done(run)  # so a rerun measures this combination again
    with pytest.raises(httpx.HTTPError):  # the engine was stopped
        httpx.get(url, timeout=2)

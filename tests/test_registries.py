"""Every seam's registry (bench.registry): listed, documented, reachable, and open to a new
kind that is one module and nothing else.

Each throwaway kind below is registered the way a new module in the registry's package
registers itself, used through the code path the CLI and the API use (scenario -> plan ->
runner; the export writer; the telemetry scraper), and unregistered again.
"""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
import pytest
from typer.testing import CliRunner

from bench.backends.dialects import DIALECTS
from bench.backends.openai import StreamResult
from bench.cli import app
from bench.datasets import DATASETS, Dataset
from bench.executor import plan_from_scenario
from bench.export.formats import EXPORT_FORMATS, ExportFormat, downloads, write
from bench.lengths import LENGTHS
from bench.records import COUNT_USAGE, OK
from bench.registry import Registry, UnknownKindError, all_registries, markdown
from bench.scenario import Scenario, ScenarioError, parse_scenario
from bench.shapes import SHAPES, LoadShape
from bench.sweep import PointSpec, mean_rate, scenario_at
from bench.telemetry import ENGINES, TelemetryConfig, canonicalize, engine_of, parse_prometheus
from bench.telemetry.engines import EngineNames
from bench.telemetry.names import Point
from bench.telemetry.scrapers import start_scraper
from bench.telemetry.sources import SOURCES, SourceKind
from bench.traces import TRACE_FORMATS, TraceFormat
from tests.helpers import (
    LAST_CHUNK,
    Reply,
    ScriptedTransport,
    http_chunk,
    http_head,
    run_scripted,
    store_sweep,
    wait_for,
)

ROOT = Path(__file__).resolve().parent.parent
REGISTRIES = {
    "dataset": DATASETS,
    "length distribution": LENGTHS,
    "load shape": SHAPES,
    "trace format": TRACE_FORMATS,
    "dialect": DIALECTS,
    "export format": EXPORT_FORMATS,
    "telemetry source": SOURCES,
    "metrics vocabulary": ENGINES,
}


@contextmanager
def registered(registry: Registry, name: str, description: str, obj):
    """A throwaway kind, as a module of the registry's package would add it."""
    registry.register(name, description, obj)
    try:
        yield obj
    finally:
        registry.unregister(name)
    assert name not in registry


# ---------------------------------------------------------------- listing and docs


def test_every_registry_is_listed_with_documented_kinds():
    found = {r.noun: r for r in all_registries()}
    assert found == REGISTRIES
    for registry in found.values():
        assert registry.names(), registry.noun
        for kind in registry.kinds():  # every lazy kind's object imports
            assert kind.obj is not None
            assert kind.description and "\n" not in kind.description
    for kind in DIALECTS.kinds():
        assert kind.obj.name == kind.name  # stored runs say which dialect ran


def test_readme_lists_every_kind_as_the_registries_say():
    readme = (ROOT / "README.md").read_text()
    start = readme.index("<!-- kinds:start (tokenbench kinds --markdown) -->\n")
    end = readme.index("<!-- kinds:end -->")
    listed = readme[readme.index("\n", start) + 1 : end]
    assert listed == markdown(), "run `tokenbench kinds --markdown` and paste it in the README"
    for registry in all_registries():
        for name in registry.names():
            assert f"  - `{name}`: " in listed


def test_the_cli_reaches_every_kind():
    runner = CliRunner()
    listing = runner.invoke(app, ["kinds"])
    assert listing.exit_code == 0, listing.output
    for registry in all_registries():
        assert f"{registry.noun} ({registry.where})" in listing.output
        for name, text in registry.describe().items():
            assert f"{name}  " in listing.output and text in listing.output
    assert runner.invoke(app, ["kinds", "--markdown"]).output == markdown()
    bad = runner.invoke(app, ["kinds", "nope"])
    assert bad.exit_code == 2 and "'load shape'" in bad.output

    # The flags that name a kind list every one in their help.
    run_help = " ".join(runner.invoke(app, ["run", "--help"]).output.split())
    assert f"--backend <str> {DIALECTS.help()}:" in run_help
    assert f"--dataset-name <str> {DATASETS.help()}:" in run_help
    export_help = runner.invoke(app, ["export", "--help"]).output
    assert f"<{'|'.join(EXPORT_FORMATS.names())}>" in export_help
    # Scenario files (`--scenario`) accept every shape and dataset: the model's schema.
    schema = Scenario.model_json_schema()["$defs"]
    assert schema["Load"]["properties"]["shape"]["enum"] == list(SHAPES.names())
    assert schema["WorkloadSpec"]["properties"]["dataset"]["enum"] == list(DATASETS.names())
    trace_format = schema["TraceSpec"]["properties"]["format"]["anyOf"][0]
    assert trace_format["enum"] == list(TRACE_FORMATS.names())


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    """The service over a database with one stored sweep: (app, run id, database URL)."""
    from server.app import create_app

    db = f"sqlite:///{tmp_path_factory.mktemp('kinds') / 'runs.db'}"
    run_id = store_sweep(db, per_point=10)
    application = create_app(
        db, api_token="t", allow_hosts=[], open_reads=True, server_names=["test"]
    )
    yield application, run_id, db
    application.state.tb.jobs.shutdown()


def get(application, path: str) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
            return await c.get(path)

    return asyncio.run(go())


def test_the_api_reaches_every_kind(api):
    application, run_id, _ = api
    listed = get(application, "/api/kinds").json()
    assert [r["registry"] for r in listed] == [r.noun for r in all_registries()]
    for entry in listed:
        registry = REGISTRIES[entry["registry"]]
        assert {k["name"]: k["description"] for k in entry["kinds"]} == registry.describe()
    schema = get(application, "/openapi.json").json()
    target = schema["components"]["schemas"]["TargetIn"]["properties"]["backend"]
    assert target["anyOf"][0]["enum"] == list(DIALECTS.names())
    parameters = schema["paths"]["/api/export"]["get"]["parameters"]
    (fmt,) = [p for p in parameters if p["name"] == "format"]
    assert fmt["schema"]["enum"] == list(downloads()) == ["pptx", "xlsx", "csv", "html"]
    bad = get(application, f"/api/export?run={run_id}&format=png")
    assert bad.status_code == 422 and "choose one of pptx, xlsx, csv, html" in bad.text


# ---------------------------------------------------------------- the registry itself


def test_registering_twice_or_looking_up_an_unknown_name_says_what_to_do(tmp_path, monkeypatch):
    package = tmp_path / "toy_kinds"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "first.py").write_text(
        textwrap.dedent("""
            from tests.test_registries import TOYS
            TOYS.register("alpha", "the first toy", 1)
            TOYS.register_lazy("beta", "a toy imported when used", "toy_kinds.second:VALUE")
        """)
    )
    (package / "second.py").write_text("VALUE = 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    global TOYS
    TOYS = Registry("toy", package="toy_kinds", where="--toy", listed=False)
    try:
        # every module of the package is imported on the first read
        assert TOYS.names() == ("alpha", "beta") and TOYS.get("beta") == 2
        assert "toy_kinds.second" in sys.modules
        with pytest.raises(ValueError, match="toy 'alpha' is registered already"):
            TOYS.register("alpha", "again", 3)
        assert TOYS.get("alpha") == 1
        with pytest.raises(UnknownKindError) as err:
            TOYS.get("gamma")
        assert str(err.value) == "unknown toy 'gamma' (--toy): choose one of alpha, beta"
        with pytest.raises(ValueError, match="one-line description"):
            TOYS.register("delta", "two\nlines", 4)
        assert TOYS.help() == "alpha or beta" and "toy" not in {r.noun for r in all_registries()}
    finally:
        for name in ("toy_kinds", "toy_kinds.first", "toy_kinds.second"):
            sys.modules.pop(name, None)


# ---------------------------------------------------------------- throwaway kinds, end to end


class LineDialect:
    """A server that streams newline-delimited JSON, not SSE: {"t": text} per token, then
    {"end": true, "n": tokens}. Nothing else in tokenbench knows this format."""

    name = "lines"

    def build_body(self, *, endpoint, model, prompt=None, messages=None, max_tokens,
                   ignore_eos, extra=None) -> bytes:  # fmt: skip
        return json.dumps({"model": model, "input": prompt, "n": max_tokens}).encode()

    def decode(self, body, ends: np.ndarray) -> StreamResult:
        result = StreamResult()
        offset = 0
        for line in bytes(body).split(b"\n"):
            offset += len(line) + 1
            if not line.strip():
                continue
            event = json.loads(line)
            if "t" in event:  # the read in which this line was complete
                result.content_reads.append(int(np.searchsorted(ends, offset - 1, "right")))
                result.content_text.append(event["t"])
            elif event.get("end"):
                result.done, result.completion_tokens = True, event["n"]
        if not result.done:
            result.error_kind, result.error_message = "no_done", "no end line"
        return result


def _lines_reply(n: int, path: str, body: dict) -> Reply:
    """Tokens 2 ms apart, each line in its own read, framed as chunked HTTP."""
    lines = [json.dumps({"t": f"w{i} "}) + "\n" for i in range(body["n"])]
    lines.append(json.dumps({"end": True, "n": body["n"]}) + "\n")
    head = http_head(content_type="application/x-ndjson")
    reads = [(1_000_000, head)]
    reads += [(2_000_000 * (i + 1), http_chunk(line.encode())) for i, line in enumerate(lines)]
    return Reply([*reads, (2_000_000 * (len(lines) + 1), LAST_CHUNK)])


def _every_50ms(scenario, rng, base_dir):
    return np.arange(scenario.load.num_prompts) * 0.05


def test_a_new_dialect_shape_and_dataset_run_end_to_end(tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("first prompt\nsecond prompt\n")

    def read_lines(path: Path) -> list[tuple[str, int | None]]:
        return [(line, 3) for line in path.read_text().splitlines()]

    with (
        registered(DIALECTS, "lines", "newline-delimited JSON stream", LineDialect()),
        registered(
            SHAPES,
            "every_50ms",
            "one request every 50 ms",
            LoadShape(_every_50ms, mean_rate=lambda load: 20.0),
        ),
        registered(DATASETS, "textlines", "one prompt per line", Dataset(read_lines)),
    ):
        sc = parse_scenario(
            "target: {base_url: 'http://127.0.0.1:9', backend: lines, model: m}\n"
            "load: {shape: every_50ms, num_prompts: 4}\n"
            f"workload: {{dataset: textlines, dataset_path: '{prompts}'}}\n"
            "seed: 5\n"
        )
        plan = plan_from_scenario(sc)
        assert plan.offsets_s.tolist() == pytest.approx([0.0, 0.05, 0.1, 0.15])
        transport = ScriptedTransport(_lines_reply)
        result = run_scripted(plan, transport)

        # the new dialect built every body, from the new dataset's prompts
        assert sorted(b["input"] for b in transport.bodies) == sorted(
            ["first prompt", "second prompt"] * 2
        )
        assert {b["n"] for b in transport.bodies} == {3}
        # ... and read every stream: three tokens 2 ms apart, counted from its end line
        records = sorted(result.records, key=lambda r: r.index)
        assert [r.state for r in records] == [OK] * 4
        for rec in records:
            assert rec.output_tokens == 3 and rec.token_count_source == COUNT_USAGE
            gaps = np.diff(rec.chunk_times_ns) / 1e6
            assert gaps.tolist() == pytest.approx([2.0, 2.0], abs=0.01)
            assert (rec.first_token_ns - rec.sent_ns) / 1e6 == pytest.approx(2.0, abs=0.01)
        # a sweep keeps a shape it cannot scale as Poisson at the point's rate
        assert mean_rate(sc) == 20.0
        point = scenario_at(sc, PointSpec("rate", 7.0))
        assert (point.load.shape, point.load.request_rate) == ("poisson", 7.0)
    with pytest.raises(ScenarioError, match="unknown load shape; choose one of poisson"):
        parse_scenario("load: {shape: every_50ms}")


def test_a_new_length_distribution_draws_the_lengths():
    def alternating(dist, n, rng):  # mean/2, 3*mean/2, mean/2, ...
        return np.where(np.arange(n) % 2, 1.5, 0.5) * dist.mean

    with registered(LENGTHS, "alternating", "half, then one and a half", alternating):
        sc = parse_scenario(
            "seed: 2\nload: {num_prompts: 4}\n"
            "workload: {input: {dist: alternating, mean: 100}, output: {mean: 8}}\n"
        )
        specs = sc.workload_plan().specs(4)
        assert [(s.input_len, s.output_len) for s in specs] == [(50, 8), (150, 8)] * 2


def test_a_new_trace_format_is_replayed(tmp_path):
    """A trace whose lines are `<ms since start> <input> <output>`: its module turns them
    into the columns every trace has, and the scenario replays it."""

    def ms_rows(path: Path) -> list[dict]:
        rows = []
        for line in path.read_text().split("\n"):
            if line.strip():
                ms, inp, out = line.split()
                rows.append({"timestamp": int(ms) / 1000, "input_len": inp, "output_len": out})
        return rows

    trace = tmp_path / "requests.ms"
    trace.write_text("1000 30 5\n1250 40 6\n2000 50 7\n")
    with registered(TRACE_FORMATS, "ms", "ms offsets", TraceFormat(ms_rows, (".ms",))):
        for fmt in ("", "format: ms, "):  # named, or found by the file's suffix
            sc = parse_scenario(
                "target: {base_url: 'http://127.0.0.1:9'}\n"
                f"load: {{shape: trace, trace: {{{fmt}path: '{trace}'}}}}\nseed: 1\n"
            )
            plan = plan_from_scenario(sc)
            assert plan.offsets_s.tolist() == [0.0, 0.25, 1.0]
            assert [(s.input_len, s.output_len) for s in plan.specs] == [(30, 5), (40, 6), (50, 7)]
    with pytest.raises(ValueError, match="not JSON"):  # a named format wins over the suffix
        parse_scenario(f"load: {{shape: trace, trace: {{path: '{trace}', format: jsonl}}}}").trace()


def test_a_new_export_format_is_written_and_served(api, tmp_path):
    from bench.cost import load_catalogue
    from bench.export.report import build_report

    application, run_id, db = api

    def write_text(report, out: Path) -> Path:
        out.write_text(" ".join(c.run_id for c in report.curves))
        return out

    fmt = ExportFormat(write_text, "Text", media_type="text/plain", download_suffix="txt")
    with registered(EXPORT_FORMATS, "txt", "run ids as text", fmt):
        report = build_report([run_id], db, None, load_catalogue())
        assert write(report, "txt", tmp_path / "r.txt").read_text() == run_id
        served = get(application, f"/api/export?run={run_id}&format=txt")
        assert served.status_code == 200, served.text
        assert served.text == run_id and served.headers["content-type"].startswith("text/plain")
        assert served.headers["content-disposition"].endswith(f'-{run_id[:8]}.txt"')
    assert get(application, f"/api/export?run={run_id}&format=txt").status_code == 422


class CountingSource:
    """A telemetry source of the new kind: a gauge that counts its own reads."""

    name, where = "toy", "in memory"

    def __init__(self) -> None:
        self.reads = 0

    def read(self) -> list[Point]:
        self.reads += 1
        return [Point("toy_reads", "toy_reads", "", float(self.reads), "gauge")]

    def close(self) -> None:
        pass


def test_a_new_telemetry_source_and_vocabulary_are_scraped_and_named():
    source = CountingSource()
    kind = SourceKind(wanted=lambda config: True, make=lambda config, url, timeout: source)
    vocabulary = EngineNames("Toy", ("toy:",), {"requests_waiting": (("toy:queue", {}),)})
    with (
        registered(SOURCES, "toy", "a counter", kind),
        registered(ENGINES, "toy", "toy:* names", vocabulary),
    ):
        config = TelemetryConfig(scrape_metrics=False, interval_s=0.05)
        assert config.enabled
        scraper = start_scraper(config, "http://127.0.0.1:9")
        wait_for(lambda: source.reads >= 2, 30, "two reads of the new source")
        recording = scraper.stop()
        (log,) = recording.sources
        assert (log.name, log.where, log.failed) == ("toy", "in memory", 0)
        (series,) = log.series.values()
        assert series.metric == "toy_reads"
        assert list(series.values) == [float(i) for i in range(1, log.ok + 1)]
        points = canonicalize(parse_prometheus("toy:queue 3\nother 1\n"))
        assert [(p.metric, p.value) for p in points] == [("requests_waiting", 3.0), ("other", 1.0)]
        assert engine_of(["toy:queue"]) == "Toy"
    assert canonicalize(parse_prometheus("toy:queue 3\n"))[0].metric == "toy:queue"
    assert not TelemetryConfig(scrape_metrics=False).enabled

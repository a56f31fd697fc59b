"""The dashboard in real headless Chromium: the compare page's charts hold the runs' points,
and the start-a-benchmark form runs a job and follows its progress to the end.

Needs Debian's chromium (/usr/bin/chromium) and Playwright's Python package (no browser
download: `playwright install` is never run). Skips, saying why, when either is missing.
The compare page's screenshot is kept at results/screenshots/compare.png for a human look.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bench.curves import run_curves
from server.live import LiveServer

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SCREENSHOTS = Path(__file__).resolve().parents[1] / "results" / "screenshots"
TOKEN = "browser-token"

try:
    from playwright.sync_api import sync_playwright
except ImportError:  # pragma: no cover - depends on the machine
    sync_playwright = None

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        sync_playwright is None or not Path(CHROMIUM).exists(),
        reason=(
            "BROWSER TEST SKIPPED: needs `apt-get install -y chromium` (/usr/bin/chromium) and "
            "`pip install playwright` (do not run `playwright install`)"
        ),
    ),
]


def launch(playwright):
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    from server.app import create_app
    from tests.helpers import store_sweep

    db = f"sqlite:///{tmp_path_factory.mktemp('browser') / 'b.db'}"
    ids = [
        store_sweep(db, gpu="B200-SXM", rates=(1, 2, 4, 8), failures=1),
        store_sweep(db, gpu="H100-SXM", gpu_count=2, rates=(1, 2, 4, 8), seed=3, simulated=False),
    ]
    server = LiveServer(create_app(db, api_token=TOKEN, allow_hosts=[], open_reads=True))
    yield server, db, ids
    server.stop()


CHART_DATA = """names => Object.fromEntries(names.map(n => {
  const div = document.getElementById('chart-' + n);
  return [n, div.data.map(t => ({x: Array.from(t.x), y: Array.from(t.y), meta: t.meta,
    name: t.name, colour: (t.marker && t.marker.color) || t.line.color}))];
}))"""


def test_compare_page_charts_hold_the_runs_points(live):
    server, db, ids = live
    curves = run_curves(ids, db)
    with sync_playwright() as p:
        browser = launch(p)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("requestfailed", lambda r: errors.append(f"request failed: {r.url}"))
            page.goto(f"{server.url}/compare?run={ids[0]}&run={ids[1]}")
            page.wait_for_selector("body[data-ready='1']", timeout=30_000)
            charts = page.evaluate(
                CHART_DATA, ["ttft", "tpot", "interactivity", "cost_interactivity", "cost"]
            )
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SCREENSHOTS / "compare.png"), full_page=True)
            sentence = page.text_content("#sentence")
            reference = page.text_content("#run-list li:has(#reference-badge)")
            rows = page.locator("#percentile-table tbody tr").count()
            readout_rows = page.locator("#readout-table tbody tr").count()
            plotly_src = page.evaluate("document.querySelector('script[src*=plotly]').src")
        finally:
            browser.close()
    assert errors == []
    assert plotly_src.startswith(server.url)  # served by the app itself, no CDN
    for name, metric in (("ttft", "ttft"), ("tpot", "tpot")):
        traces = [t for t in charts[name] if t["meta"] in ids]
        for trace, curve in zip(traces, curves, strict=True):
            assert trace["meta"] == curve.run_id and trace["colour"] == curve.colour
            assert trace["x"] == pytest.approx([p.latency(metric, "p99") for p in curve.points])
            assert trace["y"] == pytest.approx([p.output_tps_per_gpu for p in curve.points])
        # The stored SLO (p99_ttft_ms<=400) is drawn on the TTFT chart.
        assert [t["x"] for t in charts[name] if t["meta"] == "slo"] == (
            [[400, 400]] if metric == "ttft" else []
        )
    traces = [t for t in charts["interactivity"] if t["meta"] in ids]
    for trace, curve in zip(traces, curves, strict=True):
        assert trace["x"] == pytest.approx([p.interactivity for p in curve.points])
    assert {t["meta"] for t in charts["cost_interactivity"]} == set(ids)
    assert [t["colour"] for t in charts["cost"]] == ["#009E73", "#0072B2"]  # B200, H100
    assert traces[0]["name"].endswith("(simulated)")
    assert not traces[1]["name"].endswith("(simulated)")
    assert rows == sum(len(c.points) for c in curves)
    assert readout_rows == 2
    # The first run given is the reference; the sentence compares the other run against it.
    assert "B200-SXM" in reference
    assert sentence.index("H100-SXM") < sentence.index("B200-SXM")


def _page_overflow(page) -> int:
    """How many CSS pixels the page is wider than the viewport (0: no sideways scroll)."""
    return page.evaluate(
        "document.documentElement.scrollWidth - document.documentElement.clientWidth"
    )


def test_reference_swap_narrow_screen_and_resize(live):
    """At 390 px the runs and compare pages do not scroll sideways; after a resize every
    chart stays inside its box (none covers the table below); "make this the reference"
    swaps the baseline of the verdict."""
    server, db, ids = live
    with sync_playwright() as p:
        browser = launch(p)
        try:
            page = browser.new_page(viewport={"width": 390, "height": 844})
            page.goto(f"{server.url}/runs")
            runs_overflow = _page_overflow(page)
            page.screenshot(path=str(SCREENSHOTS / "runs-390.png"), full_page=True)
            # Tick H100 first, then B200: H100 becomes the reference.
            page.check(f"input[value='{ids[1]}']")
            page.check(f"input[value='{ids[0]}']")
            page.click("#compare-button")
            page.wait_for_selector("body[data-ready='1']", timeout=30_000)
            narrow_url = page.url
            compare_overflow = _page_overflow(page)
            page.screenshot(path=str(SCREENSHOTS / "compare-390.png"), full_page=True)
            ticked_ref = page.text_content("#run-list li:has(#reference-badge)")
            ticked_sentence = page.text_content("#sentence")

            page.click("a.swap")  # make the other run the reference
            page.wait_for_selector("body[data-ready='1']", timeout=30_000)
            swapped_ref = page.text_content("#run-list li:has(#reference-badge)")
            swapped_sentence = page.text_content("#sentence")

            page.set_viewport_size({"width": 1400, "height": 1000})
            page.wait_for_function(
                "document.getElementById('chart-cost').querySelector('.main-svg')"
                ".getAttribute('width') > 600",
                timeout=10_000,
            )
            boxes = page.evaluate(
                """() => Array.from(document.querySelectorAll('.chart')).map(div => {
                  const box = div.getBoundingClientRect();
                  const svg = div.querySelector('.main-svg').getBoundingClientRect();
                  return {id: div.id, inside: svg.right <= box.right + 1 && svg.bottom <= box.bottom + 1}
                })"""
            )
            table_top = page.evaluate(
                "document.getElementById('capacity-table').getBoundingClientRect().top"
            )
            cost_bottom = page.evaluate(
                "document.getElementById('chart-cost').getBoundingClientRect().bottom"
            )
        finally:
            browser.close()
    assert runs_overflow == 0 and compare_overflow == 0
    assert narrow_url.index(ids[1]) < narrow_url.index(ids[0])  # in the order ticked
    assert "H100-SXM" in ticked_ref
    assert ticked_sentence.index("B200-SXM") < ticked_sentence.index("H100-SXM")
    assert "B200-SXM" in swapped_ref
    assert swapped_sentence.index("H100-SXM") < swapped_sentence.index("B200-SXM")
    assert all(b["inside"] for b in boxes), boxes
    assert cost_bottom <= table_top


def test_run_page_and_start_form(live, fake_server):
    server, db, ids = live
    with sync_playwright() as p:
        browser = launch(p)
        try:
            page = browser.new_page(viewport={"width": 1300, "height": 900})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(f"{server.url}/runs/{ids[0]}")
            page.wait_for_selector("body[data-ready='1']", timeout=30_000)
            traces = page.evaluate(
                "['timeseries','cdf_ttft','errors'].map(n => "
                "document.getElementById('chart-' + n).data.length)"
            )
            page.screenshot(path=str(SCREENSHOTS / "run.png"), full_page=True)

            page.goto(f"{server.url}/new")
            page.fill(
                "textarea[name=scenario]",
                "load: {request_rate: 50, num_prompts: 12}\n"
                "workload: {input: {mean: 32}, output: {mean: 5}}",
            )
            page.fill("input[name=num_prompts]", "12")  # the form's fields override the YAML
            page.select_option("select[name=kind]", "run")
            page.uncheck("input[name=simulate]")
            page.fill("input[name=base_url]", fake_server.url)
            page.fill("input[name=label]", "from the form")
            page.fill("#token", TOKEN)
            page.click("#start")
            page.wait_for_selector("#job-status.completed", timeout=30_000)
            done = page.text_content("#job-text")
            link = page.get_attribute("#job-link a", "href")
        finally:
            browser.close()
    assert errors == []
    assert traces == [3, 4, 1]  # offered/achieved/P99 TTFT; 4 load points; one error kind
    assert "12 of 12 requests done" in done
    assert link and link.startswith("/runs/")


def test_chromium_is_debians():
    assert shutil.which("chromium") == CHROMIUM or Path(CHROMIUM).exists()


def test_api_docs_render_offline_from_vendored_swagger_ui(live):
    """/docs with every request that leaves the app blocked, as on a machine offline."""
    server, _, _ = live
    with sync_playwright() as p:
        browser = launch(p)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            outside: list[str] = []
            errors: list[str] = []

            def only_local(route):
                if route.request.url.startswith(server.url):
                    route.continue_()
                else:
                    outside.append(route.request.url)
                    route.abort()

            page.route("**/*", only_local)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(f"{server.url}/docs")
            page.wait_for_selector(".opblock-summary-path", timeout=30_000)
            paths = page.locator(".opblock-summary-path").all_text_contents()
            title = page.text_content(".information-container .title")
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SCREENSHOTS / "docs.png"), full_page=False)
        finally:
            browser.close()
    assert outside == [] and errors == []
    assert "/api/runs" in [p.replace("\u200b", "") for p in paths]
    assert title and "tokenbench" in title


LEGEND_BOXES = """() => Array.from(document.querySelectorAll('.chart')).map(div => {
  const legend = div.querySelector('.legend');
  const titles = Array.from(div.querySelectorAll('.xtitle, .ytitle'));
  const l = legend ? legend.getBoundingClientRect() : null;
  const overlaps = !l ? [] : titles.map(t => t.getBoundingClientRect()).filter(t =>
    t.left < l.right && l.left < t.right && t.top < l.bottom && l.top < t.bottom);
  const box = div.getBoundingClientRect();
  return {id: div.id, overlaps: overlaps.length,
          inside: !l || (l.bottom <= box.bottom + 1 && l.right <= box.right + 1)};
})"""


def test_six_runs_keep_their_legends_off_the_axis_titles(tmp_path):
    """Six labelled runs on the compare page at 1440 and 390 px: every legend sits below
    its chart's axis titles and inside its box (screenshots kept for a human look)."""
    from server.app import create_app
    from tests.helpers import store_sweep

    db = f"sqlite:///{tmp_path / 'six.db'}"
    gpus = ("B200-SXM", "H100-SXM", "H200-SXM", "B200-SXM", "H100-SXM", "MI300X")
    ids = [
        store_sweep(db, gpu=g, rates=(1, 2, 4, 8), seed=i, label=f"run {i + 1}: {g} tuned stack")
        for i, g in enumerate(gpus)
    ]
    server = LiveServer(create_app(db, api_token=TOKEN, allow_hosts=[], open_reads=True))
    results = {}
    try:
        with sync_playwright() as p:
            browser = launch(p)
            try:
                for width in (1440, 390):
                    page = browser.new_page(viewport={"width": width, "height": 1000})
                    page.goto(f"{server.url}/compare?" + "&".join(f"run={i}" for i in ids))
                    page.wait_for_selector("body[data-ready='1']", timeout=30_000)
                    results[width] = page.evaluate(LEGEND_BOXES)
                    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
                    page.screenshot(path=str(SCREENSHOTS / f"compare-6-runs-{width}.png"),
                                    full_page=True)  # fmt: skip
                    page.close()
            finally:
                browser.close()
    finally:
        server.stop()
    for width, boxes in results.items():
        assert boxes, width
        for b in boxes:
            assert b["overlaps"] == 0 and b["inside"], (width, b)

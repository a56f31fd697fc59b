"""Image export never claims a chart it did not write (kaleido stubbed: no browser needed)."""

from __future__ import annotations

import plotly.graph_objects as go
import plotly.io as pio
import pytest

from bench.export import images


@pytest.fixture
def two_charts(monkeypatch):
    monkeypatch.setattr(images, "find_browser", lambda: "/usr/bin/chromium")
    monkeypatch.setattr(
        images, "report_figures", lambda report: {"a": go.Figure(), "b": go.Figure()}
    )


def fake_batch(skip: str):
    """plotly's batch writer as kaleido behaved once under load: returns, one file unwritten."""

    def write_images(figs, paths, **kw) -> None:
        for path in paths:
            if path.stem != skip:
                path.write_text("<svg/>")

    return write_images


def test_a_chart_the_batch_skipped_is_written_on_its_own(two_charts, monkeypatch, tmp_path):
    monkeypatch.setattr(pio, "write_images", fake_batch(skip="b"))
    retried = []

    def write_image(fig, path, **kw) -> None:
        retried.append(path.name)
        path.write_text("<svg/>")

    monkeypatch.setattr(go.Figure, "write_image", write_image)
    paths = images.write_images(None, tmp_path, "svg")
    assert [p.name for p in paths] == ["a.svg", "b.svg"] and retried == ["b.svg"]
    assert all(p.read_text() == "<svg/>" for p in paths)


def test_a_chart_never_written_fails_the_export_naming_it(two_charts, monkeypatch, tmp_path):
    (tmp_path / "b.svg").write_text("<svg>from an earlier export</svg>")
    monkeypatch.setattr(pio, "write_images", fake_batch(skip="b"))
    monkeypatch.setattr(go.Figure, "write_image", lambda fig, path, **kw: None)
    with pytest.raises(images.ImageExportError, match=r"wrote no b\.svg"):
        images.write_images(None, tmp_path, "svg")

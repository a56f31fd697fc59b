"""The hardware catalogue sits below the simulator, pricing and planning (issue 24 item 5)."""

import ast
from pathlib import Path

from bench.hardware import get_gpu, interconnects, load_gpus

ROOT = Path(__file__).resolve().parent.parent


def test_hardware_imports_nothing_of_the_project() -> None:
    for path in (ROOT / "bench" / "hardware").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            bad = [n for n in names if n.startswith("bench") and not n.startswith("bench.hardware")]
            assert not bad, f"{path.name} imports {bad}: bench/hardware must stay below them"


def test_pricing_and_the_cli_read_gpus_from_the_catalogue() -> None:
    for rel in ("bench/cost.py", "bench/overrides.py"):
        text = (ROOT / rel).read_text()
        assert "from bench.hardware import" in text and "sim.profiles import get_gpu" not in text


def test_links_are_typed_once_and_named_by_gpus() -> None:
    links = interconnects()
    assert get_gpu("b200").scale_up_gbps == links["NVLink5"].gbps == 900
    assert get_gpu("h100").scale_up_gbps == links["NVLink4"].gbps
    assert get_gpu("l40s").scale_up_gbps == links["PCIe4"].gbps
    for gpu in load_gpus().values():
        assert gpu.scale_up in links and gpu.source, gpu.name

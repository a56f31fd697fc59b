"""deploy/kuberay's manifests, checked against KubeRay's own CRD schemas without a cluster.

The schemas are an excerpt of KubeRay's CRDs (source, version and commit recorded in
tests/data/kuberay/crd_excerpt.json, made by make_excerpt.py there). Checked as
`kubectl apply --validate=strict` would: unknown fields are errors (the API server would
drop them silently), as are wrong types and missing required fields. Also checked: the
entrypoint is a command line tokenbench accepts, and the Ray version is the same in the
manifests and the image recipe.
"""

from __future__ import annotations

import copy
import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

jsonschema = pytest.importorskip("jsonschema")  # the `test` extra

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy" / "kuberay"
EXCERPT = json.loads((ROOT / "tests" / "data" / "kuberay" / "crd_excerpt.json").read_text())
REGENERATE = "used a field the CRD excerpt left out: run tests/data/kuberay/make_excerpt.py"


def strict(schema: dict) -> dict:
    """KubeRay's structural schema with unknown fields refused, as --validate=strict does,
    and every field the excerpt left out refused with a message saying how to add it."""
    if schema.get("x-excerpt-pruned"):
        return {"not": {}, "description": REGENERATE}
    out = dict(schema)
    if "properties" in out:
        out["properties"] = {name: strict(sub) for name, sub in out["properties"].items()}
        if "additionalProperties" not in out and not out.get(
            "x-kubernetes-preserve-unknown-fields"
        ):
            out["additionalProperties"] = False
    for key in ("items", "additionalProperties"):
        if isinstance(out.get(key), dict):
            out[key] = strict(out[key])
    return out


VALIDATORS = {
    kind: jsonschema.Draft7Validator(strict(crd["schema"])) for kind, crd in EXCERPT["crds"].items()
}


def manifests() -> list[tuple[str, dict]]:
    return [(p.name, yaml.safe_load(p.read_text())) for p in sorted(DEPLOY.glob("*.yaml"))]


def errors(doc: dict) -> list[str]:
    crd = EXCERPT["crds"][doc["kind"]]
    found = []
    if doc.get("apiVersion") != f"{crd['group']}/{crd['version']}":
        found.append(f"apiVersion {doc.get('apiVersion')!r} is not {crd['group']}/{crd['version']}")
    for e in VALIDATORS[doc["kind"]].iter_errors(doc):
        found.append(f"{'.'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}")
    return found


def test_the_excerpt_says_where_it_came_from():
    assert EXCERPT["source"].startswith("https://github.com/ray-project/kuberay/tree/v")
    assert re.fullmatch(r"v\d+\.\d+\.\d+", EXCERPT["kuberay_version"])
    assert re.fullmatch(r"[0-9a-f]{40}", EXCERPT["commit"])
    assert {kind for _, doc in manifests() for kind in [doc["kind"]]} == {"RayCluster", "RayJob"}


@pytest.mark.parametrize("name, doc", manifests(), ids=[n for n, _ in manifests()])
def test_manifest_matches_kuberays_crd_schema(name, doc):
    assert errors(doc) == []


def test_the_check_catches_what_kubectl_would_refuse():
    cluster = dict(manifests())["raycluster.yaml"]
    typo = copy.deepcopy(cluster)
    typo["spec"]["workerGroupSpec"] = typo["spec"].pop("workerGroupSpecs")  # missing s
    assert any("workerGroupSpec" in e for e in errors(typo))
    wrong_type = copy.deepcopy(cluster)
    wrong_type["spec"]["workerGroupSpecs"][0]["replicas"] = "4"
    assert any("replicas" in e and "integer" in e for e in errors(wrong_type))
    missing = copy.deepcopy(cluster)
    del missing["spec"]["headGroupSpec"]["template"]["spec"]["containers"]
    assert any("containers" in e and "required" in e for e in errors(missing))
    unchecked = copy.deepcopy(cluster)
    unchecked["spec"]["headGroupSpec"]["template"]["spec"]["hostNetwork"] = True
    assert any("hostNetwork" in e for e in errors(unchecked))  # left out: refused, not waved by


def test_rayjob_entrypoint_is_a_command_line_tokenbench_accepts():
    import typer

    from bench.cli import app

    job = dict(manifests())["rayjob.yaml"]
    argv = shlex.split(job["spec"]["entrypoint"])
    assert argv[0] == "tokenbench" and argv[argv.index("--ray") + 1] == "auto"
    command = typer.main.get_command(app)
    sub = command.get_command(None, argv[1])
    ctx = sub.make_context(argv[1], argv[2:])  # raises on an unknown option or bad value
    assert ctx.params["workers"] > 1


def test_ray_version_is_one_fact_across_manifests_and_image():
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    (image_ray,) = re.findall(r"^ARG RAY_VERSION=(\S+)$", dockerfile, re.MULTILINE)
    for name, doc in manifests():
        spec = doc["spec"].get("rayClusterSpec", doc["spec"])
        assert spec["rayVersion"] == image_ray, name

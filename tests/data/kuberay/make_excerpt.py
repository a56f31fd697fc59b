"""Regenerate crd_excerpt.json: the parts of KubeRay's CRD schemas that deploy/kuberay's
manifests use, for tests/test_kuberay.py (the full CRDs are 2.3 MB).

    git clone https://github.com/ray-project/kuberay && git -C kuberay checkout v1.7.0
    python tests/data/kuberay/make_excerpt.py kuberay/ray-operator/config/crd/bases \
        v1.7.0 "$(git -C kuberay rev-parse HEAD)"

Every schema node on a path some manifest uses is kept whole (types, enums, required
fields, every property name), less descriptions and CEL rules (x-kubernetes-validations,
which jsonschema cannot run). A property no manifest uses is kept by name only, marked
"x-excerpt-pruned": the test rejects a manifest that starts to use it until this script
is run again, so nothing is ever checked against a schema the excerpt left out.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
MANIFESTS = HERE.parents[2] / "deploy" / "kuberay"
CRDS = {"RayCluster": "ray.io_rayclusters.yaml", "RayJob": "ray.io_rayjobs.yaml"}
CRD_DIR = "ray-operator/config/crd/bases"
KEEP_LEAF = ("type", "format", "anyOf", "x-kubernetes-int-or-string")
DROP = ("description", "x-kubernetes-validations")


def prune(schema: dict, values: list) -> dict:
    """`schema` cut down to what `values` (every manifest's value at this path) reach."""
    if not values:
        return {"x-excerpt-pruned": True, **{k: schema[k] for k in KEEP_LEAF if k in schema}}
    out = {k: v for k, v in schema.items() if k not in DROP}
    if "properties" in schema:
        out["properties"] = {
            name: prune(sub, [v[name] for v in values if isinstance(v, dict) and name in v])
            for name, sub in schema["properties"].items()
        }
    if isinstance(schema.get("items"), dict):
        items = [x for v in values if isinstance(v, list) for x in v]
        out["items"] = prune(schema["items"], items)
    if isinstance(schema.get("additionalProperties"), dict):
        entries = [x for v in values if isinstance(v, dict) for x in v.values()]
        out["additionalProperties"] = prune(schema["additionalProperties"], entries)
    return out


def main(crd_dir: Path, version: str, commit: str) -> None:
    manifests = [yaml.safe_load(p.read_text()) for p in sorted(MANIFESTS.glob("*.yaml"))]
    crds = {}
    for kind, filename in CRDS.items():
        crd = yaml.safe_load((crd_dir / filename).read_text())
        (served,) = [v for v in crd["spec"]["versions"] if v["storage"]]
        docs = [m for m in manifests if m["kind"] == kind]
        # A RayJob's rayClusterSpec is a RayCluster's spec: those uses count for both.
        if kind == "RayCluster":
            docs += [
                {"spec": m["spec"]["rayClusterSpec"]} for m in manifests if m["kind"] == "RayJob"
            ]
        crds[kind] = {
            "group": crd["spec"]["group"],
            "version": served["name"],
            "schema": prune(served["schema"]["openAPIV3Schema"], docs),
        }
    out = {
        "source": f"https://github.com/ray-project/kuberay/tree/{version}/{CRD_DIR}",
        "kuberay_version": version,
        "commit": commit,
        "made_by": "tests/data/kuberay/make_excerpt.py",
        "crds": crds,
    }
    (HERE / "crd_excerpt.json").write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3])

"""examples/ are valid as written: every object in the examples' namespace, the GpuShare spec
and the pods' gpushare annotations read by the same parsers the operator and webhook use.
tests/cluster/test_readme.py applies them to the demo cluster."""

from typing import Any

import yaml

from gpushare.api.gpushare_crd import parse_spec
from gpushare.api.names import ANN_CLASS, ANN_FRACTION, ANN_MEMORY, ANN_SHARE
from gpushare.api.quantities import parse_fraction, parse_memory
from gpushare.api.request import parse_class
from tests import REPO

EXAMPLES = REPO / "examples"
NS = "gpushare-examples"


def objects() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted(EXAMPLES.glob("*.yaml")):
        found += [(path.name, d) for d in yaml.safe_load_all(path.read_text()) if d]
    return found


def test_examples_hold_a_gpushare_a_training_job_and_an_inference_deployment() -> None:
    kinds = [d["kind"] for _, d in objects()]
    assert {"Namespace", "GpuShare", "Job", "Deployment", "Service"} <= set(kinds)
    for name, doc in objects():
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == NS, (name, doc["metadata"]["name"])


def test_gpushare_spec_and_pod_annotations_parse() -> None:
    shares = {d["metadata"]["name"]: d for _, d in objects() if d["kind"] == "GpuShare"}
    for share in shares.values():
        parse_spec(share["spec"])
    for _, doc in objects():
        if doc["kind"] not in ("Job", "Deployment"):
            continue
        ann = doc["spec"]["template"]["metadata"].get("annotations", {})
        if ANN_SHARE in ann:
            assert ann[ANN_SHARE] in shares, f"{doc['metadata']['name']}: unknown GpuShare"
        else:
            parse_fraction(ann[ANN_FRACTION], field=ANN_FRACTION)
            parse_memory(ann[ANN_MEMORY], field=ANN_MEMORY)
            parse_class(ann.get(ANN_CLASS))

"""values.schema.json: a wrong value stops `helm install` with a message naming the value."""

import json
from typing import Any

import pytest
import yaml

from gpushare.node.gpu.simulated import MODELS, parse_spec
from tests.fixtures.helm_chart import CHART, Chart


@pytest.mark.parametrize(
    ("values", "field", "words"),
    [
        ({"controller": {"polcy": "spread"}}, "/controller", "polcy"),
        ({"nodes": {"backend": "nvml"}}, "", "nodes"),
        ({"node": {"backend": "gpu"}}, "/node/backend", "pattern"),
        ({"node": {"backend": "simulated:"}}, "/node/backend", "pattern"),
        ({"controller": {"policy": "fastest"}}, "/controller/policy", "binpack"),
        ({"webhook": {"timeoutSeconds": 60}}, "/webhook/timeoutSeconds", "30"),
        ({"image": {"pullPolicy": "IfMissing"}}, "/image/pullPolicy", "IfNotPresent"),
        ({"node": {"mpsRoot": "run/gpushare"}}, "/node/mpsRoot", "pattern"),
        ({"node": {"mpsShm": "shared"}}, "/node/mpsShm", "private"),
        ({"controller": {"extender": {"port": 70000}}}, "/controller/extender/port", "65,535"),
        (
            {"controller": {"service": {"clusterIP": "my-service"}}},
            "/controller/service/clusterIP",
            "",
        ),
        ({"scheduler": {"replicas": 0}}, "/scheduler/replicas", "1"),
        ({"node": {"privileged": "yes"}}, "/node/privileged", "boolean"),
        ({"webhook": {"excludeNamespaces": ["Kube_System"]}}, "/webhook/excludeNamespaces/0", ""),
        ({"uninstall": {"timeoutSeconds": 1}}, "/uninstall/timeoutSeconds", "10"),
        # The controller has no flag for "no namespace excluded"; its default is kube-system.
        ({"webhook": {"excludeNamespaces": []}}, "/webhook/excludeNamespaces", "minItems"),
        ({"mode": "both"}, "/mode", "deviceplugin"),
        ({"dra": {"cdiDir": "run/cdi"}}, "/dra/cdiDir", "pattern"),
        (
            {"node": {"extraPools": [{"name": "DRA", "mode": "dra", "nodeSelector": {"a": "b"}}]}},
            "/node/extraPools/0/name",
            "pattern",
        ),
        (
            {"node": {"extraPools": [{"name": "dra", "mode": "dra", "nodeSelector": {}}]}},
            "/node/extraPools/0/nodeSelector",
            "minProperties",
        ),
    ],
)
def test_bad_value_is_refused_naming_it(
    chart: Chart, values: dict[str, Any], field: str, words: str
) -> None:
    error = chart.fails(values)
    assert "values don't meet the specifications of the schema" in error
    assert f"at '{field}'" in error, error
    assert words in error, error


def test_every_mapping_in_the_schema_is_closed() -> None:
    """additionalProperties: false wherever the chart defines the keys, so a typo is an error."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    open_maps = {"global", "affinity", "podSecurityContext", "updateStrategy"}

    def walk(node: dict[str, Any], path: str) -> None:
        if node.get("type") == "object" and "properties" in node:
            assert node.get("additionalProperties") is False, f"{path or '/'} is open"
            for key, sub in node["properties"].items():
                walk(sub, f"{path}/{key}")
        elif node.get("type") == "object" and path.rsplit("/", 1)[-1] not in open_maps:
            assert "additionalProperties" in node, f"{path} accepts anything"

    walk(schema, "")


def test_every_default_value_is_described_by_the_schema() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())

    def walk(values: dict[str, Any], node: dict[str, Any], path: str) -> None:
        props = node.get("properties")
        if props is None:
            return
        for key, value in values.items():
            assert key in props, f"{path}/{key} is in values.yaml but not in the schema"
            if isinstance(value, dict):
                walk(value, props[key], f"{path}/{key}")

    walk(defaults, schema, "")


@pytest.mark.parametrize("model", sorted(MODELS))
def test_schema_accepts_every_simulated_model_the_agent_knows(chart: Chart, model: str) -> None:
    spec = f"2x{model},1x{model}"
    assert parse_spec(spec), "the agent's own parser must accept it too"
    rendered = chart.render({"node": {"backend": f"simulated:{spec}"}})
    args = rendered.get("DaemonSet", "gpushare-node-agent")["spec"]["template"]["spec"][
        "containers"
    ][0]["args"]
    assert f"--backend=simulated:{spec}" in args

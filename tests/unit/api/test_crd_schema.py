"""The CRD file itself: what kubectl shows, and that its rules agree with the operator's parser.

The API server runs the schema's CEL rules; the operator runs ``parse_spec``. If they disagreed,
a spec the API server accepted would land in phase Failed (or a spec the operator could run
would be refused). The regular expressions in the rules use only syntax Python's ``re`` and
RE2 read the same way, so they are checked here against the parser on many inputs.
"""

import re
from functools import lru_cache
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gpushare.api.errors import InvalidInputError
from gpushare.api.gpushare_crd import (
    CRD_NAME,
    FRACTION_PATTERN,
    FRACTION_REQUIRED_FIX,
    KIND,
    LIMIT_PATTERN,
    MEMORY_PATTERN,
    PLURAL,
    inherited_annotations,
    parse_spec,
)
from gpushare.api.names import ANN_LIMIT, GROUP, VERSION
from tests import REPO

CRD_PATH = REPO / "crds" / "gpushare.io_gpushares.yaml"


@lru_cache(maxsize=1)
def _crd() -> dict[str, Any]:
    return dict(yaml.safe_load(CRD_PATH.read_text()))


def _version() -> dict[str, Any]:
    (version,) = _crd()["spec"]["versions"]
    return dict(version)


def _spec_props() -> dict[str, Any]:
    return dict(_version()["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"])


def _rule_regex(prop: str) -> re.Pattern[str]:
    rule = _spec_props()[prop]["x-kubernetes-validations"][0]["rule"]
    match = re.fullmatch(r"(?:self == 'auto' \|\| )?self\.matches\('(.*)'\)", rule)
    assert match, rule
    return re.compile(match.group(1))


def _cel_fraction_ok(text: str) -> bool:
    """The two fraction rules of the CRD, evaluated as the API server would."""
    if text == "auto":
        return "self == 'auto'" in _spec_props()["fraction"]["x-kubernetes-validations"][0]["rule"]
    if not _rule_regex("fraction").fullmatch(text):
        return False
    value = float(text.replace("%", ""))
    return 0 < value <= (100 if text.endswith("%") else 1)


def test_parser_uses_the_crd_patterns() -> None:
    assert _rule_regex("fraction").pattern == FRACTION_PATTERN
    assert _rule_regex("memory").pattern == MEMORY_PATTERN


def test_crd_names_match_the_api_module() -> None:
    crd = _crd()
    assert crd["metadata"]["name"] == CRD_NAME
    assert crd["spec"]["group"] == GROUP
    assert crd["spec"]["names"]["kind"] == KIND
    assert crd["spec"]["names"]["plural"] == PLURAL
    assert crd["spec"]["scope"] == "Namespaced"
    version = _version()
    assert version["name"] == VERSION
    assert version["subresources"] == {"status": {}}


def test_kubectl_get_shows_phase_fraction_request_class_policy_pods_age() -> None:
    columns = {c["name"]: c["jsonPath"] for c in _version()["additionalPrinterColumns"]}
    assert list(columns) == ["Phase", "Fraction", "Request", "Class", "Policy", "Pods", "Age"]
    assert columns["Request"] == ".status.request"  # what fraction auto came to
    status = _version()["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert status["request"]["type"] == "string"  # kept, not pruned, by the API server


def test_every_cel_rule_has_a_message_naming_its_field() -> None:
    def walk(node: Any, path: str) -> list[tuple[str, dict[str, Any]]]:
        found: list[tuple[str, dict[str, Any]]] = []
        if isinstance(node, dict):
            for rule in node.get("x-kubernetes-validations", []):
                found.append((path, rule))
            for key, value in node.get("properties", {}).items():
                found += walk(value, f"{path}.{key}" if path else key)
            if "items" in node:
                found += walk(node["items"], path)
        return found

    rules = walk(_version()["schema"]["openAPIV3Schema"], "")
    assert len(rules) >= 6
    for path, rule in rules:
        assert rule.get("message"), f"rule at {path} has no message"
        assert rule["message"].startswith(path), f"message at {path} does not name {path}"


@pytest.mark.parametrize(
    "text",
    ["0.25", ".5", "1", "1.0", "0.05", "25%", "100%", "7%", "0", "1.5", "0.125", "12.5%", "150%",
     "abc", "0.250", "2", "-0.5", "1e-1", " 0.5", "auto", "Auto", "auto%", " auto"],
)  # fmt: skip
def test_fraction_rule_and_parser_agree(text: str) -> None:
    try:
        parse_spec({"fraction": text})
        parser_ok = True
    except InvalidInputError:
        parser_ok = False
    assert _cel_fraction_ok(text) == parser_ok


@settings(deadline=None)
@given(st.from_regex(r"[0-9.%e -]{1,7}", fullmatch=True))
def test_fraction_rule_and_parser_agree_on_generated_text(text: str) -> None:
    try:
        parse_spec({"fraction": text})
        parser_ok = True
    except InvalidInputError:
        parser_ok = False
    assert _cel_fraction_ok(text) == parser_ok


@pytest.mark.parametrize(
    ("text", "ok"),
    [("10Gi", True), ("512Mi", True), ("8G", True), ("1073741824", True), ("1.5Gi", True),
     ("0Gi", False), ("10GB", False), ("ten", False), ("1e9", False)],
)  # fmt: skip
def test_memory_rules_and_parser_agree(text: str, ok: bool) -> None:
    rules = _spec_props()["memory"]["x-kubernetes-validations"]
    positive = re.compile(re.fullmatch(r"!self\.matches\('(.*)'\)", rules[1]["rule"]).group(1))  # type: ignore[union-attr]
    cel_ok = bool(_rule_regex("memory").fullmatch(text)) and not positive.fullmatch(text)
    try:
        parse_spec({"fraction": "0.5", "memory": text})
        parser_ok = True
    except InvalidInputError:
        parser_ok = False
    assert cel_ok == parser_ok == ok


def test_enums_and_ranges_match_the_parser() -> None:
    props = _spec_props()
    assert props["class"]["enum"] == ["latency", "batch"]
    profiling = props["profiling"]["properties"]
    assert profiling["mode"]["enum"] == ["auto", "skip", "always"]
    assert (profiling["windowSeconds"]["minimum"], profiling["windowSeconds"]["maximum"]) == (
        10,
        3600,
    )
    packing = props["packing"]["properties"]
    assert packing["policy"]["enum"] == ["cautious", "aggressive", "exclusive"]
    assert (packing["maxPodsPerGpu"]["minimum"], packing["maxPodsPerGpu"]["maximum"]) == (1, 48)


def _cel_limit_ok(text: str, fraction: str = "0.25") -> bool:
    """The CRD's limit rules (format, range, at least the fraction), as the API server runs
    them."""
    if not _rule_regex("limit").fullmatch(text):
        return False
    value = float(text.replace("%", ""))
    if not 0 < value <= (100 if text.endswith("%") else 1):
        return False
    as_gpu = value / 100 if text.endswith("%") else value
    share = float(fraction.replace("%", "")) / (100 if fraction.endswith("%") else 1)
    return as_gpu >= share


def test_parser_uses_the_crd_limit_pattern() -> None:
    assert _rule_regex("limit").pattern == LIMIT_PATTERN
    (cross,) = [
        r for r in _version()["schema"]["openAPIV3Schema"]["properties"]["spec"][
            "x-kubernetes-validations"
        ] if "self.limit.matches" in r["rule"]
    ]  # fmt: skip
    assert LIMIT_PATTERN in cross["rule"] and FRACTION_PATTERN in cross["rule"]


@pytest.mark.parametrize(
    "text",
    ["0.5", ".5", "1", "1.0", "1.00", "50%", "100%", "25%", "0.25", "0.2", "0", "0%", "1.5",
     "150%", "0.125", "abc", " 0.5", "2", "-0.5", "0.50%"],
)  # fmt: skip
def test_limit_rules_and_parser_agree(text: str) -> None:
    try:
        spec = parse_spec({"fraction": "0.25", "limit": text})
        parser_ok = True
    except InvalidInputError:
        parser_ok = False
    assert _cel_limit_ok(text) == parser_ok
    if parser_ok:
        assert inherited_annotations(spec, share_name="s")[ANN_LIMIT] == text


@settings(deadline=None)
@given(st.from_regex(r"[0-9.%]{1,5}", fullmatch=True), st.sampled_from(["0.1", "0.5", "1", "60%"]))
def test_limit_rules_and_parser_agree_on_generated_text(text: str, fraction: str) -> None:
    try:
        parse_spec({"fraction": fraction, "limit": text})
        parser_ok = True
    except InvalidInputError:
        parser_ok = False
    assert _cel_limit_ok(text, fraction) == parser_ok


def test_fraction_auto_refuses_a_limit_and_skipped_profiling_in_the_crd_and_the_parser() -> None:
    rules = {
        r["fieldPath"]: r
        for r in _version()["schema"]["openAPIV3Schema"]["properties"]["spec"][
            "x-kubernetes-validations"
        ]
        if "'auto'" in r["rule"]
    }  # fmt: skip
    assert set(rules) == {".limit", ".profiling.mode"}
    with pytest.raises(InvalidInputError, match=r"spec\.limit.*fraction auto"):
        parse_spec({"fraction": "auto", "limit": "0.5"})
    with pytest.raises(InvalidInputError, match=r"spec\.profiling\.mode.*without a profile"):
        parse_spec({"fraction": "auto", "profiling": {"mode": "skip"}})
    # a latency share is sized without a profile, so it may skip profiling
    assert parse_spec({"fraction": "auto", "class": "latency", "profiling": {"mode": "skip"}}).auto


def test_a_missing_fraction_is_told_in_the_projects_words_by_the_crd_and_the_parser() -> None:
    """Not by `required`: the API server would word it "Required value" and skip every rule
    ("some validation rules were not checked"). Every other spec rule reading self.fraction
    first checks it is there, so none fails to evaluate."""
    spec = _version()["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert "fraction" not in spec.get("required", [])
    first, *others = spec["x-kubernetes-validations"]
    assert first["rule"] == "has(self.fraction)" and first["fieldPath"] == ".fraction"
    assert (
        " ".join(first["message"].split()) == f"spec.fraction is required: {FRACTION_REQUIRED_FIX}"
    )
    for rule in others:
        if "self.fraction" in rule["rule"]:
            assert "!has(self.fraction) ||" in rule["rule"], rule["rule"]
    with pytest.raises(InvalidInputError) as caught:
        parse_spec({"memory": "1Gi"})
    assert str(caught.value) == f"spec.fraction: is required; {FRACTION_REQUIRED_FIX}"

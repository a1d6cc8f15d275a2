"""Parsing is total: the hostile values that froze the controller's pod watch (issue: decimal
overflow, the int-digit limit of json, deep JSON, formatting huge byte counts) are refused
naming the field, and the view keeps serving around a poison pod."""

import json
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from gpushare.api.bounds import MAX_BYTES, bounded_int, json_depth, load_json
from gpushare.api.errors import InvalidInputError
from gpushare.api.exclusive import load_exclusive, parse_avoid_gpus
from gpushare.api.gpushare_crd import ANN_PROFILE, parse_profile_annotation
from gpushare.api.inventory import load_inventory
from gpushare.api.names import ANN_FRACTION, ANN_GPU_UUID, ANN_MEMORY, ANN_MEMORY_LIMIT
from gpushare.api.placement import Placement, parse_placement
from gpushare.api.quantities import format_memory, parse_fraction, parse_memory
from gpushare.cluster.state.view import ClusterView
from gpushare.cluster.webhook.review import BadReviewError, parse_review
from gpushare.node.deviceplugin.devices import parse_device_id
from tests.fixtures.builders import GIB, gpu, node_json, pod_json


@pytest.mark.parametrize(
    "text", ["1e999999999", "-1e999999999", "1E+999999999", "9" * 5000, "0." + "0" * 5000 + "1"]
)
def test_fraction_out_of_any_range_is_refused_naming_the_annotation(text: str) -> None:
    with pytest.raises(InvalidInputError) as err:
        parse_fraction(text, field=ANN_FRACTION)
    assert err.value.field == ANN_FRACTION
    assert len(str(err.value)) < 300  # the message does not echo 5000 digits


@pytest.mark.parametrize("text", ["\u0663", "\u0660.5", "1_0", "0.2_5", "2\u00b2"])
def test_fraction_in_digits_other_readers_would_not_agree_on_is_refused(text: str) -> None:
    """Decimal reads an Arabic-Indic three as 3 (three GPUs) and "1_0" as 10."""
    with pytest.raises(InvalidInputError, match="is not a number") as err:
        parse_fraction(text, field=ANN_FRACTION)
    assert err.value.field == ANN_FRACTION


@pytest.mark.parametrize("text", ["9" * 5000, "99999999999999999999Gi", "2Ei"])
def test_memory_beyond_an_exbibyte_is_refused(text: str) -> None:
    with pytest.raises(InvalidInputError) as err:
        parse_memory(text, field=ANN_MEMORY)
    assert err.value.field == ANN_MEMORY


def test_huge_byte_counts_format_without_the_digit_limit() -> None:
    assert format_memory(10**5000).startswith("more than")
    assert format_memory(80 * GIB) == "80Gi"
    assert parse_memory("1Ei", field=ANN_MEMORY) == MAX_BYTES


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("[" * 5000 + "]" * 5000, "nested"),
        ('{"gpuModel":"H100","memoryBytes":' + "9" * 5000 + "}", "digits"),
        ('{"gpuModel":"H100","fp16":NaN}', "JSON"),
        ('{"gpuModel":"H100","fp16":1e999}', "finite"),
        ("x" * 100_000, "characters"),
    ],
)
def test_profile_annotation_json_is_bounded(text: str, why: str) -> None:
    with pytest.raises(InvalidInputError) as err:
        parse_profile_annotation(text)
    assert err.value.field == ANN_PROFILE
    assert why in str(err.value)


def test_json_depth_skips_brackets_inside_strings() -> None:
    assert json_depth(json.dumps({"a": "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["})) == 1
    assert json_depth(json.dumps({"a": '\\"[[[[[[[[[[[[[[[[[[[[[[[[[[['})) == 1
    assert json_depth("[" * 40 + "]" * 40) == 40
    assert load_json('{"k": [1, 2.5, "x"]}', field="f", fix="x") == {"k": [1, 2.5, "x"]}


def test_inventory_and_marks_refuse_hostile_numbers() -> None:
    fix_word = "node agent"
    for text in (
        '[{"uuid":"GPU-x","index":' + "9" * 5000 + ',"model":"m","memory_bytes":1}]',
        '[{"uuid":"GPU-x","index":0,"model":"m","memory_bytes":' + "9" * 30 + "}]",
        "[" * 5000,
    ):
        with pytest.raises(InvalidInputError, match=fix_word):
            load_inventory(text)
    with pytest.raises(InvalidInputError):
        load_exclusive('[{"uid":"w","faults":' + "9" * 4500 + "}]")
    with pytest.raises(InvalidInputError):
        parse_avoid_gpus("GPU-" + "a" * 100_000)


def test_placement_numbers_are_bounded() -> None:
    base = {ANN_GPU_UUID: "GPU-a"}
    for key, value in ((ANN_MEMORY_LIMIT, "9" * 5000), (ANN_MEMORY_LIMIT, str(2**70))):
        with pytest.raises(InvalidInputError) as err:
            parse_placement({**base, key: value})
        assert err.value.field == key
    with pytest.raises(InvalidInputError):
        parse_placement({ANN_GPU_UUID: ",".join(["GPU-a"] * 65)})


@pytest.mark.parametrize("device", ["GPU-a::\u0663", "GPU-a::" + "9" * 5000, "GPU-a::100"])
def test_device_ids_are_ascii_two_digit_slices(device: str) -> None:
    with pytest.raises(InvalidInputError):
        parse_device_id(device)


def test_webhook_body_with_deep_json_or_huge_numbers_is_a_bad_request() -> None:
    for body in (b"[" * 100_000, b'{"kind":' + b"9" * 5000 + b"}", b'{"a": NaN}'):
        with pytest.raises(BadReviewError):
            parse_review(body)


def test_a_poison_pod_neither_raises_nor_stops_the_view_counting_others() -> None:
    placed = Placement(("GPU-a",), 50, 10 * GIB, datetime.now(UTC), "allocated")
    view = ClusterView()
    view.replace_nodes([node_json("n0", [gpu("GPU-a")])])
    view.replace_pods([pod_json("good", fraction="0.5", node="n0", placement=placed)])
    poison = [
        {ANN_FRACTION: "1e999999999"},
        {ANN_FRACTION: "0.5", ANN_PROFILE: '{"gpuModel":"x","memoryBytes":' + "9" * 5000 + "}"},
        {ANN_FRACTION: "0.5", ANN_PROFILE: "[" * 100_000},
        {ANN_FRACTION: "0.5", ANN_MEMORY: "9" * 5000},
    ]
    for i, ann in enumerate(poison):
        # Patched after admission onto a placed pod: it holds what its placement says.
        pod = pod_json(
            f"bad{i}", annotations=ann, node="n0", placement=replace(placed, thread_percent=10)
        )
        got = view.upsert_pod(pod)
        assert got is not None and got.placement is not None
    gpu_a = view.gpu("GPU-a")
    assert gpu_a is not None
    # The good pod 50; a pod whose request cannot be read holds its placement's 10; a pod whose
    # profile cannot be read keeps its request (50) and is refused by the extender when placed.
    held = {t.key: t.percent for t in gpu_a.tenants}
    assert held == {
        "default/good": 50,
        "default/bad0": 10,
        "default/bad1": 50,
        "default/bad2": 50,
        "default/bad3": 10,
    }
    view.delete_pod("default/good")
    assert gpu_a.used_percent == 120
    assert view.synced


def test_bounded_int_names_the_field() -> None:
    with pytest.raises(InvalidInputError, match="f: '99999"):
        bounded_int("9" * 30, field="f", fix="x", low=0, high=10)
    assert bounded_int(" 7 ", field="f", fix="x", low=0, high=10) == 7

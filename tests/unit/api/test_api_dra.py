"""The opaque MpsConfig a ResourceClaim passes to gpu.gpushare.io: strict and total."""

from typing import Any

import pytest

from gpushare.api.dra import CONFIG_API_VERSION, CONFIG_KIND, MpsConfig, parse_mps_config
from gpushare.api.errors import InvalidInputError

BASE = {"apiVersion": CONFIG_API_VERSION, "kind": CONFIG_KIND}


def test_a_config_with_only_its_type_means_batch_without_a_limit() -> None:
    assert parse_mps_config(dict(BASE), field="p") == MpsConfig(gpu_class="batch", limit=None)


def test_class_and_limit_are_read() -> None:
    config = parse_mps_config({**BASE, "class": "latency", "limit": 60}, field="p")
    assert config == MpsConfig(gpu_class="latency", limit=60)


@pytest.mark.parametrize(
    ("parameters", "field"),
    [
        ("not an object", "p"),
        ({**BASE, "apiVersion": "gpushare.io/v2"}, "p.apiVersion"),
        ({**BASE, "kind": "Other"}, "p.kind"),
        ({**BASE, "class": "realtime"}, "p.class"),
        ({**BASE, "limit": 0}, "p.limit"),
        ({**BASE, "limit": 101}, "p.limit"),
        ({**BASE, "limit": True}, "p.limit"),
        ({**BASE, "limit": "50"}, "p.limit"),
        ({**BASE, "priority": 0}, "p.priority"),
    ],
)
def test_hostile_configs_are_refused_naming_the_field(parameters: Any, field: str) -> None:
    with pytest.raises(InvalidInputError) as caught:
        parse_mps_config(parameters, field="p")
    assert caught.value.field == field

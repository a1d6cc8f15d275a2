"""CDI nodes (issue #66, GPU Operator >= v25.10): the GPU's NVIDIA CDI device name in the
device plugin's Allocate answer and in a prepared claim's CDI IDs, found from the node's CDI
specs (by UUID, else index), or from the kind an admin names; bad specs and bad flags refused
without breaking an answer."""

import json
import os
from pathlib import Path

import pytest
import yaml

from gpushare.api.errors import InvalidInputError
from gpushare.node.core.answer import AllocationContext, mps_allocation, whole_allocation
from gpushare.node.core.vendor_cdi import VendorCdi, parse_mode
from gpushare.node.deviceplugin.server import to_proto
from gpushare.node.dra.claims import ClaimRef
from gpushare.node.main import build_parser
from gpushare.node.mps.manager import MpsManager
from tests.fixtures.builders import gpu
from tests.unit.node.dra.helpers import FakeClaims, backend, claim, make_driver, mps_config

A = gpu("GPU-aaaaaaaa-1111-2222-3333-444444444444", index=0)
B = gpu("GPU-bbbbbbbb-1111-2222-3333-444444444444", index=1)


def toolkit_spec(names: list[str], kind: str = "nvidia.com/gpu") -> dict[str, object]:
    """A spec shaped like the NVIDIA container toolkit's (one device per name)."""
    return {
        "cdiVersion": "0.5.0",
        "kind": kind,
        "devices": [
            {"name": n, "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}}
            for n in names
        ],
        "containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES=void"]},
    }


def ctx(tmp_path: Path, vendor: VendorCdi | None) -> AllocationContext:
    return AllocationContext(
        node_name="n",
        gpus={A.uuid: A, B.uuid: B},
        mps=MpsManager(root=tmp_path / "mps", simulated=True),
        vendor_cdi=vendor,
    )


def test_a_gpu_named_by_uuid_in_the_toolkits_spec_goes_into_allocates_answer(
    tmp_path: Path,
) -> None:
    (tmp_path / "nvidia.yaml").write_text(yaml.safe_dump(toolkit_spec([A.uuid, B.uuid, "all"])))
    vendor = VendorCdi("auto", dirs=[tmp_path])
    shared = mps_allocation(
        ctx(tmp_path, vendor),
        A.uuid,
        thread_percent=25,
        memory_limit_bytes=1 << 30,
        gpu_class="batch",
        pod="ns/p",
    )
    assert shared.cdi_devices == (f"nvidia.com/gpu={A.uuid}",)
    answer = to_proto(shared)
    assert [d.name for d in answer.cdi_devices] == [f"nvidia.com/gpu={A.uuid}"]
    assert answer.envs["CUDA_VISIBLE_DEVICES"] == A.uuid  # the MPS answer is unchanged
    whole = whole_allocation(ctx(tmp_path, vendor), [A.uuid, B.uuid], pod=None)
    assert whole.cdi_devices == (f"nvidia.com/gpu={A.uuid}", f"nvidia.com/gpu={B.uuid}")


def test_index_names_a_specs_written_later_and_other_kinds(tmp_path: Path) -> None:
    vendor = VendorCdi("auto", dirs=[tmp_path / "etc", tmp_path / "run"])
    assert vendor.names(A) == ()  # no spec yet: the environment alone, as before
    (tmp_path / "run").mkdir()
    spec = tmp_path / "run" / "nvidia.json"
    spec.write_text(json.dumps(toolkit_spec(["0", "1", "all"])))
    assert vendor.names(A) == ("nvidia.com/gpu=0",)
    assert vendor.names(B) == ("nvidia.com/gpu=1",)
    # Another vendor's kind and gpushare's own claim specs are never taken.
    spec.write_text(json.dumps(toolkit_spec(["0"], kind="k8s.device-plugin.nvidia.com/gpu")))
    os.utime(spec, ns=(1, 1))
    (tmp_path / "run" / "gpushare.io-gpu_claim-x.json").write_text(
        json.dumps(toolkit_spec([A.uuid]))
    )
    assert vendor.names(A) == ()


def test_unreadable_specs_are_skipped_and_the_answer_still_comes(tmp_path: Path) -> None:
    (tmp_path / "broken.yaml").write_text("kind: [unclosed")
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "nokind.yaml").write_text("devices: []")
    (tmp_path / "huge.json").write_bytes(b" " * ((4 << 20) + 1))
    (tmp_path / "good.yaml").write_text(yaml.safe_dump(toolkit_spec([B.uuid])))
    vendor = VendorCdi("auto", dirs=[tmp_path])
    assert vendor.names(B) == (f"nvidia.com/gpu={B.uuid}",)
    assert vendor.names(A) == ()


def test_a_named_kind_or_off_need_no_spec(tmp_path: Path) -> None:
    assert VendorCdi("nvidia.com/gpu", dirs=[tmp_path]).names(A) == (f"nvidia.com/gpu={A.uuid}",)
    (tmp_path / "nvidia.yaml").write_text(yaml.safe_dump(toolkit_spec([A.uuid])))
    assert VendorCdi("off", dirs=[tmp_path]).names(A) == ()
    assert whole_allocation(ctx(tmp_path, None), [A.uuid], pod=None).cdi_devices == ()


def test_a_bad_mode_is_refused_naming_the_flag() -> None:
    for bad in ("yes", "nvidia.com", "/gpu", "a b/c", "x" * 300):
        with pytest.raises(InvalidInputError, match="--vendor-cdi"):
            parse_mode(bad)
    assert build_parser().parse_args(["--node-name", "n"]).vendor_cdi == "auto"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--node-name", "n", "--vendor-cdi", "on"])


def test_a_prepared_claim_names_its_gpus_nvidia_device_after_its_own(tmp_path: Path) -> None:
    uid = "0b1c2d3e-0000-4000-8000-000000000009"
    shared = claim(uid=uid, consumed={"gpuPercent": "25", "memory": "20Gi"}, config=mps_config())
    driver = make_driver(tmp_path, FakeClaims(shared))
    uuid = backend().inventory()[0].uuid
    driver.vendor_cdi = VendorCdi("nvidia.com/gpu")
    record = driver.prepare(ClaimRef(namespace="ns", uid=uid, name="c1"))
    assert record.cdi_ids == (f"gpushare.io/gpu=claim-{uid}",)  # the checkpoint's: gpushare's
    assert driver.cdi_ids(record) == [f"gpushare.io/gpu=claim-{uid}", f"nvidia.com/gpu={uuid}"]

"""The DRA plugin over real unix sockets, as the kubelet sees it: registration, then
NodePrepareResources / NodeUnprepareResources on the socket the registration names."""

import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from gpushare.api.dra import DRIVER
from gpushare.node.core.serving import RestartLoop
from gpushare.node.dra.cdi import CdiDir
from gpushare.node.dra.driver import DraDriver
from gpushare.node.dra.plugin import DraPluginSockets
from gpushare.node.dra.pluginregistration.v1 import api_pb2 as reg_pb2
from gpushare.node.dra.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from gpushare.node.dra.server import DraPluginV1, DraPluginV1beta1
from gpushare.node.dra.v1 import api_pb2 as v1_pb2
from gpushare.node.dra.v1 import api_pb2_grpc as v1_grpc
from gpushare.node.dra.v1beta1 import api_pb2 as v1beta1_pb2
from gpushare.node.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from tests.unit.node.dra.helpers import NODE, FakeClaims, claim, make_driver

GOOD = "0b1c2d3e-0000-4000-8000-000000000001"
BAD = "0b1c2d3e-0000-4000-8000-000000000002"


class Served:
    def __init__(
        self, root: Path, kubelet_root: Path, runner: DraPluginSockets, driver: DraDriver
    ) -> None:
        self.root = root
        self.kubelet_root = kubelet_root
        self.runner = runner
        self.driver = driver

    def channel(self, path: Path) -> grpc.Channel:
        return grpc.insecure_channel(f"unix://{path}")

    def info(self) -> reg_pb2.PluginInfo:
        with self.channel(self.runner.registration_path) as channel:
            return reg_grpc.RegistrationStub(channel).GetInfo(reg_pb2.InfoRequest(), timeout=5)


@pytest.fixture
def kubelet_root() -> Iterator[Path]:
    """A short directory: a unix socket path may not exceed 107 characters."""
    root = Path(tempfile.mkdtemp(prefix="dra-"))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def served(tmp_path: Path, kubelet_root: Path) -> Iterator[Served]:
    claims = FakeClaims(
        claim(uid=GOOD, name="good", consumed={"gpuPercent": "40"}),
        claim(uid=BAD, name="bad", driver="other.example.com"),
    )
    driver = make_driver(tmp_path, claims)
    runner = DraPluginSockets(
        make_servicers=lambda: (DraPluginV1(driver), DraPluginV1beta1(driver)),
        kubelet_root=kubelet_root,
    )
    # A socket file left by an earlier agent must not stop the plugin from serving.
    runner.socket_path.parent.mkdir(parents=True)
    runner.socket_path.write_text("stale")
    stop = threading.Event()
    loop = RestartLoop([runner], poll_s=0.05)
    thread = threading.Thread(target=loop.run, args=(stop,), daemon=True)
    thread.start()
    assert runner.serving.wait(10), "the plugin never served"
    try:
        yield Served(tmp_path, kubelet_root, runner, driver)
    finally:
        stop.set()
        thread.join(10)
    assert not runner.socket_path.exists() and not runner.registration_path.exists()


def test_registration_names_the_driver_its_socket_and_both_api_versions(served: Served) -> None:
    info = served.info()
    assert info.type == "DRAPlugin"
    assert info.name == DRIVER
    assert info.endpoint == str(served.kubelet_root / "plugins" / DRIVER / "dra.sock")
    assert list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    assert served.runner.registration_path == (
        served.kubelet_root / "plugins_registry" / f"{DRIVER}-reg.sock"
    )


def test_the_kubelets_registration_status_is_recorded(served: Served) -> None:
    with served.channel(served.runner.registration_path) as channel:
        stub = reg_grpc.RegistrationStub(channel)
        stub.NotifyRegistrationStatus(
            reg_pb2.RegistrationStatus(plugin_registered=False, error="version"), timeout=5
        )
        assert served.runner.registration is not None
        assert served.runner.registration.last_error == "version"
        stub.NotifyRegistrationStatus(reg_pb2.RegistrationStatus(plugin_registered=True))
    assert served.runner.registration.registered.is_set()


def test_prepare_answers_each_claim_and_a_bad_one_fails_alone(served: Served) -> None:
    with served.channel(Path(served.info().endpoint)) as channel:
        stub = v1_grpc.DRAPluginStub(channel)
        response = stub.NodePrepareResources(
            v1_pb2.NodePrepareResourcesRequest(
                claims=[
                    v1_pb2.Claim(namespace="ns", uid=GOOD, name="good"),
                    v1_pb2.Claim(namespace="ns", uid=BAD, name="bad"),
                ]
            ),
            timeout=5,
        )
        good, bad = response.claims[GOOD], response.claims[BAD]
        assert good.error == ""
        (device,) = good.devices
        assert (device.pool_name, device.device_name) == (NODE, "gpu-0")
        assert list(device.request_names) == ["gpu"]
        assert list(device.cdi_device_ids) == [f"gpushare.io/gpu=claim-{GOOD}"]
        assert f"allocates no device of driver {DRIVER}" in bad.error
        assert not bad.devices
        # The server survived the bad claim and answers the same again (from its record).
        again = stub.NodePrepareResources(
            v1_pb2.NodePrepareResourcesRequest(
                claims=[v1_pb2.Claim(namespace="ns", uid=GOOD, name="good")]
            ),
            timeout=5,
        )
        assert again.claims[GOOD] == good


def test_the_v1beta1_service_gives_the_same_answers(served: Served) -> None:
    with served.channel(served.runner.socket_path) as channel:
        stub = v1beta1_grpc.DRAPluginStub(channel)
        claims = [v1beta1_pb2.Claim(namespace="ns", uid=GOOD, name="good")]
        prepared = stub.NodePrepareResources(
            v1beta1_pb2.NodePrepareResourcesRequest(claims=claims), timeout=5
        )
        assert list(prepared.claims[GOOD].devices[0].cdi_device_ids) == [
            f"gpushare.io/gpu=claim-{GOOD}"
        ]
        unprepared = stub.NodeUnprepareResources(
            v1beta1_pb2.NodeUnprepareResourcesRequest(claims=claims), timeout=5
        )
        assert unprepared.claims[GOOD].error == ""


def test_unprepare_removes_the_cdi_spec_and_is_idempotent(served: Served) -> None:
    cdi = CdiDir(served.root / "cdi")
    with served.channel(served.runner.socket_path) as channel:
        stub = v1_grpc.DRAPluginStub(channel)
        claims = [v1_pb2.Claim(namespace="ns", uid=GOOD, name="good")]
        stub.NodePrepareResources(v1_pb2.NodePrepareResourcesRequest(claims=claims), timeout=5)
        assert cdi.exists(GOOD)
        for _ in range(2):
            response = stub.NodeUnprepareResources(
                v1_pb2.NodeUnprepareResourcesRequest(claims=claims), timeout=5
            )
            assert GOOD in response.claims
            assert response.claims[GOOD].error == ""
        assert not cdi.exists(GOOD)
        assert served.driver.prepared() == {}


def test_a_removed_registration_socket_is_served_again(served: Served) -> None:
    served.runner.registration_path.unlink()
    deadline = time.monotonic() + 10
    while served.runner.starts < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert served.runner.starts == 2
    assert served.runner.serving.wait(5)
    assert served.info().name == DRIVER

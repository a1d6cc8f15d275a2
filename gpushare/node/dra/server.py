"""The gRPC servicers of the kubelet DRA plugin: DRAPlugin (v1 and v1beta1, one
implementation) and the plugin registration service.

Every claim of a request gets an entry in the response: its devices with their CDI IDs, or an
error the kubelet shows on the pod. A failing claim never fails the call or the server.
"""

import logging
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any, ClassVar

import grpc

from gpushare.api.dra import DRIVER
from gpushare.api.errors import InvalidInputError
from gpushare.node.core.answer import AllocationError
from gpushare.node.dra.claims import ClaimRef
from gpushare.node.dra.driver import DraDriver
from gpushare.node.dra.pluginregistration.v1 import api_pb2 as reg_pb2
from gpushare.node.dra.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from gpushare.node.dra.v1 import api_pb2 as v1_pb2
from gpushare.node.dra.v1 import api_pb2_grpc as v1_grpc
from gpushare.node.dra.v1beta1 import api_pb2 as v1beta1_pb2
from gpushare.node.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc

log = logging.getLogger(__name__)

PLUGIN_TYPE = "DRAPlugin"
SUPPORTED_SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
"""What the registration lists, newest first: the kubelet 1.34 picks v1, older ones v1beta1."""


USER_ERRORS = (InvalidInputError, AllocationError)
"""Refusals the user can fix, shown as they are; anything else is an internal error."""


def _message(exc: Exception) -> str:
    if isinstance(exc, USER_ERRORS):
        return str(exc)
    return f"internal error in the {DRIVER} plugin: {type(exc).__name__}: {exc}"


def _prepare(driver: DraDriver, claims: Iterable[Any], response: Any) -> Any:
    """Fill a NodePrepareResourcesResponse of either version; the response."""
    for claim in claims:
        ref = ClaimRef(namespace=claim.namespace, uid=claim.uid, name=claim.name)
        entry = response.claims[claim.uid]
        try:
            record = driver.prepare(ref)
        except Exception as exc:
            if not isinstance(exc, USER_ERRORS):
                log.exception("preparing claim %s failed", ref.key)
            else:
                log.warning("claim %s refused: %s", ref.key, exc)
            driver.failed_total += 1
            entry.error = _message(exc)
            continue
        for device in record.devices:
            entry.devices.add(
                request_names=[device.request] if device.request else [],
                pool_name=device.pool,
                device_name=device.device,
                cdi_device_ids=driver.cdi_ids(record),
            )
    return response


def _unprepare(driver: DraDriver, claims: Iterable[Any], response: Any) -> Any:
    """Fill a NodeUnprepareResourcesResponse of either version; the response."""
    for claim in claims:
        entry = response.claims[claim.uid]
        try:
            driver.unprepare(claim.uid)
        except Exception as exc:
            log.exception("unpreparing claim %s/%s failed", claim.namespace, claim.name)
            entry.error = _message(exc)
    return response


class _DraPlugin:
    """DRAPlugin of either version: the same messages under another package (``_pb2``)."""

    _pb2: ClassVar[Any]

    def __init__(self, driver: DraDriver) -> None:
        self.driver = driver

    def NodePrepareResources(  # noqa: N802  (gRPC method name)
        self, request: Any, context: grpc.ServicerContext
    ) -> Any:
        return _prepare(self.driver, request.claims, self._pb2.NodePrepareResourcesResponse())

    def NodeUnprepareResources(  # noqa: N802  (gRPC method name)
        self, request: Any, context: grpc.ServicerContext
    ) -> Any:
        return _unprepare(self.driver, request.claims, self._pb2.NodeUnprepareResourcesResponse())


class DraPluginV1(_DraPlugin, v1_grpc.DRAPluginServicer):
    """``k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin``."""

    _pb2: ClassVar[Any] = v1_pb2


class DraPluginV1beta1(_DraPlugin, v1beta1_grpc.DRAPluginServicer):
    """``k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin`` (kubelets before 1.34)."""

    _pb2: ClassVar[Any] = v1beta1_pb2


class RegistrationServicer(reg_grpc.RegistrationServicer):
    """Answers the kubelet's plugin watcher: who we are and where the DRA service is."""

    def __init__(self, *, endpoint: Path) -> None:
        self.endpoint = endpoint
        self.registered = threading.Event()
        self.last_error = ""

    def GetInfo(  # noqa: N802  (gRPC method name)
        self, request: reg_pb2.InfoRequest, context: grpc.ServicerContext
    ) -> reg_pb2.PluginInfo:
        return reg_pb2.PluginInfo(
            type=PLUGIN_TYPE,
            name=DRIVER,
            endpoint=str(self.endpoint),
            supported_versions=list(SUPPORTED_SERVICES),
        )

    def NotifyRegistrationStatus(  # noqa: N802  (gRPC method name)
        self, request: reg_pb2.RegistrationStatus, context: grpc.ServicerContext
    ) -> reg_pb2.RegistrationStatusResponse:
        if request.plugin_registered:
            self.last_error = ""
            self.registered.set()
            log.info("the kubelet registered DRA driver %s at %s", DRIVER, self.endpoint)
        else:
            self.last_error = request.error
            self.registered.clear()
            log.error("the kubelet refused DRA driver %s: %s", DRIVER, request.error)
        return reg_pb2.RegistrationStatusResponse()

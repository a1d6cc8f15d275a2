"""The operator starts as a UID without a passwd entry (the chart runs it as 65532)."""

import getpass
import os

import pytest

from gpushare.cluster.operator.runner import ensure_peering_identity


def test_identity_is_named_without_a_passwd_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_passwd_entry() -> str:
        raise KeyError("getpwuid(): uid not found: 65532")

    monkeypatch.delenv("POD_ID", raising=False)
    monkeypatch.setattr(getpass, "getuser", no_passwd_entry)
    ensure_peering_identity()
    assert os.environ["POD_ID"].startswith("gpushare-controller@")


def test_pod_name_given_by_the_chart_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_ID", "gpushare-controller-abc")
    ensure_peering_identity()
    assert os.environ["POD_ID"] == "gpushare-controller-abc"


def test_in_cluster_login_uses_the_service_address_not_cluster_dns() -> None:
    """Kopf's service-account login names kubernetes.default.svc; without cluster DNS the
    operator could never connect, so the kubelet-provided address replaces it."""
    import kopf  # noqa: PLC0415

    from gpushare.cluster.operator.handlers import in_cluster_server  # noqa: PLC0415

    info = kopf.ConnectionInfo(server="https://kubernetes.default.svc", token="t")
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    assert in_cluster_server(info, env).server == "https://10.96.0.1:443"
    assert in_cluster_server(info, env).token == "t"
    v6 = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "6443"}
    assert in_cluster_server(info, v6).server == "https://[fd00::1]:6443"
    assert in_cluster_server(info, {}).server == "https://kubernetes.default.svc"


def test_operator_keeps_its_cache_in_its_own_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    """In the chart's controller the operator runs with default settings; the profile cache
    it may write is granted only in the release namespace, which POD_NAMESPACE names."""
    from gpushare.cluster.operator.settings import DEFAULT_NAMESPACE, OperatorConfig  # noqa: PLC0415

    monkeypatch.setenv("POD_NAMESPACE", "gpushare-e2e")
    assert OperatorConfig().namespace == "gpushare-e2e"
    monkeypatch.delenv("POD_NAMESPACE")
    assert OperatorConfig().namespace == DEFAULT_NAMESPACE

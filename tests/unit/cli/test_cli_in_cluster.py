"""kubectl gpushare in a pod without kubectl (an operator's debug container, the controller's
image): it reads the pod's service account as client-go's in-cluster config does, instead of
refusing because ``kubectl config view`` cannot run."""

from pathlib import Path

import pytest

from gpushare.api.errors import InvalidInputError
from gpushare.kube import rest

CA = """-----BEGIN CERTIFICATE-----
MIIBdzCCAR2gAwIBAgIUQ0lYJ8VgRYf3q3Y8p0bqW0m1q2swCgYIKoZIzj0EAwIw
-----END CERTIFICATE-----
"""


@pytest.fixture
def no_kubectl(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    monkeypatch.delenv(rest.KUBECTL_ENV, raising=False)
    monkeypatch.delenv("KUBECONFIG", raising=False)


def service_account(tmp_path: Path) -> Path:
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("token-1\n")
    (sa / "ca.crt").write_text(CA)
    (sa / "namespace").write_text("gpushare\n")
    return sa


@pytest.mark.usefixtures("no_kubectl")
def test_in_a_pod_without_kubectl_the_service_account_is_used(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(rest, "SERVICE_ACCOUNT_DIR", service_account(tmp_path))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    config = rest.kubectl_config(None, None)
    cluster = config["clusters"][0]["cluster"]
    assert cluster["server"] == "https://10.96.0.1:443"
    assert config["contexts"][0]["context"]["namespace"] == "gpushare"
    user = config["users"][0]["user"]
    # The token is read at each request (a projected token rotates), not copied here.
    assert Path(user["tokenFile"]).read_text().strip() == "token-1"
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    assert rest.kubectl_config(None, None)["clusters"][0]["cluster"]["server"] == (
        "https://[fd00::1]:443"
    )


@pytest.mark.usefixtures("no_kubectl")
def test_outside_a_pod_without_kubectl_the_refusal_names_the_fix(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(rest, "SERVICE_ACCOUNT_DIR", tmp_path / "none")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(InvalidInputError, match="install kubectl, or set KUBECTL"):
        rest.kubectl_config(None, None)
    # An explicit kubeconfig is never swapped for the pod's identity.
    monkeypatch.setattr(rest, "SERVICE_ACCOUNT_DIR", service_account(tmp_path))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    with pytest.raises(InvalidInputError, match="kubectl is not on PATH"):
        rest.kubectl_config(tmp_path / "kubeconfig", None)

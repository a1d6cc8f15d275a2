"""Webhook serving certificates and the webhook configuration the controller registers."""

import datetime as dt
import ssl
from pathlib import Path

import pytest
from cryptography import x509

from gpushare.api.errors import InvalidInputError
from gpushare.cluster.settings import parse_args
from gpushare.cluster.tls import ensure_certs
from gpushare.cluster.webhook.registration import webhook_configurations


def test_generated_certificate_is_signed_by_the_ca_and_covers_the_hosts(tmp_path: Path) -> None:
    files = ensure_certs(tmp_path, hosts=["127.0.0.1", "gpushare.gpushare.svc"])
    cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["gpushare.gpushare.svc"]
    assert [str(i) for i in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    ca = x509.load_pem_x509_certificate(files.ca_pem())
    cert.verify_directly_issued_by(ca)
    assert files.key.stat().st_mode & 0o077 == 0
    ctx = files.server_context()  # loads as a TLS server
    assert ctx.minimum_version >= ssl.TLSVersion.TLSv1_2


def test_existing_certificates_are_kept_so_the_ca_bundle_stays_stable(tmp_path: Path) -> None:
    first = ensure_certs(tmp_path, hosts=["127.0.0.1"]).ca_pem()
    assert ensure_certs(tmp_path, hosts=["127.0.0.1"]).ca_pem() == first


def test_certificates_are_renewed_when_a_host_is_missing_or_expiry_is_near(tmp_path: Path) -> None:
    first = ensure_certs(tmp_path, hosts=["127.0.0.1"]).ca_pem()
    second = ensure_certs(tmp_path, hosts=["127.0.0.1", "other.example"]).ca_pem()
    assert second != first
    later = dt.datetime.now(dt.UTC) + dt.timedelta(days=340)
    assert (
        ensure_certs(tmp_path, hosts=["127.0.0.1", "other.example"], now=later).ca_pem() != second
    )


def test_registered_webhooks_fail_closed_only_for_gpushare_pods() -> None:
    settings = parse_args(["--register-webhooks", "--webhook-url", "https://127.0.0.1:9443"])
    mutating, validating = webhook_configurations(settings, b"PEM")
    for doc, path in ((mutating, "/mutate"), (validating, "/validate")):
        hook = doc["webhooks"][0]
        assert hook["clientConfig"]["url"] == f"https://127.0.0.1:9443{path}"
        assert hook["failurePolicy"] == "Fail"
        # Mutation may create a DRA-mode pod's ResourceClaimTemplate, never on a dry run.
        assert hook["sideEffects"] == "None"
        assert hook["rules"][0]["operations"] == ["CREATE"]
        assert "gpushare.io/" in hook["matchConditions"][0]["expression"]
        assert hook["namespaceSelector"]["matchExpressions"][0]["values"] == ["kube-system"]
        assert 1 <= hook["timeoutSeconds"] <= 30


def test_the_selector_webhook_sees_labelled_pods_of_consenting_namespaces_and_fails_open() -> None:
    """The second mutating webhook: pods the first is not sent, with labels, in namespaces an
    admin labelled gpushare.io/share-selectors=enabled; an outage must not block them."""
    settings = parse_args(["--register-webhooks", "--webhook-url", "https://127.0.0.1:9443"])
    mutating, validating = webhook_configurations(settings, b"PEM")
    assert len(validating["webhooks"]) == 1
    first, selector = mutating["webhooks"]
    assert selector["name"] == "selector.pods.gpushare.io"
    assert selector["failurePolicy"] == "Ignore"
    assert selector["clientConfig"]["url"] == "https://127.0.0.1:9443/mutate"
    expression = selector["matchConditions"][0]["expression"]
    assert expression == (
        f"has(object.metadata.labels) && !({first['matchConditions'][0]['expression']})"
    )
    assert selector["namespaceSelector"]["matchExpressions"] == [
        {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system"]},
        {"key": "gpushare.io/share-selectors", "operator": "In", "values": ["enabled"]},
    ]


def test_in_cluster_registration_points_at_the_service() -> None:
    settings = parse_args(
        ["--register-webhooks", "--webhook-service", "gpushare/gpushare-controller:8443"]
    )
    mutating, _ = webhook_configurations(settings, b"PEM")
    assert mutating["webhooks"][0]["clientConfig"]["service"] == {
        "namespace": "gpushare",
        "name": "gpushare-controller",
        "port": 8443,
        "path": "/mutate",
    }
    assert "gpushare-controller.gpushare.svc" in settings.webhook_hosts()


def test_an_unwritable_cert_dir_without_usable_files_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    with pytest.raises(InvalidInputError, match=r"--webhook-cert-dir.*cannot be written"):
        ensure_certs(blocker / "certs", hosts=["127.0.0.1"])

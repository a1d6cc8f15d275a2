"""cert-manager (optional): a Certificate covering every name the API server calls."""

from gpushare.cluster.settings import parse_args
from tests.chart.controller_flags import parseable
from tests.fixtures.helm_chart import Chart, container


def test_no_cert_manager_objects_unless_asked(chart: Chart) -> None:
    rendered = chart.render()
    assert not rendered.all("Certificate")
    assert not rendered.all("Issuer")


def test_certificate_covers_the_hosts_the_controller_requires(chart: Chart) -> None:
    rendered = chart.render({"webhook": {"certManager": {"enabled": True}}})
    cert = rendered.get("Certificate", "gpushare-controller-webhook")
    settings = parse_args(
        parseable(
            container(rendered.get("Deployment", "gpushare-controller"), "controller")["args"]
        )
    )
    assert set(settings.webhook_required_hosts()) <= set(cert["spec"]["dnsNames"])
    assert cert["spec"]["secretName"] == "gpushare-controller-webhook-tls"
    # The chart's own CA: self-signed once, then a CA issuer signing every certificate, so the
    # extender checks gpushare-scheduler's client certificate against the same ca.crt.
    assert cert["spec"]["issuerRef"] == {"name": "gpushare-controller-ca", "kind": "Issuer"}
    ca = rendered.get("Certificate", "gpushare-controller-ca")
    assert ca["spec"]["isCA"] is True
    assert ca["spec"]["issuerRef"] == {"name": "gpushare-controller-selfsigned", "kind": "Issuer"}
    assert rendered.get("Issuer", "gpushare-controller-ca")["spec"] == {
        "ca": {"secretName": "gpushare-controller-ca"}
    }
    client = rendered.get("Certificate", "gpushare-controller-extender-client")
    assert "client auth" in client["spec"]["usages"]
    assert client["spec"]["issuerRef"] == cert["spec"]["issuerRef"]


def test_an_existing_issuer_is_used_instead_of_a_self_signed_one(chart: Chart) -> None:
    rendered = chart.render(
        {
            "webhook": {
                "certManager": {
                    "enabled": True,
                    "issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer"},
                }
            }
        }
    )
    cert = rendered.get("Certificate", "gpushare-controller-webhook")
    assert cert["spec"]["issuerRef"] == {"name": "corp-ca", "kind": "ClusterIssuer"}
    assert not rendered.all("Issuer")

"""Controller settings: defaults that work on a developer machine, clear errors for bad flags."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpushare.api.errors import InvalidInputError
from gpushare.cluster.settings import ExtenderSettings, Settings, build_parser, parse_args
from gpushare.packing.interference import MODEL_ENV
from gpushare.packing.policy import Policy
from tests import REPO


def test_defaults_listen_on_loopback_where_the_dev_scheduler_calls() -> None:
    s = parse_args([])
    assert (s.extender_host, s.extender_port) == ("127.0.0.1", 8888)
    # The policy the openb benchmarks measured (bench/results/openb-replay.md).
    assert s.policy is Policy.GPUSHARE
    assert parse_args(["--policy", "binpack"]).policy is Policy.BINPACK
    assert s.webhook_enabled and not s.register_webhooks
    # Filter holds the chosen GPU (no bind collisions between pods scheduled back to back).
    assert s.hold_in_filter
    assert not parse_args(["--no-hold-in-filter"]).hold_in_filter


def test_flags_reach_the_settings() -> None:
    s = parse_args(
        [
            "--policy",
            "spread",
            "--extender-port",
            "9000",
            "--register-webhooks",
            "--webhook-url",
            "https://127.0.0.1:9443",
            "--webhook-exclude-namespace",
            "infra",
            "--set",
            "operator.profile=on",
            "--annotation-mode",
            "dra",
            "--dra-device-class",
            "shares.example.com",
        ]
    )
    assert (s.annotation_mode, s.dra_device_class) == ("dra", "shares.example.com")
    assert s.places_claims  # DRA mode: the controller places claims unless told otherwise
    assert not parse_args(
        ["--annotation-mode", "dra", "--dra-placement", "kube-scheduler"]
    ).places_claims
    assert not parse_args([]).places_claims  # device-plugin mode: no claims to place
    assert parse_args(["--dra-placement", "gpushare"]).places_claims  # a DRA pool beside it
    assert s.policy is Policy.SPREAD and s.extender_port == 9000
    assert s.webhook_exclude_namespaces == ("infra",)
    assert s.extra == {"operator.profile": "on"}
    assert "127.0.0.1" in s.webhook_required_hosts()


@pytest.mark.parametrize(
    ("argv", "flag", "fix"),
    [
        (["--extender-port", "70000"], "--extender-port", "1..65535"),
        (["--webhook-port", "8888"], "--webhook-port", "different ports"),
        (["--register-webhooks"], "--register-webhooks", "--webhook-url https://"),
        (["--webhook-url", "http://h:1"], "--webhook-url", "https://127.0.0.1:9443"),
        (["--webhook-url", "https://h:1/mutate"], "--webhook-url", "appended"),
        (["--webhook-service", "justname"], "--webhook-service", "namespace/name"),
        (["--extender-tls-cert", "/nonexistent.pem"], "--extender-tls-cert", "neither"),
        (["--kubeconfig", "/nonexistent/kubeconfig"], "--kubeconfig", "fix the path"),
        (["--webhook-timeout-seconds", "60"], "--webhook-timeout-seconds", "1 to 30"),
        (["--log-level", "LOUD"], "--log-level", "DEBUG, INFO"),
        (["--set", "novalue"], "--set", "key=value"),
        (["--protected-host-path", "relative/dir"], "--protected-host-path", "absolute"),
        (["--dra-device-class", "MPS_class"], "--dra-device-class", "lower-case letters"),
    ],
)
def test_bad_settings_name_the_flag_and_the_fix(argv: list[str], flag: str, fix: str) -> None:
    with pytest.raises(InvalidInputError) as info:
        parse_args(argv)
    assert info.value.field == flag
    assert fix in str(info.value)


def test_every_setting_is_documented_in_help() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "gpushare.cluster", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    text = " ".join(out.split())
    assert "Port of the extender; kube-scheduler's extender urlPrefix points here." in text
    assert "--register-webhooks" in out and "--webhook-cert-dir" in out


def test_a_bad_flag_exits_2_with_the_message_and_starts_nothing() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "gpushare.cluster", "--webhook-timeout-seconds", "0"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "gpushare-controller: error: --webhook-timeout-seconds" in proc.stderr


def test_settings_are_a_frozen_dataclass() -> None:
    with pytest.raises(AttributeError):
        Settings().extender_port = 1  # type: ignore[misc]


def test_an_unreadable_calibrated_model_stops_the_controller_naming_the_variable(
    tmp_path: Path,
) -> None:
    bad = tmp_path / "interference.json"
    bad.write_text('{"coefficients": "not a list"}')
    proc = subprocess.run(
        [sys.executable, "-m", "gpushare.cluster"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        env={**os.environ, MODEL_ENV: str(bad), "KUBECONFIG": str(tmp_path / "none")},
    )
    assert proc.returncode == 2
    assert f"gpushare-controller: error: {MODEL_ENV}" in proc.stderr
    assert "bad interference model" in proc.stderr


FLAGS = """
--agent-lease-max-seconds --agent-lease-namespace --agent-url --annotation-mode
--bind-gate-seconds --cert-reload-seconds
--certificate-days --certificate-secrets --dra-device-class
--dra-placement --dra-template-idle-seconds --dra-templates-per-namespace --extender-client-ca
--extender-host --extender-port --extender-tls-cert --extender-tls-host --extender-tls-key
--governor-period-seconds
--governor-settle-seconds --help --hold-in-filter --interference-admission --kubeconfig
--leader-elect --leader-elect-lease-seconds --leader-elect-name --leader-elect-namespace
--leader-elect-renew-seconds --leader-identity --leader-pod --log-level --metrics-auth
--neighbour-rules --no-hold-in-filter --no-interference-admission --no-issue-certificates
--no-operator
--no-opportunistic-default --no-opportunistic-placement --no-webhook --opportunistic-default
--opportunistic-placement --opportunistic-priority-class --pod-runtime-class --pod-toleration
--policy --profile-cache-name --protected-host-path --register-webhooks
--restart-on-certificate-change --resync-seconds --set
--stale-assume-seconds --tenancy --webhook-cert-dir --webhook-client-ca --webhook-config-name
--webhook-exclude-namespace --webhook-host --webhook-namespace-label --webhook-port
--webhook-service --webhook-timeout-seconds --webhook-url -h
"""


def test_the_flags_generated_from_the_groups_keep_their_names() -> None:
    """The chart and users pass these; a group's field renamed must not rename its flag."""
    flags = {s for a in build_parser()._actions for s in a.option_strings}
    assert flags == set(FLAGS.split())


def test_each_concern_is_its_own_group_and_flat_names_read_through() -> None:
    s = parse_args(["--extender-port", "9000", "--leader-elect", "--dra-placement", "gpushare"])
    assert s.extender.port == s.extender_port == 9000
    assert s.leader.enabled and s.leader_elect
    assert s.dra.places_claims and s.places_claims
    assert Settings.of(extender_port=9000) == Settings(extender=ExtenderSettings(port=9000))
    with pytest.raises(TypeError, match="no setting"):
        Settings.of(extender_prot=1)

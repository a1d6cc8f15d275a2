"""Where the operator finds node agents and its profile cache: the controller's --agent-url and
--profile-cache-name, refused with the flag named when they cannot work."""

import pytest

from gpushare.api.errors import InvalidInputError
from gpushare.cluster.operator.readings import agent_url
from gpushare.cluster.operator.settings import OperatorConfig
from gpushare.cluster.settings import parse_args
from tests.fixtures.standalone_operator import parse_args as parse_operator_args


def test_defaults_reach_the_agents_host_port_and_the_default_cache() -> None:
    settings = parse_args([])
    assert settings.agent_url == OperatorConfig().agent_url == "http://{node_ip}:9445"
    assert settings.profile_cache_name == OperatorConfig().cache_configmap


def test_a_changed_agent_url_is_where_the_profiler_is_called() -> None:
    settings = parse_args(
        ["--agent-url", "https://{node}.agents.example:8443/", "--profile-cache-name", "team-a"]
    )
    assert settings.profile_cache_name == "team-a"
    base = agent_url(settings.agent_url, node="gpu-1", node_ip="10.0.0.7")
    assert base == "https://gpu-1.agents.example:8443"


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("{node_ip}:9445", "not an http(s) URL"),
        ("ftp://{node_ip}:9445", "not an http(s) URL"),
        ("http://{host}:9445", "unknown placeholder"),
        ("http://{node_ip:9445", "not a valid template"),
        ("http://{node_ip}:port", "no valid port"),
        ("http://{node_ip}:9445/profile", "path or query"),
    ],
)
def test_an_unusable_agent_url_names_the_flag(url: str, problem: str) -> None:
    with pytest.raises(InvalidInputError) as err:
        parse_args(["--agent-url", url])
    assert err.value.field == "--agent-url"
    assert problem in err.value.problem


@pytest.mark.parametrize("name", ["Profile-Cache", "cache_1", "-cache", "x" * 254])
def test_a_profile_cache_name_the_api_server_would_refuse_names_the_flag(name: str) -> None:
    with pytest.raises(InvalidInputError) as err:
        parse_args([f"--profile-cache-name={name}"])
    assert err.value.field == "--profile-cache-name"


def test_the_standalone_operator_takes_the_same_settings(
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = parse_operator_args(
        ["--agent-url", "http://{node}:19445", "--profile-cache-name", "c"]
    )
    assert (config.agent_url, config.cache_configmap) == ("http://{node}:19445", "c")
    with pytest.raises(SystemExit) as done:
        parse_operator_args(["--agent-url", "http://{nodeip}:9445"])
    assert done.value.code == 2
    assert "--agent-url: unknown placeholder" in capsys.readouterr().err

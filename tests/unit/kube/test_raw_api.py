"""The controller's raw API path (watches and Bindings without lightkube's models): which
kubeconfigs it serves and how it authenticates."""

from pathlib import Path

from lightkube.config.kubeconfig import KubeConfig

from gpushare.kube.raw import RawApi


def config(user: dict[str, object], *, server: str = "http://127.0.0.1:6443") -> KubeConfig:
    return KubeConfig.from_dict(
        {
            "clusters": [{"name": "c", "cluster": {"server": server}}],
            "users": [{"name": "u", "user": user}],
            "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "x",
        }
    )


def raw_for(user: dict[str, object]) -> RawApi | None:
    single = config(user).get()
    assert single is not None
    return RawApi.from_config(single)


def test_a_rotated_service_account_token_is_picked_up_after_a_401(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("first\n")
    raw = raw_for({"tokenFile": str(token)})
    assert raw is not None
    assert raw._headers()["Authorization"] == "Bearer first"
    token.write_text("second\n")
    raw._forget_token()  # what a 401 answer does
    assert raw._headers()["Authorization"] == "Bearer second"


def test_a_static_token_is_sent_as_bearer() -> None:
    raw = raw_for({"token": "abc"})
    assert raw is not None and raw._headers()["Authorization"] == "Bearer abc"


def test_exec_and_basic_auth_stay_on_lightkube() -> None:
    assert raw_for({"exec": {"command": "get-token", "apiVersion": "v1"}}) is None
    assert raw_for({"username": "a", "password": "b"}) is None

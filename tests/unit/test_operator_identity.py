"""The operator starts as a UID without a passwd entry (the chart runs it as 65532)."""

import getpass
import os

import pytest

from gpushare.operator.runner import ensure_peering_identity


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

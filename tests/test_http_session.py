"""The provider's and the courier's HTTP session reads the environment once, when it is made."""

from __future__ import annotations

import pytest

from activities.payments import fenced_session

BASE = "http://127.0.0.1:8420"


def test_a_proxy_in_the_environment_is_kept_for_the_session(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.internal:3128")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    session = fenced_session(BASE)
    assert session.proxies.get("http") == "http://proxy.internal:3128"


def test_no_proxy_for_the_base_url_leaves_it_direct(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.internal:3128")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    assert fenced_session(BASE).proxies == {}


def test_the_environment_changed_later_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HTTP_PROXY", raising=False)
    monkeypatch.delenv("http_proxy", raising=False)
    session = fenced_session(BASE)
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.internal:3128")
    settings = session.merge_environment_settings(BASE, {}, None, None, None)
    assert settings["proxies"] == {}
    assert not session.trust_env  # nor is a ~/.netrc entry put in place of the provider's Authorization

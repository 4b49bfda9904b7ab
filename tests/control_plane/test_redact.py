"""Credentials never survive into printed or stored text."""
import pytest

from sits.control_plane.redact import redact, redact_url, split_credentials

URLS = [
    ("http://user:pass@prom:9090/api", "http://***@prom:9090/api"),
    ("https://token@host/x", "https://***@host/x"),
    ("http://u:p%40ss@host:1", "http://***@host:1"),
    ("http://host/hook?token=abc&x=1", "http://host/hook?token=***&x=1"),
    ("http://host/hook?api_key=abc&SIG=zz&password=p", "http://host/hook?api_key=***&SIG=***&password=***"),
    ("http://host:9090/api/v1/query", "http://host:9090/api/v1/query"),
    ("http://host/p?q=user%3Apass%40", "http://host/p?q=user%3Apass%40"),
]


@pytest.mark.parametrize("url,want", URLS)
def test_redact_url(url, want):
    assert redact_url(url) == want


@pytest.mark.parametrize("url,want", URLS)
def test_redact_finds_urls_inside_messages(url, want):
    msg = f"ConnectionError: HTTPConnectionPool: Max retries exceeded with url {url} (Caused by ...)"
    assert redact(msg) == msg.replace(url, want)


def test_redact_leaves_plain_text_alone():
    text = "prometheus at 127.0.0.1:9090: 3 attempts failed; user@example.com wrote"
    assert redact(text) == text


def test_split_credentials():
    assert split_credentials("http://a:b%2Fc@h:1/p?q") == ("http://h:1/p?q", ("a", "b/c"))
    assert split_credentials("http://h:1") == ("http://h:1", None)

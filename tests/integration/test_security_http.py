"""The admin endpoint of a secure bookie: TLS only, bearer tokens, the admin role for anything
that changes state (read-only switch, GC), /health and /metrics open by setting, and 400 (never
500) for invalid UTF-8, unknown charsets and deeply nested JSON, on every path that takes a body
(the read-only switch and trigger_audit). The status page fetches only admin URLs it can verify."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request

import pytest

from bookkeeper.security.tls import ClientTls
from dlog_tools.ui import verified_admin_url


def call(cluster, path: str, *, method: str = "GET", token: str | None = None, body: bytes | None = None,
         content_type: str = "application/json") -> tuple[int, dict]:
    context = ClientTls(str(cluster.secure_dir.ca_file)).context()
    request = urllib.request.Request(cluster.bookies[0].http + path, data=body, method=method)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    if body is not None:
        request.add_header("Content-Type", content_type)
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as error:
        text = error.read() or b"{}"
        try:
            return error.code, json.loads(text)
        except ValueError:  # not JSON: a 500 page
            return error.code, {"error": text.decode(errors="replace")}


def test_the_admin_endpoint_serves_tls_only(secure_cluster):
    url = secure_cluster.bookies[0].http
    assert url.startswith("https://")
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        urllib.request.urlopen(url.replace("https://", "http://") + "/health", timeout=5).read()
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        urllib.request.urlopen(url + "/health", timeout=5, context=ssl.create_default_context())


def test_health_and_metrics_are_open_and_the_rest_needs_a_token(secure_cluster):
    assert call(secure_cluster, "/health")[0] == 200
    context = ClientTls(str(secure_cluster.secure_dir.ca_file)).context()
    with urllib.request.urlopen(secure_cluster.bookies[0].http + "/metrics", timeout=10, context=context) as reply:
        assert b"dlog_bookie_auth_failures_total" in reply.read()
    status, body = call(secure_cluster, "/api/v1/bookie/info")
    assert status == 401 and "Bearer" in body["error"]
    status, _ = call(secure_cluster, "/api/v1/bookie/info", token="forged.token.here")
    assert status == 401


@pytest.mark.parametrize("method, path, body", [
    ("PUT", "/api/v1/bookie/state", b'{"read_only": true}'),  # would stop every write
    ("POST", "/api/v1/gc", None),  # would destroy data whose metadata was deleted
])
def test_state_changes_need_the_admin_role(secure_cluster, method, path, body):
    secure = secure_cluster.secure_dir
    assert call(secure_cluster, path, method=method, body=body)[0] == 401
    consumer = secure.token("reader", ["consume:orders", "admin:orders"])
    status, answer = call(secure_cluster, path, method=method, body=body, token=consumer)
    assert status == 403 and "admin" in answer["error"]
    assert call(secure_cluster, "/api/v1/bookie/state", token=consumer)[1]["state"] == "writable"
    status, _ = call(secure_cluster, path, method=method, body=body, token=secure.admin_token)
    assert status == 200
    call(secure_cluster, "/api/v1/bookie/state", method="PUT", body=b'{"read_only": false}',
         token=secure.admin_token)


@pytest.mark.parametrize("method, path", [("PUT", "/api/v1/bookie/state"),
                                          ("POST", "/api/v1/autorecovery/trigger_audit")])
@pytest.mark.parametrize("body, content_type, words", [
    (b'{"read_only": \xff\xfe}', "application/json", "UTF-8"),
    ('{"read_only": true}'.encode("utf-16"), "application/json; charset=utf-16", "charset"),
    (b'{"read_only": true}', "application/json; charset=klingon", "charset"),
    (b"[" * 5000 + b"]" * 5000, "application/json", "nested"),
    (b'{"read_only": ', "application/json", "JSON"),
])
def test_bad_bodies_get_400_never_500(secure_cluster, method, path, body, content_type, words):
    status, answer = call(secure_cluster, path, method=method, body=body, content_type=content_type,
                          token=secure_cluster.secure_dir.admin_token)
    assert status == 400 and words in answer["error"]
    assert call(secure_cluster, "/health")[0] == 200


@pytest.mark.parametrize("info, tls, expected", [
    ({"address": "127.0.0.1:3181", "http": "https://127.0.0.1:8080"}, True, "https://127.0.0.1:8080"),
    ({"address": "127.0.0.1:3181", "http": "http://127.0.0.1:8080"}, True, None),  # not TLS
    ({"address": "127.0.0.1:3181", "http": "https://169.254.169.254:80"}, True, None),  # elsewhere
    ({"address": "127.0.0.1:3181", "http": "https://127.0.0.1:8080/../../admin?x=1"}, True, None),
    ({"address": "127.0.0.1:3181", "http": "https://user:pw@127.0.0.1:8080"}, True, None),
    ({"address": "127.0.0.1:3181", "http": "http://127.0.0.1:8080"}, False, "http://127.0.0.1:8080"),
    ({"address": "127.0.0.1:3181", "http": "file:///etc/passwd"}, False, None),
    ({"address": "127.0.0.1:3181", "http": 42}, False, None),
])
def test_the_status_page_fetches_only_verified_admin_urls(info, tls, expected):
    assert verified_admin_url(info, tls) == expected

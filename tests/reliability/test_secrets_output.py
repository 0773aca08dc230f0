"""No secret appears in any output (issue 14, item 12).

A planted token is put everywhere a user puts one -- OTLP header lists (well and badly
formed), URL credentials, the processor's receiver token, Grafana tokens and passwords --
and every message the commands produce (stdout, stderr, logs at -v, exception text,
/metrics) is searched for it.
"""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from mycroft_otel.config import ConfigError
from mycroft_otel.redact import check_headers, safe_url

from service_helpers import ROOT, hung_payload, post

TOKEN = "plantedSecret7d1e4a90"


def _cli(*args: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "GRAFANA_", "MYCROFT_"))}
    e.update(PYTHONPATH=ROOT, **(env or {}))
    return subprocess.run([sys.executable, "-m", "mycroft_otel", *args], env=e, cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def _clean(*texts: str) -> None:
    for t in texts:
        assert TOKEN not in t, t
        assert TOKEN[3:-3] not in t, t  # nor a piece of it


BAD_HEADERS = [
    f"Authorization=Bearer {TOKEN};x",        # ';' is not allowed in a value
    f"Authorization Bearer {TOKEN}",          # no '='
    f"x-api-key={TOKEN}\"",                    # a quote
    f"ok=1, {TOKEN}",                          # the second entry is the bare token
    f"=${TOKEN}",                              # no key
]


@pytest.mark.parametrize("headers", BAD_HEADERS)
def test_bad_header_lists_are_named_not_echoed(headers):
    with pytest.raises(ConfigError) as e:
        check_headers("OTEL_EXPORTER_OTLP_HEADERS", headers)
    _clean(str(e.value))
    assert "OTEL_EXPORTER_OTLP_HEADERS" in str(e.value) and "entry" in str(e.value)


def test_good_header_lists_pass():
    assert check_headers("V", f"Authorization=Bearer%20{TOKEN},x-tenant=a") == {"authorization": 1, "x-tenant": 2}
    assert check_headers("V", f"Authorization=Bearer {TOKEN}") == {"authorization": 1}  # as the SDK accepts it


@pytest.mark.parametrize("verb", ["agent", "processor"])
@pytest.mark.parametrize("var", ["OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS"])
def test_agent_and_processor_refuse_bad_headers_without_echo(verb, var, tmp_path):
    args = ["--grpc-port", "0", "--http-port", "-1", "--metrics-port", "-1"] if verb == "processor" else []
    env = {var: BAD_HEADERS[0], "MYCROFT_RING_DIR": str(tmp_path / "rings")}
    r = _cli(verb, *args, env=env)
    assert r.returncode == 2, r.stderr
    assert var in r.stderr
    _clean(r.stdout, r.stderr)


def test_endpoint_credentials_are_not_echoed(tmp_path):
    for endpoint in (f"ftp://user:{TOKEN}@collector:4317", f"https://user:{TOKEN}@collector:99999"):
        r = _cli("agent", env={"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "MYCROFT_RING_DIR": str(tmp_path)})
        assert r.returncode == 2 and "OTEL_EXPORTER_OTLP_ENDPOINT" in r.stderr, r.stderr
        _clean(r.stdout, r.stderr)
    assert safe_url(f"https://u:{TOKEN}@h:1/p?key={TOKEN}") == "https://***@h:1/p?***"


def test_processor_token_never_appears_in_its_output(tmp_path):
    from processor_support import free_port

    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    ports = [free_port(), free_port()]
    e = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MYCROFT_"))}
    e.update(PYTHONPATH=ROOT, OTEL_TRACES_EXPORTER="console")  # verdicts printed: they are output too
    proc = subprocess.Popen([sys.executable, "-m", "mycroft_otel", "processor", "-v", "--grpc-port", "-1",
                             "--http-port", str(ports[0]), "--metrics-port", str(ports[1]),
                             "--token-file", str(token_file)], env=e, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()
        assert "bearer token required" in line, line
        assert post(ports[0], hung_payload(1), {"Authorization": f"Bearer {TOKEN[::-1]}"})[0] == 401
        status, body = post(ports[0], hung_payload(1), {"Authorization": f"Bearer {TOKEN}"})
        assert status == 200
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{ports[1]}/metrics", timeout=10).read().decode()
        assert 'reason="unauthenticated"' in metrics
        time.sleep(4.5)  # long enough for the stall to be named (and logged at -v)
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=20)
    assert "root cause" in err, err[-2000:]
    _clean(line, out, err, metrics, body.decode("latin-1"))


class _Refusing(http.server.BaseHTTPRequestHandler):
    """A Grafana that refuses every credential (401), as a real one does for a wrong token."""

    def do_GET(self):  # noqa: N802
        body = b'{"message":"invalid API key"}'
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


@pytest.fixture
def refusing_grafana():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Refusing)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv.server_address[1]
    srv.shutdown()
    srv.server_close()


def test_grafana_credentials_never_appear(refusing_grafana, tmp_path):
    pytest.importorskip("grafana_client")
    from processor_support import free_port

    port = refusing_grafana
    closed = free_port()
    secret_file = tmp_path / "secret"
    secret_file.write_text(TOKEN)
    runs = [
        _cli("grafana", "provision", "--url", f"http://admin:{TOKEN}@127.0.0.1:{port}", "--timeout", "5"),
        _cli("grafana", "provision", "--url", f"http://admin:{TOKEN}@127.0.0.1:{closed}", "--timeout", "5"),
        _cli("grafana", "provision", "--url", f"http://127.0.0.1:{port}", env={"GRAFANA_TOKEN": TOKEN}),
        _cli("grafana", "provision", "--url", f"http://127.0.0.1:{port}", "--token-file", str(secret_file)),
        _cli("grafana", "provision", "--url", f"http://127.0.0.1:{port}", "--user", "admin",
             "--password-file", str(secret_file)),
        _cli("grafana", "provision", "--url", f"http://u:{TOKEN}@[::1"),
    ]
    for r in runs:
        assert r.returncode == 2, r.stderr
        _clean(r.stdout, r.stderr)
    assert "refused the credentials (401" in runs[0].stderr and "http://***@127.0.0.1" in runs[0].stderr
    assert "cannot reach Grafana" in runs[1].stderr
    assert all("refused the credentials (401" in r.stderr for r in runs[2:5])
    # a token on the command line still works but is called out (ps shows it to every user)
    r = _cli("grafana", "provision", "--url", f"http://127.0.0.1:{port}", "--token", TOKEN)
    assert r.returncode == 2 and "visible to every user" in r.stderr
    _clean(r.stdout, r.stderr)

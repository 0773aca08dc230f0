"""The runbook the processor serves at /runbook (runbook.py, metrics.py): every category's section is an anchor
the page's runbook_url lands on; an unreadable file is a 404 that names it."""

from __future__ import annotations

import re
import urllib.error
import urllib.request

import pytest

from mycroft_otel import paths
from mycroft_otel import semconv as sc
from mycroft_otel.processor.cli import own_runbook_url
from mycroft_otel.processor.metrics import Metrics
from mycroft_otel.processor.runbook import render, slug


def _get(port: int, path: str = "/runbook") -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return r.status, r.headers["Content-Type"], r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read().decode()


@pytest.fixture
def served():
    started = []

    def serve(runbook_path=None) -> int:
        m = Metrics()
        started.append(m)
        return m.serve(0, runbook_path=runbook_path)

    yield serve
    for m in started:
        m.shutdown()


def test_the_runbook_has_a_section_for_every_category(served):
    port = served()
    status, ctype, body = _get(port)
    assert status == 200 and ctype.startswith("text/html")
    ids = set(re.findall(r'<h[1-6] id="([^"]+)"', body))
    assert set(sc.CATEGORIES) <= ids, sorted(set(sc.CATEGORIES) - ids)
    assert _get(port, "/metrics")[0] == 200  # the scrape is the same server's


def test_a_missing_or_unreadable_runbook_is_a_404_that_names_it(served, tmp_path):
    missing = tmp_path / "runbook.md"
    status, ctype, body = _get(served(missing))
    assert status == 404 and ctype.startswith("text/plain")
    assert str(missing) in body and "No such file" in body
    bad = tmp_path / "latin1.md"
    bad.write_bytes(b"# caf\xe9\n")
    status, _, body = _get(served(bad))
    assert status == 404 and str(bad) in body


def test_headings_get_githubs_anchors_and_text_is_escaped():
    page = render("# Runbook: a `MycroftRootCause` page\n\n### gpu_stalled\nA <script> & `x<y`\n\n## Hangs\n## Hangs\n"
                  "| a | b |\n|---|:-:|\n| `c` | **d** |\n")
    assert '<h1 id="runbook-a-mycroftrootcause-page">Runbook: a <code>MycroftRootCause</code> page</h1>' in page
    assert '<h3 id="gpu_stalled">' in page and '<h2 id="hangs">' in page and '<h2 id="hangs-1">' in page
    assert "<p>A &lt;script&gt; &amp; <code>x&lt;y</code></p>" in page and "<script>" not in page
    assert "<tr><td><code>c</code></td><td><strong>d</strong></td></tr>" in page
    assert slug("When the page is wrong") == "when-the-page-is-wrong"


def test_a_checkout_reads_docs_runbook_md():
    assert paths.runbook_path().is_file() and paths.runbook_path().parts[-2:] == ("docs", "runbook.md")


def test_the_default_runbook_url_is_where_the_metrics_server_is_reached():
    assert own_runbook_url("127.0.0.1", 9464) == "http://127.0.0.1:9464/runbook"
    assert own_runbook_url("::1", 9464) == "http://[::1]:9464/runbook"
    assert own_runbook_url("0.0.0.0", 9464).endswith(":9464/runbook")
    assert "0.0.0.0" not in own_runbook_url("0.0.0.0", 9464)

"""The report as a browser shows it: headless Chromium (DevTools protocol on a pipe) loads the page,
and the test checks the screenshot is not blank, the culprit's node is visible on top and red, the
console stayed clean and the page asked for nothing but itself.

Chromium comes from the project's setup (scripts/test.sh installs Debian's ``chromium``).
"""

from __future__ import annotations

import re
import subprocess

import pytest

from mycroft_otel.cli import command
from mycroft_otel.report import render_report

from chromium import Chromium, assert_report_page, check_report_page, find_chromium
from report_synth import request, ring_hang, root_cause, write_run


@pytest.fixture(scope="module")
def browser():
    exe = find_chromium()
    if exe is None:
        pytest.fail("no Chromium found (scripts/test.sh installs Debian's chromium; MYCROFT_CHROMIUM names another)")
    b = Chromium(exe)
    yield b
    b.close()


def test_the_checker_sees_console_errors_and_requests(browser, tmp_path):
    """The browser check can fail: a page that logs an error, throws, and fetches from the network."""
    page = tmp_path / "bad.html"
    page.write_text('<!DOCTYPE html><html><body><p>x</p><script>console.error("planted error");'
                    'throw new Error("planted exception")</script><img src="http://127.0.0.1:9/planted.png">'
                    "</body></html>")
    seen = check_report_page(browser, str(page))
    assert any("planted error" in e for e in seen["console_errors"]), seen["console_errors"]
    assert any("planted exception" in e for e in seen["console_errors"]), seen["console_errors"]
    assert "http://127.0.0.1:9/planted.png" in seen["requests"]
    assert not seen["probe"]["found"]
    with pytest.raises(AssertionError):
        assert_report_page(seen, 3)


def test_synthetic_hang_report_renders(browser, tmp_path):
    tid, spans = ring_hang(n=8, culprit=3)
    write_run(tmp_path / "run.jsonl", request(spans + [root_cause(tid, "gpu_stalled", [3])]))
    html, run, problems = render_report(str(tmp_path / "run.jsonl"))
    assert problems == []
    (tmp_path / "report.html").write_text(html)
    assert_report_page(check_report_page(browser, str(tmp_path / "report.html")), 3)


@pytest.mark.timeout(300)
def test_demo_writes_a_report_the_browser_shows(browser, tmp_path):
    """``mycroft-otel demo`` run in a scratch directory: report.html lands there, its path is printed,
    and the page shows the verdict's culprit."""
    res = subprocess.run(command("demo", "--nodes", "4", "--gpus", "2", "--seed", "2"), cwd=tmp_path,
                         capture_output=True, text=True, timeout=280)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "right: culprit found" in res.stdout, res.stdout
    m = re.search(r"^report\s+(\S+report\.html)\b", res.stdout, re.M)
    assert m and m.group(1) == str(tmp_path / "report.html"), res.stdout
    culprit = int(re.search(r"^  where\s+rank (\d+) of communicator", res.stdout, re.M).group(1))
    assert_report_page(check_report_page(browser, m.group(1)), culprit)

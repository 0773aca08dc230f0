"""docs/img/report.png is the report of the default demo as the current report code draws it.

The test runs ``mycroft-otel demo`` (the default: 64 ranks, a NIC goes down), checks what its report says
about the fault, and compares the report's structure (its CSS, the kinds of element it draws, its
headings: what the template decides, not what one run's timing puts in it) with the stamp committed
beside the screenshot (docs/img/report.png.json). Pixels vary between runs and machines, the structure
does not; a change to the report's look that forgot the screenshot fails here.

    MYCROFT_UPDATE_SCREENSHOTS=1 python3 -m pytest tests/report/test_docs_screenshot.py

writes the screenshot (headless Chromium, the report's top 1000 x 1750 CSS pixels) and its stamp.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from chromium import Chromium, find_chromium

ROOT = Path(__file__).resolve().parents[2]
PNG = ROOT / "docs" / "img" / "report.png"
STAMP = PNG.with_name(PNG.name + ".json")
WIDTH, HEIGHT = 1000, 1750
UPDATE = os.environ.get("MYCROFT_UPDATE_SCREENSHOTS") == "1"


def structure(html: str) -> dict:
    """What the report template decides: its stylesheet, the (tag, class) kinds of element it draws, its
    section headings and the heat map's legend; none of one run's numbers, ids or times."""
    css = re.search(r"<style>(.*?)</style>", html, re.S).group(1)
    kinds = sorted({f"{tag}.{cls}" for tag, cls in re.findall(r'<([a-z0-9]+)[^>]*?\sclass="([^"]*)"', html)})
    heads = sorted({re.sub(r"\d+", "N", h) for h in re.findall(r"<h[24]>([^<]*)</h[24]>", html)})
    states = sorted(set(re.findall(r'data-state="([^"]+)"', html)))
    digest = hashlib.sha256(json.dumps([css, kinds, heads, states]).encode()).hexdigest()
    return {"structure_sha256": digest, "element_kinds": kinds, "headings": heads, "heat_states": states}


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> dict:
    try:
        from mycroft_otel.sim.runner import find_plugin
        find_plugin()
    except (ImportError, FileNotFoundError) as exc:
        pytest.skip(f"native build missing: {exc}")
    work = tmp_path_factory.mktemp("demo")
    res = subprocess.run([sys.executable, "-m", "mycroft_otel", "demo"], cwd=work, capture_output=True, text=True,
                         timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 0, res.stderr[-3000:]
    return {"html": (work / "report.html").read_text(), "report": work / "report.html", "stdout": res.stdout}


def test_demo_report_tells_the_truth_about_its_fault(demo):
    html = demo["html"]
    m = re.search(r"^  where\s+rank (\d+) of communicator", demo["stdout"], re.M)
    culprit = int(m.group(1))
    sec = html[html.index('<section class="trace"'):]
    sec = sec[:sec.index("</section>")]
    cells = re.findall(r'<rect class="heat" data-rank="(\d+)" data-state="([^"]+)"', sec)
    assert cells, "no heat map in the verdict's trace"
    assert any(int(r) == culprit and s == "culprit" for r, s in cells)
    assert not [(r, s) for r, s in cells if s == "own GPU"], "a NIC fault painted as a GPU that does not consume"
    # the demo's own end is not a process exit in any trace it draws
    heads = re.findall(r"<h3>([^<]*)</h3>", html)
    assert not [h for h in heads if "process exited" in h], heads


def test_docs_screenshot_is_of_the_current_report(demo):
    now = structure(demo["html"])
    if UPDATE:
        exe = find_chromium()
        assert exe, "no Chromium found (scripts/test.sh installs Debian's chromium)"
        b = Chromium(exe, width=WIDTH, height=900)
        try:
            session = b.new_page()
            load = b.load(session, "file://" + str(demo["report"]))
            assert not load.console_errors and not load.requests[1:], (load.console_errors, load.requests)
            png = b.screenshot(session, {"x": 0, "y": 0, "width": WIDTH, "height": HEIGHT})
        finally:
            b.close()
        PNG.write_bytes(png)
        STAMP.write_text(json.dumps({**now, "png_sha256": hashlib.sha256(png).hexdigest(),
                                     "made_by": "MYCROFT_UPDATE_SCREENSHOTS=1 python3 -m pytest "
                                                "tests/report/test_docs_screenshot.py",
                                     "viewport_css_px": [WIDTH, HEIGHT]}, indent=1) + "\n")
    assert STAMP.exists(), f"{STAMP} missing: {__doc__}"
    stamp = json.loads(STAMP.read_text())
    assert stamp["png_sha256"] == hashlib.sha256(PNG.read_bytes()).hexdigest(), \
        "docs/img/report.png is not the screenshot its stamp describes: regenerate both (see the module docstring)"
    assert stamp["structure_sha256"] == now["structure_sha256"], (
        "the report template changed since docs/img/report.png was taken; regenerate it with "
        "MYCROFT_UPDATE_SCREENSHOTS=1 (differences: "
        f"kinds {sorted(set(now['element_kinds']) ^ set(stamp['element_kinds']))}, "
        f"headings {sorted(set(now['headings']) ^ set(stamp['headings']))}, "
        f"heat states {sorted(set(now['heat_states']) ^ set(stamp['heat_states']))})")

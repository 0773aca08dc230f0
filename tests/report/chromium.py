"""Headless Chromium driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``).

Chromium reads protocol commands from fd 3 and writes replies and events to fd 4, each message a
JSON object ended by a NUL byte: no port, no websocket library. One page target is attached in
flat mode (``sessionId`` on every message) with the Page, Runtime, Network and Log domains on, so
every console message, uncaught exception and network request of the page is recorded.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import queue
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "chrome")


def find_chromium() -> str | None:
    env = os.environ.get("MYCROFT_CHROMIUM")
    if env:
        return env
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


class CdpError(RuntimeError):
    pass


@dataclass
class PageLoad:
    url: str
    requests: list[str] = field(default_factory=list)      # every URL the page asked for
    console_errors: list[str] = field(default_factory=list)


class Chromium:
    def __init__(self, exe: str, width: int = 1200, height: int = 1000):
        self.profile = tempfile.mkdtemp(prefix="mycroft-chromium-")
        cmd_r, cmd_w = os.pipe()
        out_r, out_w = os.pipe()
        # move the child's ends above 10 so dup2 onto 3 and 4 cannot clobber one with the other
        hi_cmd = fcntl.fcntl(cmd_r, fcntl.F_DUPFD, 10)
        hi_out = fcntl.fcntl(out_w, fcntl.F_DUPFD, 10)
        os.close(cmd_r)
        os.close(out_w)

        argv = [exe, "--headless", "--remote-debugging-pipe", "--disable-gpu", "--no-first-run",
                "--no-default-browser-check", "--disable-extensions", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--mute-audio", "--hide-scrollbars",
                f"--user-data-dir={self.profile}", f"--window-size={width},{height}"]
        if os.geteuid() == 0:
            argv.append("--no-sandbox")   # Chromium refuses to run its sandbox as root
        self.log = open(os.path.join(self.profile, "chromium.log"), "wb")
        # bash moves the pipe ends onto 3 and 4 and execs Chromium. A preexec_fn would do it in Python after a
        # fork, and a fork of a process running gRPC can die before its exec (see spawn_as in the reliability tests).
        on_3_and_4 = f'exec 3<&{hi_cmd} 4>&{hi_out} {hi_cmd}<&- {hi_out}>&-; exec "$@"'
        self.proc = subprocess.Popen(["bash", "-c", on_3_and_4, "chromium", *argv, "about:blank"],
                                     stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
                                     pass_fds=(hi_cmd, hi_out))
        os.close(hi_cmd)
        os.close(hi_out)
        self._w = os.fdopen(cmd_w, "wb", buffering=0)
        self._r = os.fdopen(out_r, "rb", buffering=0)
        self._next = 0
        self._replies: dict[int, queue.Queue] = {}
        self._lock = threading.Lock()
        self.events: queue.Queue = queue.Queue()
        self._reader = threading.Thread(target=self._read, name="cdp-reader", daemon=True)
        self._reader.start()
        self.width, self.height = width, height
        self._targets: dict[str, str] = {}   # session -> target id

    def close_page(self, session: str) -> None:
        target = self._targets.pop(session, None)
        if target:
            self.send("Target.closeTarget", {"targetId": target})

    # --- protocol ---------------------------------------------------------------------------

    def _read(self) -> None:
        buf = b""
        while True:
            chunk = self._r.read(1 << 16)
            if not chunk:
                self.events.put(None)
                for q in list(self._replies.values()):
                    q.put({"error": {"message": "Chromium closed the pipe"}})
                return
            buf += chunk
            while b"\0" in buf:
                raw, buf = buf.split(b"\0", 1)
                msg = json.loads(raw)
                if "id" in msg:
                    q = self._replies.get(msg["id"])
                    if q is not None:
                        q.put(msg)
                else:
                    self.events.put(msg)

    def send(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float = 60.0) -> dict:
        with self._lock:
            self._next += 1
            mid = self._next
            q: queue.Queue = queue.Queue()
            self._replies[mid] = q
        msg = {"id": mid, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        self._w.write(json.dumps(msg).encode() + b"\0")
        try:
            reply = q.get(timeout=timeout)
        except queue.Empty:
            raise CdpError(f"{method}: no reply in {timeout:.0f} s") from None
        finally:
            self._replies.pop(mid, None)
        if "error" in reply:
            raise CdpError(f"{method}: {reply['error'].get('message')}")
        return reply.get("result", {})

    def new_page(self) -> str:
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        self._targets[session] = target
        for domain in ("Page", "Runtime", "Network", "Log"):
            self.send(f"{domain}.enable", session=session)
        self.send("Emulation.setDeviceMetricsOverride", {"width": self.width, "height": self.height,
                                                         "deviceScaleFactor": 1, "mobile": False}, session=session)
        return session

    # --- what the tests use -----------------------------------------------------------------

    def load(self, session: str, url: str, timeout: float = 60.0) -> PageLoad:
        """Navigate and wait for the load event, recording requests and console errors on the way."""
        while not self.events.empty():   # what an earlier page said is not this page's
            self.events.get_nowait()
        res = self.send("Page.navigate", {"url": url}, session=session)
        if res.get("errorText"):
            raise CdpError(f"navigation to {url} failed: {res['errorText']}")
        out = PageLoad(url)
        deadline = time.monotonic() + timeout
        loaded = False
        settle = None
        while True:
            wait = (settle if loaded else deadline) - time.monotonic()
            if wait <= 0:
                if not loaded:
                    raise CdpError(f"{url}: no load event in {timeout:.0f} s")
                return out
            try:
                ev = self.events.get(timeout=wait)
            except queue.Empty:
                continue
            if ev is None:
                raise CdpError("Chromium exited while loading the page")
            if ev.get("sessionId") != session:
                continue
            m, p = ev.get("method"), ev.get("params", {})
            if m == "Network.requestWillBeSent":
                out.requests.append(p["request"]["url"])
            elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.console_errors.append(" ".join(str(a.get("value", a.get("description", "")))
                                                   for a in p.get("args", [])))
            elif m == "Runtime.exceptionThrown":
                d = p.get("exceptionDetails", {})
                out.console_errors.append(d.get("exception", {}).get("description") or d.get("text", "exception"))
            elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                out.console_errors.append(f"{p['entry'].get('source')}: {p['entry'].get('text')} "
                                          f"{p['entry'].get('url', '')}".strip())
            elif m == "Page.loadEventFired":
                loaded = True
                settle = time.monotonic() + 1.0   # late requests or errors right after load count too

    def evaluate(self, session: str, expression: str):
        res = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                             "awaitPromise": True}, session=session)
        if "exceptionDetails" in res:
            raise CdpError(f"evaluation failed: {res['exceptionDetails'].get('text')}: "
                           f"{res['exceptionDetails'].get('exception', {}).get('description', '')}")
        return res["result"].get("value")

    def screenshot(self, session: str, clip: dict | None = None) -> bytes:
        params: dict = {"format": "png"}
        if clip:
            params.update(clip=dict(clip, scale=1), captureBeyondViewport=True)
        return base64.b64decode(self.send("Page.captureScreenshot", params, session=session)["data"])

    def image_stats(self, png: bytes, box: dict | None = None, rgb: tuple[int, int, int] | None = None) -> dict:
        """Decode ``png`` in a blank page of its own (a canvas) and measure it: the share of pixels
        that are not near-white, distinct colours, and the share of ``box`` close to ``rgb``."""
        session = self.new_page()
        js = """(async () => {
          const img = new Image();
          img.src = "data:image/png;base64,%s";
          await img.decode();
          const c = document.createElement("canvas");
          c.width = img.width; c.height = img.height;
          const g = c.getContext("2d"); g.drawImage(img, 0, 0);
          const d = g.getImageData(0, 0, c.width, c.height).data;
          let ink = 0; const colours = new Set();
          for (let i = 0; i < d.length; i += 4) {
            if (d[i] < 235 || d[i+1] < 235 || d[i+2] < 235) ink++;
            if (i %% 64 === 0) colours.add((d[i] << 16) | (d[i+1] << 8) | d[i+2]);
          }
          const box = %s, rgb = %s; let near = 0, inBox = 0;
          if (box && rgb) {
            for (let y = Math.max(0, Math.floor(box.y)); y < Math.min(c.height, box.y + box.height); y++)
              for (let x = Math.max(0, Math.floor(box.x)); x < Math.min(c.width, box.x + box.width); x++) {
                const i = (y * c.width + x) * 4; inBox++;
                if (Math.abs(d[i]-rgb[0]) + Math.abs(d[i+1]-rgb[1]) + Math.abs(d[i+2]-rgb[2]) < 60) near++;
              }
          }
          return {width: c.width, height: c.height, ink: ink / (c.width * c.height),
                  colours: colours.size, box_share: inBox ? near / inBox : null};
        })()""" % (base64.b64encode(png).decode(), json.dumps(box), json.dumps(list(rgb) if rgb else None))
        try:
            return self.evaluate(session, js)
        finally:
            self.close_page(session)

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=10)
        except CdpError:
            pass
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for f in (self._w, self._r, self.log):
            try:
                f.close()
            except OSError:
                pass
        shutil.rmtree(self.profile, ignore_errors=True)


CULPRIT_PROBE = """(() => {
  // the first verdict's culprit: what its card says, and its node in the picture of its trace
  const card = document.querySelector(".card");
  const cell = card && card.querySelector("td.culprit");
  const link = card && card.querySelector('a[href^="#t-"]');
  const section = link && document.getElementById(link.getAttribute("href").slice(1));
  const node = section && section.querySelector("svg.topology [data-culprit-rank]");
  if (!node) return {found: false, cell: cell ? cell.textContent : null};
  node.scrollIntoView({block: "center"});
  const r = node.getBoundingClientRect();
  const style = getComputedStyle(node);
  const hit = document.elementFromPoint(r.x + r.width / 2, r.y + r.height / 2);
  return {found: true, rank: Number(node.dataset.culpritRank), cell: cell ? cell.textContent : null,
          x: r.x, y: r.y, width: r.width, height: r.height, vw: innerWidth, vh: innerHeight,
          visibility: style.visibility, display: style.display, opacity: Number(style.opacity),
          on_top: !!hit && (hit === node || node.contains(hit)),
          fill: getComputedStyle(node.querySelector("circle")).fill};
})()"""


def check_report_page(browser: Chromium, path: str) -> dict:
    """Load ``path`` (a report) and return what the tests assert on: requests, console errors, the
    culprit node's placement and how it and the whole screenshot look."""
    session = browser.new_page()
    url = "file://" + os.path.abspath(path)
    try:
        load = browser.load(session, url)
        probe = browser.evaluate(session, CULPRIT_PROBE)
        png = browser.screenshot(session)
    finally:
        browser.close_page(session)
    box = None
    if probe.get("found"):
        box = {k: probe[k] for k in ("x", "y", "width", "height")}
    stats = browser.image_stats(png, box, (0xE4, 0x57, 0x56))
    return {"url": url, "requests": load.requests, "console_errors": load.console_errors, "probe": probe,
            "screenshot": png, "stats": stats}


def assert_report_page(seen: dict, culprit: int) -> None:
    """What every report page must look like in a browser."""
    assert seen["console_errors"] == [], seen["console_errors"]
    assert seen["requests"] == [seen["url"]], seen["requests"]    # itself, nothing else: no CDN, no fonts
    p = seen["probe"]
    assert p["found"], "no culprit node in the communicator picture"
    assert p["rank"] == culprit and f"rank {culprit}" in p["cell"], p
    assert p["visibility"] == "visible" and p["display"] != "none" and p["opacity"] > 0.9, p
    assert p["width"] > 10 and p["height"] > 10, p
    assert 0 <= p["x"] and p["x"] + p["width"] <= p["vw"] and 0 <= p["y"] and p["y"] + p["height"] <= p["vh"], p
    assert p["on_top"], "the culprit node is covered by another element"
    s = seen["stats"]
    assert s["ink"] > 0.02 and s["colours"] > 20, s                # not a blank (or one-colour) screenshot
    assert s["box_share"] > 0.3, s                                 # the culprit's node is drawn red


def main(argv: list[str]) -> int:
    """``python3 tests/report/chromium.py REPORT.html OUT.png [WIDTH HEIGHT]``: a screenshot of the
    report's top WIDTH x HEIGHT CSS pixels (docs/img/report.png is made this way from a demo run)."""
    if len(argv) not in (2, 4):
        print(main.__doc__)
        return 2
    width, height = (int(argv[2]), int(argv[3])) if len(argv) == 4 else (1000, 1700)
    exe = find_chromium()
    if exe is None:
        print("no Chromium found (scripts/test.sh installs Debian's chromium)")
        return 1
    b = Chromium(exe, width=width, height=900)
    try:
        session = b.new_page()
        load = b.load(session, "file://" + os.path.abspath(argv[0]))
        if load.console_errors or load.requests[1:]:
            print(f"the page is not clean: {load.console_errors} {load.requests}")
            return 1
        png = b.screenshot(session, {"x": 0, "y": 0, "width": width, "height": height})
    finally:
        b.close()
    with open(argv[1], "wb") as f:
        f.write(png)
    print(f"{argv[1]}: {len(png)} bytes")
    return 0


if __name__ == "__main__":
    import sys
    sys.exit(main(sys.argv[1:]))

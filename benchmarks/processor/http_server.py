"""OTLP/HTTP server choice: cost per request and robustness, the Tornado receiver against ``http.server``.

    python benchmarks/processor/http_server.py [--requests N]

Both servers run in this process in the same run, each in front of its own
:class:`Processor`: the current receiver (Tornado on an event loop, ingest on worker
threads) and the stdlib ``ThreadingHTTPServer`` receiver it replaced, loaded from git
history (commit BASELINE_COMMIT) so the baseline is the real old code, not a
re-creation. A separate client process drives them, so the server-side CPU time
measured here is the servers' own.

1. Cost per request: N keep-alive POSTs from 4 client connections, with (a) an empty
   ExportTraceServiceRequest (the HTTP framework alone) and (b) an 8-rank collective
   (~17 KiB, decoded and ingested). Printed: server CPU µs per request and wall time,
   and the ratio new / old.
2. Robustness: legitimate POSTs answered 200 (client timeout 5 s) beside 64 clients
   dripping a byte a second, and over TLS beside one idle TCP connection.
"""

from __future__ import annotations

import argparse
import http.client
import importlib.util
import multiprocessing as mp
import os
import socket
import ssl
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests", "processor"), os.path.join(ROOT, "tests", "reliability")]

BASELINE_COMMIT = "4d688ce"  # the last commit whose receiver served OTLP/HTTP with http.server


def old_receiver_module():
    src = subprocess.run(["git", "-C", ROOT, "show", f"{BASELINE_COMMIT}:mycroft_otel/processor/receiver.py"],
                         check=True, capture_output=True, text=True).stdout
    path = os.path.join(tempfile.mkdtemp(prefix="mycroft-bench-"), "old_receiver.py")
    with open(path, "w") as f:
        f.write(src)
    spec = importlib.util.spec_from_file_location("old_receiver", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def payloads(kind: str, n: int) -> list[bytes]:
    if kind == "empty":
        return [b""] * n
    from synth import Ring
    out = []
    for i in range(n):
        ring = Ring(8, seq=i, comm=0xBE00 + i % 64, t0=1_700_000_000_000_000_000)
        out.append(ring.request().SerializeToString())
    return out


def client(port: int, kind: str, n: int, conns: int, q) -> None:
    import threading
    bodies = payloads(kind, n)
    per = n // conns
    errors = []

    def run(k: int) -> None:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        for b in bodies[k * per:(k + 1) * per]:
            c.request("POST", "/v1/traces", body=b, headers={"Content-Type": "application/x-protobuf"})
            r = c.getresponse()
            r.read()
            if r.status != 200:
                errors.append(r.status)
    ts = [threading.Thread(target=run, args=(k,)) for k in range(conns)]
    time.sleep(0.2)
    t0 = time.perf_counter()
    [t.start() for t in ts]
    [t.join() for t in ts]
    q.put((time.perf_counter() - t0, errors))


def measure(port: int, kind: str, n: int, conns: int = 4) -> tuple[float, float]:
    """(server CPU µs per request, wall µs per request)."""
    q = mp.get_context("spawn").Queue()
    p = mp.get_context("spawn").Process(target=client, args=(port, kind, n, conns, q))
    p.start()
    c0 = time.process_time()
    wall, errors = q.get(timeout=600)
    cpu = time.process_time() - c0
    p.join()
    assert not errors, errors[:5]
    return cpu / n * 1e6, wall / n * 1e6


def legit_posts(port: int, tls: ssl.SSLContext | None, tries: int = 5) -> int:
    from service_helpers import hung_payload, post
    ok = 0
    for i in range(tries):
        try:
            ok += post(port, hung_payload(900 + i), tls=tls, timeout_s=5.0)[0] == 200
        except OSError:
            pass
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=2000)
    args = ap.parse_args()
    from mycroft_otel.processor import Processor
    from mycroft_otel.processor.otlp_http import HttpLimits
    from mycroft_otel.processor.receiver import Receiver
    from service_helpers import Drippers, make_certs

    old = old_receiver_module()
    servers = {"http.server (old)": lambda **kw: old.Receiver(Processor(env={}), grpc_port=None, http_port=0,
                                                             http_timeout_s=10.0, **kw),
               "tornado (new)": lambda **kw: Receiver(Processor(env={}), grpc_port=None, http_port=0,
                                                     limits=HttpLimits(request_timeout_s=10.0), **kw)}
    print(f"1. cost per request, {args.requests} POSTs over 4 keep-alive connections "
          f"(server CPU / wall, µs per request)")
    cost: dict[str, dict[str, tuple[float, float]]] = {}
    for kind in ("empty", "8-rank"):
        for name, make in servers.items():
            rx = make().start()
            try:
                measure(rx.http_port, kind, 200)  # warm-up
                cost.setdefault(kind, {})[name] = measure(rx.http_port, kind, args.requests)
            finally:
                rx.shutdown()
        (oc, ow), (nc, nw) = cost[kind].values()
        print(f"   {kind:7s} request: old {oc:7.1f} / {ow:7.1f}   new {nc:7.1f} / {nw:7.1f}   "
              f"ratio new/old: CPU {nc / oc:.2f}, wall {nw / ow:.2f}")
    print("2. robustness: legitimate POSTs answered 200 (of 5, client timeout 5 s)")
    with tempfile.TemporaryDirectory() as tmp:
        from pathlib import Path
        certs = make_certs(Path(tmp))
        for name, make in servers.items():
            rx = make().start()
            drip = Drippers(rx.http_port, 64).start()
            time.sleep(1.5)
            try:
                beside_drip = legit_posts(rx.http_port, None)
            finally:
                drip.stop()
                rx.shutdown()
            rx = make(tls_cert=certs.cert, tls_key=certs.key).start()
            idle = socket.create_connection(("127.0.0.1", rx.http_port))
            time.sleep(0.3)
            try:
                beside_idle = legit_posts(rx.http_port, certs.client_context())
            finally:
                idle.close()
                rx.shutdown()
            print(f"   {name:18s} beside 64 dripping clients: {beside_drip}/5; "
                  f"HTTPS beside one idle connection: {beside_idle}/5")
    return 0


if __name__ == "__main__":
    sys.exit(main())

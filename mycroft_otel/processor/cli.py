"""``mycroft-otel processor``: OTLP in (gRPC + HTTP) -> root-cause analysis -> root-cause spans + /metrics."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

from mycroft_otel.processor.exporter import RootCauseExporter
from mycroft_otel.processor.metrics import Metrics
from mycroft_otel.processor.pipeline import Processor
from mycroft_otel.processor.receiver import DEFAULT_MAX_BYTES, Receiver


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bind", default="127.0.0.1", help="address of the OTLP and metrics listeners "
                        "(default loopback; 0.0.0.0 for all interfaces)")
    parser.add_argument("--grpc-port", type=int, default=4317, help="OTLP/gRPC port (0: any free; -1: off)")
    parser.add_argument("--http-port", type=int, default=4318, help="OTLP/HTTP port (0: any free; -1: off)")
    parser.add_argument("--metrics-port", type=int, default=9464, help="Prometheus /metrics port (-1: off)")
    parser.add_argument("--max-request-bytes", type=int, default=DEFAULT_MAX_BYTES,
                        help="largest OTLP request accepted (decompressed)")
    parser.add_argument("--tls-cert", help="PEM certificate: serve OTLP over TLS (with --tls-key)")
    parser.add_argument("--tls-key", help="PEM private key for --tls-cert")
    parser.add_argument("--record", metavar="FILE", help="append every received OTLP payload to FILE "
                        "(replay with python -m mycroft_otel.processor.replay FILE)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log every verdict and more")


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if bool(args.tls_cert) != bool(args.tls_key):
        print("mycroft-otel processor: --tls-cert and --tls-key go together", file=sys.stderr)
        return 2
    metrics = Metrics()
    processor = Processor(exporter=RootCauseExporter(), metrics=metrics)
    receiver = Receiver(processor, bind=args.bind, grpc_port=None if args.grpc_port < 0 else args.grpc_port,
                        http_port=None if args.http_port < 0 else args.http_port,
                        max_bytes=args.max_request_bytes, tls_cert=args.tls_cert, tls_key=args.tls_key,
                        metrics=metrics, record=args.record)
    try:
        receiver.start()
        mport = metrics.serve(args.metrics_port, args.bind) if args.metrics_port >= 0 else None
    except OSError as exc:
        print(f"mycroft-otel processor: {exc}", file=sys.stderr)
        receiver.shutdown()
        return 1
    processor.start()
    print(f"mycroft-otel processor: OTLP gRPC {args.bind}:{receiver.grpc_port}, HTTP {args.bind}:{receiver.http_port}"
          f"/v1/traces, metrics {'off' if mport is None else f'{args.bind}:{mport}/metrics'}, "
          f"stall {processor.stall_ms} ms", file=sys.stderr, flush=True)
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    try:
        while not done.wait(1.0):
            pass
    finally:
        receiver.shutdown()
        processor.shutdown()
        metrics.shutdown()
    return 0

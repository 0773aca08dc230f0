"""``mycroft-otel processor``: OTLP in (gRPC + HTTP) -> root-cause analysis -> root-cause spans + /metrics."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import signal
import socket
import sys
import threading

from mycroft_otel.processor.checkpoint import Checkpoint
from mycroft_otel.processor.exporter import RootCauseExporter
from mycroft_otel.processor.metrics import Metrics
from mycroft_otel.processor.pipeline import Processor
from mycroft_otel.processor.published import PublishedVerdicts
from mycroft_otel import config
from mycroft_otel.config import ConfigError
from mycroft_otel.processor.otlp_http import HttpLimits
from mycroft_otel.processor.receiver import DEFAULT_MAX_BYTES, Receiver
from mycroft_otel.processor.settings import Settings
from mycroft_otel.redact import check_headers


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bind", default="127.0.0.1", help="address of the OTLP and metrics listeners "
                        "(default loopback; 0.0.0.0 for all interfaces)")
    parser.add_argument("--grpc-port", type=int, default=4317, help="OTLP/gRPC port (0: any free; -1: off)")
    parser.add_argument("--http-port", type=int, default=4318, help="OTLP/HTTP port (0: any free; -1: off)")
    parser.add_argument("--metrics-port", type=int, default=9464, help="Prometheus /metrics (and /runbook) port (-1: off)")
    parser.add_argument("--max-request-bytes", type=int, default=DEFAULT_MAX_BYTES,
                        help="largest OTLP request accepted (decompressed)")
    parser.add_argument("--tls-cert", help="PEM certificate: serve OTLP over TLS (with --tls-key)")
    parser.add_argument("--tls-key", help="PEM private key for --tls-cert")
    parser.add_argument("--token-file", metavar="FILE", help="require this bearer token (the file's one line) on "
                        "both OTLP receivers (default: $MYCROFT_OTLP_TOKEN; none when unset)")
    parser.add_argument("--request-timeout", type=float, default=10.0, metavar="S",
                        help="OTLP/HTTP: seconds for a request's whole header block, and again for its whole "
                        "body (default %(default)s)")
    parser.add_argument("--max-connections", type=int, default=HttpLimits.max_connections,
                        help="OTLP/HTTP: open connections at most (default %(default)s)")
    parser.add_argument("--max-connections-per-client", type=int, default=HttpLimits.max_connections_per_client,
                        help="OTLP/HTTP: open connections from one client address at most (default %(default)s)")
    parser.add_argument("--max-json-bytes", type=int, default=HttpLimits.max_json_bytes,
                        help="OTLP/HTTP: largest JSON request body, also after gzip (default %(default)s; JSON "
                        "costs far more to parse than protobuf)")
    parser.add_argument("--state-dir", metavar="DIR", help="keep the published verdicts and a checkpoint of "
                        "the detector's learned history here (a directory of this user, created 0700): a processor "
                        "restarted on it goes on where it stopped and does not publish a verdict again")
    parser.add_argument("--record", metavar="FILE", help="append every received OTLP payload to FILE "
                        "(replay with python -m mycroft_otel.processor.replay FILE)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log every verdict and more")


def _token(args: argparse.Namespace) -> str | None:
    """The receivers' bearer token: --token-file, else MYCROFT_OTLP_TOKEN (never a command-line value: ps shows
    those to every user of the machine)."""
    if args.token_file:
        try:
            with open(args.token_file, encoding="utf-8") as f:
                token = f.read().strip()
        except OSError as exc:
            raise ConfigError(f"--token-file {args.token_file}: {exc.strerror}") from None
        if not token:
            raise ConfigError(f"--token-file {args.token_file} is empty")
        return token
    return config.get_str("MYCROFT_OTLP_TOKEN").strip() or None


def own_runbook_url(bind: str, port: int) -> str:
    """This processor's /runbook as a reader of the page may reach it: at the bound address, or at the
    machine's FQDN when it listens on every interface."""
    host = socket.getfqdn() if bind in ("", "0.0.0.0", "::") else bind
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/runbook"


def _bad_args(args: argparse.Namespace) -> str:
    """What is wrong with the command line's limits and TLS files, or ""."""
    if bool(args.tls_cert) != bool(args.tls_key):
        return "--tls-cert and --tls-key go together"
    if not 0 < args.request_timeout <= 3600 or args.max_connections < 1 or args.max_connections_per_client < 1:
        return "--request-timeout must be in (0, 3600] s, --max-connections and --max-connections-per-client >= 1"
    if args.max_json_bytes < 1 or args.max_request_bytes < 1:
        return "--max-request-bytes and --max-json-bytes must be >= 1"
    return ""


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    bad = _bad_args(args)
    if bad:
        print(f"mycroft-otel processor: {bad}", file=sys.stderr)
        return 2
    for var in ("OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS"):
        if os.environ.get(var, "").strip():
            check_headers(var, os.environ[var])  # before the SDK's exporter would log a bad one, value and all
    token = _token(args)
    settings = Settings.from_env()
    published = PublishedVerdicts(args.state_dir) if args.state_dir else None
    history = Checkpoint(args.state_dir) if args.state_dir else None
    metrics = Metrics()
    try:  # first: the page links to this server's /runbook, at the port it bound
        mport = metrics.serve(args.metrics_port, args.bind) if args.metrics_port >= 0 else None
    except OSError as exc:
        print(f"mycroft-otel processor: {exc}", file=sys.stderr)
        return 1
    if not settings.runbook_url and mport is not None:
        settings = dataclasses.replace(settings, runbook_url=own_runbook_url(args.bind, mport))
    processor = Processor(exporter=RootCauseExporter(), metrics=metrics, published=published, settings=settings,
                          checkpoint=history)
    receiver = Receiver(processor, bind=args.bind, grpc_port=None if args.grpc_port < 0 else args.grpc_port,
                        http_port=None if args.http_port < 0 else args.http_port,
                        max_bytes=args.max_request_bytes, tls_cert=args.tls_cert, tls_key=args.tls_key,
                        metrics=metrics, record=args.record, token=token,
                        limits=HttpLimits(request_timeout_s=args.request_timeout,
                                          max_connections=args.max_connections,
                                          max_connections_per_client=args.max_connections_per_client,
                                          max_json_bytes=args.max_json_bytes))
    try:
        receiver.start()
    except OSError as exc:
        print(f"mycroft-otel processor: {exc}", file=sys.stderr)
        receiver.shutdown()
        metrics.shutdown()
        return 1
    processor.start()
    print(f"mycroft-otel processor: OTLP gRPC {args.bind}:{receiver.grpc_port}, HTTP {args.bind}:{receiver.http_port}"
          f"/v1/traces, metrics {'off' if mport is None else f'{args.bind}:{mport}/metrics'}, "
          f"stall {processor.stall_ms} ms, {'TLS' if args.tls_cert else 'plaintext'}, "
          f"{'bearer token required' if token else 'no authentication'}", file=sys.stderr, flush=True)
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
        for kept in (published, history):
            if kept is not None:
                kept.close()
    return 0

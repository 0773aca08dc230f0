"""``mycroft-otel agent``: one per node; follows the rings in the ring directory and exports spans."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading

from mycroft_otel.agent.agent import Agent
from mycroft_otel.agent.health import MetricsServer, register_otel_metrics
from mycroft_otel.agent.meter import meter_provider, metrics_config
from mycroft_otel.agent.metrics import CollectiveMetrics
from mycroft_otel.agent.settings import AgentSettings


SHUTDOWN_S = 5.0  # SIGTERM (or SIGINT) to exit, at most
FLUSH_S = 3.0     # of which the final flush of pending spans may take this long


def _exit_late() -> None:
    logging.getLogger("mycroft_otel.agent").error("shutdown took longer than %.1f s: exiting now", SHUTDOWN_S - 0.5)
    logging.shutdown()
    os._exit(1)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ring-dir", help="directory of the plugin's shared-memory files (default MYCROFT_RING_DIR)")
    parser.add_argument("--state-dir", help="where cursors persist across restarts (default MYCROFT_STATE_DIR, "
                                            "else $XDG_STATE_HOME/mycroft-otel or ~/.local/state/mycroft-otel)")
    parser.add_argument("--metrics-port", type=int, default=None,
                        help="serve the agent's own counters in Prometheus format on this port (0: any free port)")
    parser.add_argument("--metrics-bind", default="127.0.0.1", help="address of the metrics port (default loopback)")
    parser.add_argument("--once", action="store_true", help="poll once, flush, exit (cron-style use and tests)")
    parser.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level, format="%(asctime)s mycroft-otel agent %(levelname)s %(message)s")
    settings = AgentSettings.from_env(ring_dir=args.ring_dir, state_dir=args.state_dir)
    mcfg = metrics_config()
    collective = CollectiveMetrics() if mcfg.enabled else None
    agent = Agent(settings, metrics=collective)
    provider = None
    if collective is not None:  # the agent's own health and the collective metrics, per OTEL_*
        provider = meter_provider(mcfg, collective, [("service.name", settings.service_name)])
        register_otel_metrics(agent.health, provider)
        agent.plugin.register(provider)
    server = None
    if args.metrics_port is not None:
        server = MetricsServer(agent.health, args.metrics_port, args.metrics_bind, extra=[agent.plugin])
        logging.getLogger("mycroft_otel.agent").info("metrics on http://%s:%d/metrics", args.metrics_bind,
                                                     server.port)
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        if stop.is_set():
            os._exit(128 + signum)  # a second signal: now
        stop.set()
        # the promise is SHUTDOWN_S from SIGTERM to exit, whatever the collector or a ring does: the flush
        # (FLUSH_S) and the cursor save normally end well before; if not, exit without them (at most one poll
        # of spans is exported again by the next agent)
        hard = threading.Timer(SHUTDOWN_S - 0.5, _exit_late)
        hard.daemon = True
        hard.start()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    try:
        if args.once:
            agent.poll_once()
        else:
            agent.run(stop)
    finally:
        agent.close(FLUSH_S)
        if provider is not None:
            provider.shutdown(timeout_millis=1000)  # a last export of what the final poll aggregated
        if server:
            server.close()
    return 0

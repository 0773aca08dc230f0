"""``mycroft-otel agent``: one per node; follows the rings in the ring directory and exports spans."""

from __future__ import annotations

import argparse
import logging
import signal
import threading

from mycroft_otel.agent.agent import Agent
from mycroft_otel.agent.health import MetricsServer, register_otel_metrics
from mycroft_otel.agent.metrics import CollectiveMetrics, meter_provider, metrics_config
from mycroft_otel.agent.settings import AgentSettings


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
    server = None
    if args.metrics_port is not None:
        server = MetricsServer(agent.health, args.metrics_port, args.metrics_bind)
        logging.getLogger("mycroft_otel.agent").info("metrics on http://%s:%d/metrics", args.metrics_bind,
                                                     server.port)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        if args.once:
            agent.poll_once()
        else:
            agent.run(stop)
    finally:
        agent.close()
        if provider is not None:
            provider.shutdown()  # a last export of what the final poll aggregated
        if server:
            server.close()
    return 0

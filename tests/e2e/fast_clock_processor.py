"""``mycroft-otel processor`` whose open incidents run on a clock SPEED times real time.

    python fast_clock_processor.py SPEED processor --bind ... (the processor's own arguments)

The incidents' clock (Processor's ``incident_clock``) decides when a page ends for silence; everything else
(stall detection, the trace store, the receivers) stays on real time, so the analysis is the product's and
a 15-minute hang takes 15 * 60 / SPEED seconds.
"""

from __future__ import annotations

import sys
import time

from mycroft_otel import cli
from mycroft_otel.processor import pipeline


def main() -> int:
    speed = float(sys.argv[1])
    t0 = time.monotonic()

    def clock() -> float:
        return t0 + (time.monotonic() - t0) * speed

    init = pipeline.Processor.__init__

    def with_clock(self, *args, **kwargs) -> None:
        kwargs.setdefault("incident_clock", clock)
        init(self, *args, **kwargs)

    pipeline.Processor.__init__ = with_clock  # type: ignore[method-assign]
    return cli.main(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())

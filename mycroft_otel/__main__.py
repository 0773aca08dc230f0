"""``python -m mycroft_otel`` is the ``mycroft-otel`` command."""

import sys

from mycroft_otel.cli import main

sys.exit(main())

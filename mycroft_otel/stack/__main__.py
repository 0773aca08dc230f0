"""``python -m mycroft_otel.stack``: run the local stack until Ctrl-C (see runner.py)."""

import sys

from mycroft_otel.stack.runner import main

sys.exit(main())

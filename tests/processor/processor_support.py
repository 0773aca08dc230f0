"""Helpers shared by the processor tests (plain functions; the fixtures live in conftest.py)."""

from __future__ import annotations

import os
import socket

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

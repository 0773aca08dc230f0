"""Fixtures of the Grafana tests (helpers live in grafana_helpers.py)."""

from __future__ import annotations

import pytest

from grafana_helpers import load_dashboards, load_datasource_uids


@pytest.fixture(scope="session")
def dashboards() -> dict[str, dict]:
    return load_dashboards()


@pytest.fixture(scope="session")
def datasource_uids() -> dict[str, str]:
    return load_datasource_uids()

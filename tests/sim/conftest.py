import pytest

from _simtools import _plugin_or_skip


@pytest.fixture
def plugin() -> str:
    return _plugin_or_skip()

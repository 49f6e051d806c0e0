"""The live SSE server every observe test talks to (tests/observe/sse_server.py)."""

from __future__ import annotations

import pytest

from .sse_server import SSEServer


@pytest.fixture
def server():
    srv = SSEServer().start()
    yield srv
    srv.stop()

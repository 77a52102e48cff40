"""Wait until something accepts connections on a port (tests/test_readme.py, for the servers it starts)."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable


def wait(port: int, deadline: float, alive: Callable[[], bool] = lambda: True) -> bool:
    while time.monotonic() < deadline and alive():
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return True
        except OSError:
            time.sleep(0.05)
    return False

"""Wait until something accepts connections on each given port (used by README sessions in tests).

    python -m tests.readme_wait PORT...     exit 0 when all listen, 1 after 30 s
"""

from __future__ import annotations

import socket
import sys
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


if __name__ == "__main__":
    limit = time.monotonic() + 30
    sys.exit(0 if all(wait(int(port), limit) for port in sys.argv[1:]) else 1)

"""`chaosproxy stdio` in front of a launcher (a wrapper script, as `npx` and `uvx` are): the server
behind it is never orphaned, whether the relay is signalled or killed."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import anyio
import pytest
from mcp import Client

from tests.helpers.stdio_support import WAIT, alive, children, gone_within, proxied, relay_pid

LAUNCHER = '''\
#!/bin/sh
# a wrapper script: the shell stays as the server's parent
"{python}" -m tests.helpers.stdio_server --stubborn
echo "launcher: server exited" >&2
'''


@pytest.fixture
def launcher(tmp_path: Path) -> list[str]:
    """A wrapper script starting tests/helpers/stdio_server.py, which ignores SIGTERM and the end of its stdin."""
    path = tmp_path / "launch.sh"
    path.write_text(LAUNCHER.format(python=sys.executable))
    path.chmod(0o755)
    return [str(path)]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
async def test_a_server_behind_a_launcher_goes_with_its_relay(tmp_path: Path, launcher: list[str], sig: int):
    log = tmp_path / "log.jsonl"
    with anyio.fail_after(WAIT):
        async with Client(proxied(log, server=launcher)) as session:
            server = int((await session.call_tool("pid")).content[0].text)
            relay = relay_pid(str(log))
            assert server not in children(relay)  # the launcher is between them
            os.kill(relay, sig)  # the relay alone, as a host that stops its server by pid
            gone = await anyio.to_thread.run_sync(gone_within, server, 10)
            if alive(server):
                os.kill(server, signal.SIGKILL)
    assert gone, f"the server outlived its relay ({sig.name})"

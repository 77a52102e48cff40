"""The perturbation log under rotation, a full disk and shutdown, through a real `chaosproxy run`."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.helpers.support import free_port, log_events, wait_listening


class Proxy:
    def __init__(self, proc: subprocess.Popen[bytes], port: int) -> None:
        self.proc, self.port = proc, port

    def get(self, count: int = 1) -> None:
        for _ in range(count):
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
            conn.request("GET", "/api/weather?city=oslo")
            assert conn.getresponse().status == 200
            conn.close()

    def stop(self) -> str:
        self.proc.send_signal(signal.SIGTERM)
        _, err = self.proc.communicate(timeout=10)
        return err.decode()


@pytest.fixture
def start(upstream: str) -> Iterator[Callable[[Path], Proxy]]:
    procs: list[subprocess.Popen[bytes]] = []

    def run(log: Path) -> Proxy:
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", "chaosproxy", "run", "--upstream", upstream,
                                 "--listen", f"127.0.0.1:{port}", "--log", str(log)], stderr=subprocess.PIPE)
        procs.append(proc)
        wait_listening(port, proc)
        return Proxy(proc, port)

    yield run
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def calls(path: Path) -> int:
    return len(log_events(path, "call"))


def eventually(check: Callable[[], bool], timeout: float = 5) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline
        time.sleep(0.05)


@pytest.mark.slow
def test_sigusr1_reopens_the_log_for_logrotate(start, tmp_path: Path):
    log = tmp_path / "chaos.jsonl"
    proxy = start(log)
    proxy.get(3)
    eventually(lambda: calls(log) == 3)
    log.rename(tmp_path / "chaos.jsonl.1")
    proxy.get(2)  # still the old file: its descriptor is open
    proxy.proc.send_signal(signal.SIGUSR1)
    eventually(log.exists)
    proxy.get(4)
    eventually(lambda: calls(log) == 4)
    assert "perturbation log reopened" in proxy.stop()
    assert calls(tmp_path / "chaos.jsonl.1") == 5
    assert calls(log) == 4


@pytest.mark.slow
def test_a_full_disk_never_stops_proxying_and_the_kept_lines_land_later(start, tmp_path: Path):
    log = tmp_path / "chaos.jsonl"
    log.symlink_to("/dev/full")  # every write fails with ENOSPC
    proxy = start(log)
    proxy.get(20)
    time.sleep(0.6)  # a few flush attempts
    proxy.get(5)
    log.unlink()
    real = tmp_path / "real.jsonl"
    real.touch()
    log.symlink_to(real)  # space again, as logrotate or an operator would make it
    proxy.proc.send_signal(signal.SIGUSR1)
    eventually(lambda: real.stat().st_size > 0 and calls(real) == 25)
    err = proxy.stop()
    assert err.count("cannot write the perturbation log") == 1, err
    assert "is written again" in err
    events = [json.loads(line)["event"] for line in real.read_text().splitlines()]
    assert events[0] == "run" and events.count("call") == 25


@pytest.mark.slow
def test_every_call_line_is_flushed_at_shutdown(start, tmp_path: Path):
    log = tmp_path / "chaos.jsonl"
    for _ in range(3):
        proxy = start(log)
        proxy.get(7)
        proxy.stop()  # at once: the batch has not been written yet
    assert calls(log) == 21
    assert os.stat(log).st_size > 0

"""Run a command as a stdio MCP server would run, passing the pipes through, and keep a copy of every
byte it writes to stdout in a file: what one side of a stdio relay sent, to compare with the other side.

  python -m tests.helpers.stdio_tee OUT_FILE -- COMMAND [ARGS...]
"""

from __future__ import annotations

import subprocess
import sys
import threading


def main() -> None:
    out, command = sys.argv[1], sys.argv[sys.argv.index("--") + 1:]
    child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert child.stdin is not None and child.stdout is not None

    def feed() -> None:  # our stdin to the child's, until it ends
        for chunk in iter(lambda: sys.stdin.buffer.read1(65536), b""):
            child.stdin.write(chunk)
            child.stdin.flush()
        child.stdin.close()

    threading.Thread(target=feed, daemon=True).start()
    with open(out, "wb", buffering=0) as copy:
        for chunk in iter(lambda: child.stdout.read1(65536), b""):
            copy.write(chunk)
            sys.stdout.buffer.write(chunk)
            sys.stdout.buffer.flush()
    sys.exit(child.wait())


if __name__ == "__main__":
    main()

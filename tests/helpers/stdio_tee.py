"""Run a command as a stdio MCP server would run, passing the pipes through, and keep a copy of every
byte it writes to stdout in a file: what one side of a stdio relay sent, to compare with the other side.

  python -m tests.helpers.stdio_tee OUT_FILE -- COMMAND [ARGS...]
"""

from __future__ import annotations

import io
import subprocess
import sys
import threading


def main() -> None:
    out, command = sys.argv[1], sys.argv[sys.argv.index("--") + 1:]
    child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert isinstance(child.stdin, io.BufferedWriter) and isinstance(child.stdout, io.BufferedReader)
    ours = sys.stdin.buffer
    assert isinstance(ours, io.BufferedReader)
    to_child, from_child = child.stdin, child.stdout

    def feed() -> None:  # our stdin to the child's, until it ends
        for chunk in iter(lambda: ours.read1(65536), b""):
            to_child.write(chunk)
            to_child.flush()
        to_child.close()

    threading.Thread(target=feed, daemon=True).start()
    with open(out, "wb", buffering=0) as copy:
        for chunk in iter(lambda: from_child.read1(65536), b""):
            copy.write(chunk)
            sys.stdout.buffer.write(chunk)
            sys.stdout.buffer.flush()
    sys.exit(child.wait())


if __name__ == "__main__":
    main()

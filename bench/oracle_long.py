"""The data plane's differential oracle (tests/adapters/test_oracle.py) over many more examples than CI runs:
every path, compiled and from source, against direct.

    python bench/oracle_long.py [EXAMPLES]     # default 2000, about a minute per thousand per form
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    examples = sys.argv[1] if len(sys.argv) > 1 else "2000"
    status = 0
    for form, extra in (("the installed form", {}), ("the Python sources", {"CHAOSPROXY_NO_EXTENSIONS": "1"})):
        env = {**os.environ, "CHAOSPROXY_ORACLE_EXAMPLES": examples, **extra}
        print(f"oracle, {examples} examples, {form}", flush=True)
        status |= subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                  "tests/adapters/test_oracle.py"], cwd=ROOT, env=env, timeout=3600).returncode
    return status


if __name__ == "__main__":
    sys.exit(main())

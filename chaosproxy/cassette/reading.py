"""A cassette from wherever it is: a folder recorded by chaosproxy, or a VCR.py cassette file."""

from __future__ import annotations

from pathlib import Path

from chaosproxy.cassette.format import Cassette, is_vcr, read_folder
from chaosproxy.cassette.vcr import read_vcr


def read_cassette(source: Path) -> Cassette:
    """A cassette folder (or its cassette.jsonl), or a VCR.py cassette (.yaml, .yml, .json). Raises
    CassetteError naming the file, the line (or interaction) and the reason."""
    return read_vcr(source) if is_vcr(source) else read_folder(source)

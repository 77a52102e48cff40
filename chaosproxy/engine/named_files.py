"""Files a scenario names (a paraphrase `mapping:`): where they may lie, and how they are read.

A scenario can come from someone else (a drill file, `PUT /scenario` on an open loopback port), and
what a file holds can reach the agent (a mapping's phrases end up in tool descriptions). So a file a
scenario names must lie under the scenario's own folder or a folder given with `--scenario-dir`; a
relative name is looked up in those folders in that order; symlinks are followed before the check.
Reading refuses anything but a regular file (a FIFO would block for ever) and anything over the size
cap, and its errors never quote the file's content.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaosproxy.engine.yaml_limits import MAX_DOCUMENT_BYTES


@dataclass(slots=True)
class ScenarioFiles:
    """The folders one scenario may read files from, and the files it read (each read once)."""

    roots: tuple[Path, ...]
    anywhere: bool = False  # an in-process caller (Python code, tests) may name any file
    _loaded: dict[Path, Any] = field(default_factory=dict)

    @classmethod
    def beside(cls, scenario: Path, scenario_dirs: Iterable[Path] = ()) -> ScenarioFiles:
        """For a scenario file: its own folder first, then the `--scenario-dir` folders."""
        return cls.under([scenario.parent, *scenario_dirs])

    @classmethod
    def under(cls, folders: Iterable[Path]) -> ScenarioFiles:
        """For a scenario with no file of its own (sent over the control API): only these folders."""
        roots = dict.fromkeys(Path(folder).expanduser().resolve() for folder in folders)
        return cls(tuple(roots))

    @classmethod
    def trusted(cls) -> ScenarioFiles:
        """For Python callers, who can read any file anyway: relative names from the working directory."""
        return cls((Path.cwd(),), anywhere=True)

    def resolve(self, name: Path, what: str) -> Path:
        """The file `name` refers to, or ValueError when it lies outside every allowed folder."""
        name = name.expanduser()
        candidates = [name.resolve()] if name.is_absolute() else [(root / name).resolve() for root in self.roots]
        allowed = [path for path in candidates if self.anywhere or any(path.is_relative_to(r) for r in self.roots)]
        if not allowed:
            if not self.roots:
                raise ValueError(f"{what} file {name}: a scenario sent over the control API may name files only "
                                 "under --scenario-dir or the start-up scenario's folder, and there is none")
            raise ValueError(f"{what} file {name} is outside the folders a scenario may read from "
                             "(its own folder and --scenario-dir)")
        return next((path for path in allowed if path.exists()), allowed[0])

    def load[T](self, path: Path, parse: Callable[[str, Path], T], what: str) -> T:
        """`parse(text, path)` of the file's text, read once per scenario, within the size cap."""
        if path not in self._loaded:
            try:
                text = read_capped(path)
            except ValueError as exc:
                raise ValueError(f"{what} file {path} {exc}") from None
            self._loaded[path] = parse(text, path)
        loaded: T = self._loaded[path]  # (stored as Any: each file has its own parse)
        return loaded


def read_capped(path: Path, limit: int = MAX_DOCUMENT_BYTES) -> str:
    """A regular file's UTF-8 text, up to `limit` bytes; ValueError saying why not, never what it holds."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)  # a FIFO opens at once, not on a writer
    except FileNotFoundError:
        raise ValueError("does not exist") from None
    except OSError as exc:
        raise ValueError(f"cannot be read: {exc.strerror or type(exc).__name__}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError("is not a regular file")
        if info.st_size > limit:
            raise ValueError(f"is {info.st_size} bytes, more than the {limit >> 10} KiB allowed")
        data = os.read(fd, limit + 1)
    except OSError as exc:
        raise ValueError(f"cannot be read: {exc.strerror or type(exc).__name__}") from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise ValueError(f"is more than the {limit >> 10} KiB allowed")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("is not UTF-8 text") from None

"""Reading YAML that may come from hostile hands (PUT /scenario, a file someone else wrote).

A few hundred bytes of aliases can stand for billions of nodes, and thousands of nested brackets
exhaust Python's stack. Documents are therefore capped in size, composed by libyaml (fast, and it
refuses nesting past 1000 itself), and their node graph is checked before anything walks it as a
tree: nesting depth, node count with every alias expanded, recursive aliases, duplicate keys. Each
check visits a node once, however many aliases point at it.
"""

from __future__ import annotations

from typing import Any

import yaml

from chaosproxy.errors import ConfigError

MAX_DOCUMENT_BYTES = 256 << 10  # a hand-written scenario is a few KiB; 256 KiB parses in ~0.2 s
MAX_DEPTH = 64  # collections inside collections; orjson and pydantic refuse far less deep data anyway
MAX_EXPANDED_NODES = 100_000  # nodes once every alias is expanded (an alias bomb's real size)

BaseLoader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class BoundedLoader(BaseLoader):  # type: ignore[valid-type,misc]
    """The safe loader (libyaml's when installed); use it through `compose`, which applies the limits."""


class YamlProblems(ConfigError):
    """Problems with a YAML document, one 'SOURCE:LINE: reason' string each."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


def compose(loader: yaml.SafeLoader, source: str, *, quote: bool = True) -> tuple[yaml.Node | None, Any]:
    """The node tree (for line numbers) and its data, once the document passed every limit.

    Raises YamlProblems with the line of a syntax error, of a limit exceeded, or of each key given
    twice (YAML would quietly keep the last one and hide the mistake). With `quote` False the
    messages name lines only, never the document's words: it may be a file its sender should not read.
    """
    try:
        root = loader.get_single_node()
        if root is not None:
            _check_shape(root, source)
        data = loader.construct_document(root) if root is not None else None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f"{mark.line + 1}" if mark is not None else "1"
        reason = getattr(exc, "problem", None) or type(exc).__name__
        raise YamlProblems([f"{source}:{line}: invalid YAML: {reason}"]) from None
    except RecursionError:  # a loader without libyaml composes recursively
        raise YamlProblems([f"{source}:1: nested deeper than {MAX_DEPTH} levels"]) from None
    finally:
        loader.dispose()
    if root is not None and (duplicates := _duplicate_keys(root, source, quote)):
        raise YamlProblems(duplicates)
    return root, data


def check_size(text: str | bytes, source: str) -> None:
    if len(text) > MAX_DOCUMENT_BYTES:
        raise YamlProblems([f"{source}:1: {len(text)} bytes is more than the {MAX_DOCUMENT_BYTES >> 10} KiB "
                            "a scenario may have"])


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _check_shape(root: yaml.Node, source: str) -> None:
    """Depth, expanded size and cycles, in one iterative pass that visits each node once."""
    expanded: dict[int, int] = {}  # id(node) -> its size with aliases expanded, once known
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, int, bool]] = [(root, 1, False)]
    while stack:
        node, depth, children_done = stack.pop()
        key = id(node)
        if children_done:
            on_path.discard(key)
            size = 1 + sum(expanded[id(child)] for child in _children(node))
            if size > MAX_EXPANDED_NODES:
                raise YamlProblems([f"{source}:{node.start_mark.line + 1}: aliases expand this document past "
                                    f"{MAX_EXPANDED_NODES} nodes"])
            expanded[key] = size
            continue
        if key in on_path:
            raise YamlProblems([f"{source}:{node.start_mark.line + 1}: an alias refers to a node that contains it"])
        if key in expanded:
            continue
        if depth > MAX_DEPTH:
            raise YamlProblems([f"{source}:{node.start_mark.line + 1}: nested deeper than {MAX_DEPTH} levels"])
        children = _children(node)
        if not children:
            expanded[key] = 1
            continue
        on_path.add(key)
        stack.append((node, depth, True))
        stack.extend((child, depth + 1, False) for child in reversed(children) if id(child) not in expanded)


def _duplicate_keys(root: yaml.Node, source: str, quote: bool) -> list[str]:
    """Keys given twice in one mapping, each mapping checked once (aliases are not followed again)."""
    problems: list[str] = []
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            first_line: dict[Any, int] = {}
            for key, _ in node.value:
                line = key.start_mark.line + 1
                if isinstance(key, yaml.ScalarNode) and key.value in first_line:
                    name = f" {key.value!r}" if quote else ""
                    problems.append(f"{source}:{line}: duplicate key{name} (first on line {first_line[key.value]})")
                elif isinstance(key, yaml.ScalarNode):
                    first_line[key.value] = line
        stack.extend(reversed(_children(node)))
    return problems

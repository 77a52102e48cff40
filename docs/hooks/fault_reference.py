"""The fault reference (docs/faults.md), written from the registry when the site is built (an mkdocs hook).

Each fault type gets its component, level, summary, parameters (type, default, what each says), what it
reproduces and an example rule. The last two come from the bundled scenario that uses the type (one in
`scenarios/<component>/` first: its `# Reproduces:` comment and its rule); a type without one fails the
build, naming the scenario to write. `python docs/hooks/fault_reference.py` prints the page's text.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ROOT / "scenarios"
MARKER = "<!-- fault-reference -->"


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    """mkdocs: put the generated reference where faults.md has the marker."""
    return markdown.replace(MARKER, fault_reference()) if MARKER in markdown else markdown


def fault_reference() -> str:
    """An overview table, then a section per fault, by component in the registry's order."""
    from chaosproxy.faults import Component, all_faults

    faults = all_faults()
    bundled = bundled_examples()
    parts = ["| type | component | level | what it does |", "|---|---|---|---|"]
    parts += [f"| [`{name}`](#{name}) | {cls.component} | {cls.level} | {_cell(cls.summary())} |"
              for name, cls in sorted(faults.items(), key=by_component)]
    for component in Component:
        parts.append(f"\n## {component.value.capitalize()}\n")
        for name, cls in sorted(faults.items()):
            if cls.component == component:
                parts.append(fault_section(name, cls, bundled.get(name)))
    return "\n".join(parts)


def by_component(item: tuple[str, Any]) -> tuple[int, str]:
    """Sort key of a (type, class) pair: its component in the registry's order, then its type."""
    from chaosproxy.faults import Component

    name, cls = item
    return list(Component).index(cls.component), name


def fault_section(name: str, cls: Any, bundled: tuple[Path, str, dict[str, Any]] | None) -> str:
    """One fault's section: heading, summary, parameters, what it reproduces, an example rule."""
    if bundled is None:  # tests/faults/test_scenario_library.py asks for one too
        raise ValueError(f"fault {name}: no bundled scenario uses it (scenarios/{cls.component}/{name}.yaml)")
    path, reproduces, rule = bundled
    return "\n".join([
        f"### `{name}` {{#{name}}}", "", f"**{cls.component}** · level `{cls.level}` · {cls.summary()}", "",
        *parameter_table(cls), "",
        f"**Reproduces:** {reproduces or cls.summary()} (`{path.relative_to(ROOT)}`)", "",
        "Example, from that scenario:", "",
        "```yaml", yaml.safe_dump({"rules": [rule]}, sort_keys=False, width=100).rstrip(), "```", ""])


def _former(key: str, info: Any) -> str:
    """A parameter's former names, still read (`at` of `phase`)."""
    former = [name for name in getattr(info.validation_alias, "choices", ()) if name != key]
    return f" (formerly {', '.join(f'`{name}`' for name in former)}, still read)" if former else ""


def parameter_table(cls: Any) -> list[str]:
    schema = cls.model_json_schema()
    properties = schema.get("properties", {})
    rows = []
    for key, info in cls.model_fields.items():
        if key == "type":
            continue
        default = "required" if info.is_required() else f"`{_show(info.get_default(call_default_factory=True))}`"
        kind = _kind(properties.get(key, {}), schema.get("$defs", {}))
        rows.append(f"| `{key}` | {_cell(kind)} | {default} | {_cell((info.description or '') + _former(key, info))} |")
    if not rows:
        return ["No parameters."]
    return ["| parameter | type | default | what it says |", "|---|---|---|---|", *rows]


def _kind(prop: dict[str, Any], defs: dict[str, Any]) -> str:
    """A parameter's type in a few words, from its JSON Schema: enum values, or the JSON types."""
    if "$ref" in prop:
        prop = defs.get(prop["$ref"].rsplit("/", 1)[-1], {})
    if "enum" in prop:
        return ", ".join(f"`{value}`" for value in prop["enum"])
    if "const" in prop:
        return f"`{prop['const']}`"
    if "anyOf" in prop or "oneOf" in prop:
        kinds = [_kind(option, defs) for option in prop.get("anyOf", prop.get("oneOf", []))]
        return " or ".join(dict.fromkeys(kind for kind in kinds if kind != "null")) or "null"
    kind = prop.get("type", "any")
    if kind == "array":
        return f"list of {_kind(prop.get('items', {}), defs)}"
    return str(kind)


def _show(value: Any) -> str:
    if hasattr(value, "value"):  # an enum member
        value = value.value
    return json.dumps(value, default=str)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def bundled_examples() -> dict[str, tuple[Path, str, dict[str, Any]]]:
    """For each fault type a bundled scenario uses: that scenario (one in its component's folder first), what
    it reproduces, and its first rule of that type."""
    from chaosproxy.faults import all_faults

    found: dict[str, list[tuple[Path, str, dict[str, Any]]]] = {}
    for path in sorted(SCENARIOS.glob("*/*.yaml")):
        if path.parent.name == "suites":
            continue
        text = path.read_text()
        for rule in (yaml.safe_load(text) or {}).get("rules", []):
            kind = rule.get("fault", {}).get("type")
            if kind in all_faults() and all(found_path != path for found_path, _, _ in found.get(kind, [])):
                found.setdefault(kind, []).append((path, reproduces(text), rule))
    return {kind: min(uses, key=lambda use: use[0].parent.name != all_faults()[kind].component)
            for kind, uses in found.items()}


def reproduces(text: str) -> str:
    """The `# Reproduces:` paragraph of a scenario's comment header, as one line."""
    comment = [line[1:].strip() for line in text.splitlines() if line.startswith("#")]
    paragraph: list[str] = []
    for line in comment:
        if line.startswith("Reproduces:"):
            paragraph.append(line.removeprefix("Reproduces:").strip())
        elif paragraph and not re.match(r"^[A-Z][\w -]*:", line):
            paragraph.append(line)
        elif paragraph:
            break
    return " ".join(paragraph)


if __name__ == "__main__":
    print(fault_reference())

"""The paper's text from its template and the numbers the build computed: nothing else goes into it.

Two kinds of placeholder, both in double braces so Markdown's own characters never clash:

    {{sim.math7b.april.rollout_speedup:.3f}}     a value of numbers.json under its dotted key, Python format spec
    {{table:policies_math7b}}                     a table of numbers.json["tables"], its cells formatted as it says

A table is stored as {"columns": [...], "formats": [...], "rows": [[...], ...]}: raw values and the format spec of
each column ("" for text), so the JSON holds the numbers and the text holds them formatted, one way.
A placeholder that names no value is an error naming it; so is a value whose format spec does not fit it.
"""

from __future__ import annotations

import math
import re

PLACEHOLDER = re.compile(r"\{\{([^{}]+)\}\}")
MISSING = "-"  # a NaN cell in a table (a column that does not apply to that row)


def lookup(numbers: dict, key: str):
    """The value under a dotted key. Keys are flat ("sim.math7b.april.speedup" is one key), tables nested."""
    if key.startswith("table:"):
        name = key[len("table:"):]
        tables = numbers.get("tables", {})
        if name not in tables:
            raise KeyError(f"template names table {name!r}; the build made {', '.join(sorted(tables)) or 'none'}")
        return tables[name]
    if key not in numbers:
        raise KeyError(f"template names {key!r}, which numbers.json does not hold")
    return numbers[key]


def format_value(value, spec: str) -> str:
    """`value` under a Python format spec; NaN and None print as '-' (a figure that does not apply)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return MISSING
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    return format(value, spec) if spec else str(value)


def markdown_table(table: dict) -> str:
    """A stored table as a Markdown table, each cell under its column's format."""
    columns, formats, rows = table["columns"], table["formats"], table["rows"]
    if len(columns) != len(formats):
        raise ValueError(f"table has {len(columns)} columns but {len(formats)} formats")
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        if len(row) != len(columns):
            raise ValueError(f"table row {row!r} has {len(row)} cells for {len(columns)} columns")
        lines.append("| " + " | ".join(format_value(v, f) for v, f in zip(row, formats)) + " |")
    return "\n".join(lines)


def render(template: str, numbers: dict) -> str:
    """Every placeholder of `template` replaced by its value in `numbers`; KeyError/ValueError naming the first
    placeholder that cannot be filled."""

    def fill(match: re.Match) -> str:
        body = match.group(1).strip()
        if body.startswith("table:"):
            return markdown_table(lookup(numbers, body))
        key, _, spec = body.partition(":")
        value = lookup(numbers, key)
        try:
            return format_value(value, spec)
        except (ValueError, TypeError) as e:
            raise ValueError(f"placeholder {{{{{body}}}}}: cannot format {value!r} as {spec!r} ({e})") from None

    return PLACEHOLDER.sub(fill, template)


def placeholders(template: str) -> list[str]:
    """The keys the template names (tables as 'table:NAME'), in order, each once."""
    keys = [m.group(1).strip().partition(":")[0] if not m.group(1).strip().startswith("table:") else m.group(1).strip()
            for m in PLACEHOLDER.finditer(template)]
    return list(dict.fromkeys(keys))


def placeholder_formats(template: str) -> dict[str, set[str]]:
    """Each number the template names, with every format spec it is printed under ('' for plain str())."""
    formats: dict[str, set[str]] = {}
    for m in PLACEHOLDER.finditer(template):
        key, _, spec = m.group(1).strip().partition(":")
        if key != "table":
            formats.setdefault(key, set()).add(spec)
    return formats


def table(frame, formats: dict[str, str]) -> dict:
    """A frame (its index a column if named) as a stored table: the columns of `formats`, in that order, with
    their format specs; numpy scalars become plain Python numbers for JSON."""
    flat = frame.reset_index() if frame.index.name else frame
    missing = [c for c in formats if c not in flat.columns]
    if missing:
        raise ValueError(f"table: no column {', '.join(missing)}; have {', '.join(map(str, flat.columns))}")
    rows = [[plain(v) for v in rec] for rec in flat[list(formats)].itertuples(index=False, name=None)]
    return {"columns": list(formats), "formats": list(formats.values()), "rows": rows}


def plain(value):
    """A JSON-able Python scalar from a numpy/pandas one."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None  # JSON has no NaN; None renders as '-'
    return value


__all__ = ["render", "placeholders", "lookup", "format_value", "markdown_table", "table", "plain"]

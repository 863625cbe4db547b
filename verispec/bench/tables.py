"""Markdown table cells and tables shared by the reports: a value or '-', a value with its 95% interval."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

Column = tuple[str, Callable[[dict[str, Any]], str]]  # (header, cell formatter of one aggregate row)


def fmt(value: Any, spec: str, suffix: str = "") -> str:
    """Return `value` formatted with `spec` and `suffix`, or '-' when it is None."""
    return "-" if value is None else format(value, spec) + suffix


def value_column(header: str, key: str, spec: str, suffix: str = "") -> Column:
    """Return the column `header` showing an aggregate row's `key` formatted with `spec` and `suffix` ('-' when
    the row lacks it or it is None)."""
    return header, lambda row: fmt(row.get(key), spec, suffix)


def ci_cell(row: dict[str, Any], key: str = "speedup") -> str:
    """Return the 95% interval `[lo, hi]` of `key` in an aggregate row, or '-'."""
    ci = row.get(f"{key}_ci95")
    return "-" if not ci else f"[{ci[0]:.2f}, {ci[1]:.2f}]"


def with_ci(row: dict[str, Any], key: str, spec: str, count: bool = False, suffix: str = "") -> str:
    """Return `value [lo, hi]` (and `, n = prompts` with `count`) of an aggregate with a 95% interval."""
    value, ci = row.get(key), row.get(f"{key}_ci95")
    if value is None:
        return "-"
    text = format(value, spec) + suffix + (f" [{ci[0]:{spec}}, {ci[1]:{spec}}]" if ci else "")
    return text + (f", n = {row.get(f'{key}_prompts')}" if count else "")


def in_ms(row: dict[str, Any], key: str) -> dict[str, Any]:
    """Return `row` with `key` and its 95% interval converted from seconds to milliseconds."""
    value, ci = row.get(key), row.get(f"{key}_ci95")
    return {**row, key: value and 1000 * value, f"{key}_ci95": ci and [1000 * x for x in ci]}


# The table `verispec compare` prints (and always has).
COMPACT_COLUMNS: list[Column] = [
    ("method", lambda r: str(r["method"])),
    ("tokens", lambda r: str(r["tokens"])),
    value_column("tokens/s", "tokens_per_second", ".2f"),
    ("ms/token", lambda r: fmt(r.get("seconds_per_token") and 1000 * r["seconds_per_token"], ".1f")),
    value_column("speedup", "speedup", ".2f", "x"),
    value_column("acceptance", "acceptance_rate", ".3f"),
    value_column("tokens/target call", "tokens_per_target_call", ".2f"),
]

def format_table(rows: Sequence[dict[str, Any]], columns: Sequence[Column] = COMPACT_COLUMNS) -> str:
    """Return the aggregate rows as a markdown table with `columns` (header, formatter)."""
    lines = ["| " + " | ".join(h for h, _ in columns) + " |",
             "|---|" + "---:|" * (len(columns) - 1)]
    lines += ["| " + " | ".join(cell(r) for _, cell in columns) + " |" for r in rows]
    return "\n".join(lines)

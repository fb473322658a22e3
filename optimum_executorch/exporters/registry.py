"""The two operations every registry here needs: add a name once, look it up with a helpful error."""

from typing import Any, Dict

from ..utils import suggest

__all__ = ["register", "lookup", "suggest"]


def register(table: Dict[str, Any], name: str, value: Any, what: str) -> Any:
    if name in table:
        raise ValueError(f"{what} '{name}' is registered twice: {table[name]!r} and {value!r}.")
    table[name] = value
    return value


def lookup(table: Dict[str, Any], name: str, what: str) -> Any:
    """`table[name]`, or a ValueError naming the supported values and the closest one."""
    if name not in table:
        raise ValueError(
            f"{what} '{name}' is not supported.{suggest(name, table)} "
            f"Supported {what.lower()}s: {', '.join(sorted(table))}."
        )
    return table[name]

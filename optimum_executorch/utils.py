"""Small helpers shared by the export side, the runtime side and the CLI (standard library only)."""

import difflib


def suggest(name: str, choices) -> str:
    """` Did you mean 'x'?` for the closest choice, or an empty string."""
    close = difflib.get_close_matches(str(name), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" Did you mean '{close[0]}'?" if close else ""

"""The source scan behind the "one reader" tests (test_typed_input, test_json_files): lines of the installed package
outside ``scalevec/config`` that match a pattern a local reader would need, less the allow-listed ones."""

from __future__ import annotations

import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "scalevec"


def lines_outside_config(pattern: re.Pattern, allowed) -> list[str]:
    """``"module:line: text"`` for each line of ``src/scalevec`` outside ``config/`` that ``pattern`` matches, except
    where ``allowed`` holds a ``(module, substring)`` pair with that module and a substring of the line."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith("config/"):
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line) and not any(rel == f and s in line for f, s in allowed):
                found.append(f"{rel}:{n}: {line.strip()}")
    return found

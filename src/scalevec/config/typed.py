"""Typed reading of parsed input: the type tests of YAML or JSON values, and how an error quotes a value.

``is_int`` and ``is_number`` are the one rule of what a count and a number are in a parsed file (a ``bool`` is
neither: ``true`` is an ``int`` to Python but no count in a file); ``short`` is how every error message quotes a
value that came from a file or the command line (cut, never walked whole).
"""

from __future__ import annotations

import math
from typing import Any


def is_int(value: Any, least: int | None = None, most: int | None = None) -> bool:
    """Whether ``value``, as YAML or JSON parsing gives it, is a whole number in ``[least, most]`` (either bound
    optional): an ``int`` and not a ``bool`` (``True`` is an ``int`` to Python, and ``true`` in a file is no
    count), not a float (``2.0``) or text. Each reader keeps its own message; the rule lives here."""
    return (isinstance(value, int) and not isinstance(value, bool) and (least is None or value >= least)
            and (most is None or value <= most))


def is_number(value: Any, above: float | None = None, least: float | None = None, finite: bool = True) -> bool:
    """Whether ``value`` is a number as YAML or JSON parsing gives it (an ``int`` or a ``float``, not a ``bool``),
    finite (``finite=False``: NaN and infinities pass, for a reader that tests them after), ``> above`` and
    ``>= least`` when given. Text is not a number here: YAML 1.1's ``1e-3`` string is the caller's to convert."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if finite and not math.isfinite(value):
        return False
    return (above is None or value > above) and (least is None or value >= least)


SHORT = 60  # the most characters of a value an error message quotes


def short(value: Any, limit: int = SHORT) -> str:
    """``repr(value)`` cut to ``limit`` characters (with ``...``): what an error message quotes of a value that
    came from a file or the command line. Never walks more of a large value than a bounded prefix."""
    if isinstance(value, (list, tuple, dict)):
        text = _short_container(value, limit)
    else:
        text = repr(value if not isinstance(value, str) else value[: limit + 1])
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _short_container(value: Any, limit: int) -> str:
    # reprs the first few items only: a list of 100,000 values (or a DAG of shared lists) is never walked whole
    if isinstance(value, dict):
        items = [f"{_short_container(k, limit) if isinstance(k, (list, tuple, dict)) else repr(k)[:limit]}: "
                 f"{_short_container(v, limit) if isinstance(v, (list, tuple, dict)) else repr(v)[:limit]}"
                 for k, v in list(value.items())[:4]]
        return "{" + ", ".join(items)[:limit + 1] + ("" if len(value) <= 4 else ", ...") + "}"
    items = [_short_container(v, limit) if isinstance(v, (list, tuple, dict)) else repr(v)[:limit]
             for v in list(value[:4])]
    return "[" + ", ".join(items)[:limit + 1] + ("" if len(value) <= 4 else ", ...") + "]"



__all__ = ["SHORT", "is_int", "is_number", "short"]

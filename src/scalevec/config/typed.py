"""The one typed reader of parsed input: counts, numbers, flags, choices and kinds of YAML or JSON values.

Every reader of user input (a config file's fields, a sweep or study file, a Hugging Face ``config.json``, a
prepared-data manifest, the arguments of the drop-in API) takes its values through here, so that one rule says
what a count, a number or a flag is, and one form says what is wrong. A value of the wrong kind or out of range
raises ``ValueError`` in one line naming where it came from and the key, the rule, an example, the value as given
and the fix::

    {where}{key} must be {rule}[, like {like}]; got {value}[; {fix}]

e.g. ``study.yaml.study.max_seeds must be a whole number >= 2, like 20; got 2.5`` or ``config.json:
num_attention_heads must be a whole number >= 1, like 32; got 0; fix config.json``.

The rules: a count is an ``int`` and never a ``bool`` (``true`` is an ``int`` to Python but no count in a file)
nor a float (``2.0``) or text; a number is an ``int`` or a ``float``, not a ``bool``, finite unless said
otherwise; a flag is a ``bool`` (the text ``"false"`` is truthy, so it is refused). ``short`` is how a message
quotes a value (cut, never walked whole). The predicates ``is_int`` / ``is_number`` serve the readers of
machine-written files (a checkpoint's train state, a metrics row) that skip rather than refuse a value.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

SHORT = 60  # the most characters of a value an error message quotes
REQUIRED = object()  # the default of a field that must be present
KIND_NAMES = {str: "text", dict: "a mapping", list: "a list"}  # what read_kind's message calls each kind


# --------------------------------------------------------------------------------------------- predicates


def is_int(value: Any, least: int | None = None, most: int | None = None) -> bool:
    """Whether ``value``, as YAML or JSON parsing gives it, is a whole number in ``[least, most]`` (either bound
    optional): an ``int`` and not a ``bool`` (``True`` is an ``int`` to Python, and ``true`` in a file is no
    count), not a float (``2.0``) or text."""
    return (isinstance(value, int) and not isinstance(value, bool) and (least is None or value >= least)
            and (most is None or value <= most))


def is_number(value: Any, above: float | None = None, least: float | None = None, most: float | None = None,
              finite: bool = True) -> bool:
    """Whether ``value`` is a number as YAML or JSON parsing gives it (an ``int`` or a ``float``, not a ``bool``),
    finite (``finite=False``: NaN and infinities pass, for a reader that tests them after), ``> above``,
    ``>= least`` and ``<= most`` when given. Text is not a number here (``yaml_number`` converts YAML 1.1's
    ``1e-3``, which it reads as text)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if finite and not math.isfinite(value):
        return False
    return (above is None or value > above) and (least is None or value >= least) and (most is None or value <= most)


def yaml_number(value: Any) -> Any:
    """``value`` with numeric text turned into the number (YAML 1.1 reads ``1e-3``, without a dot, as text):
    ``"1e-3"`` -> 0.001, ``"12"`` -> 12; anything else unchanged."""
    if isinstance(value, str):
        try:
            f = float(value)
        except ValueError:
            return value
        return int(f) if f.is_integer() and re.fullmatch(r"[-+]?\d+", value.strip()) else f
    return value


# --------------------------------------------------------------------------------------------- readers


def bad_input(at: str, rule: str, value: Any, like: Any = None, fix: str = "", show_type: bool = False) -> ValueError:
    """The one error of typed reading, in one line: ``{at} must be {rule}[, like {like}]; got {value}[; {fix}]``.

    ``at`` names where the value came from and its key (``study.yaml.study.extend``, ``config.json: head_dim``);
    ``like`` is an example of a good value (text as written, else its repr); ``value`` is quoted by ``short``, with
    its Python type after it when ``show_type`` (``got 1e+30 (a float)``: a config field's reader names it)."""
    example = "" if like is None else f", like {like if isinstance(like, str) else short(like)}"
    name = type(value).__name__
    kind = f" ({'an' if name[0] in 'aeiou' else 'a'} {name})" if show_type else ""
    return ValueError(f"{at} must be {rule}{example}; got {short(value)}{kind}" + (f"; {fix}" if fix else ""))


def _bounds(least: float | None = None, most: float | None = None, above: float | None = None) -> str:
    parts = [f"> {above:g}" if above is not None else "", f">= {least:g}" if least is not None else "",
             f"<= {most:g}" if most is not None else ""]
    return " and ".join(p for p in parts if p)


def read_int(value: Any, at: str, *, least: int | None = None, most: int | None = None, like: Any = None,
             fix: str = "") -> int:
    """``value`` if it is a whole number in ``[least, most]`` (``is_int``), else ``bad_input`` (a ``ValueError``
    naming ``at``, the rule, ``like``, the value and ``fix``)."""
    if not is_int(value, least, most):
        raise bad_input(at, " ".join(filter(None, ["a whole number", _bounds(least, most)])), value, like, fix)
    return value


def read_number(value: Any, at: str, *, above: float | None = None, least: float | None = None,
                most: float | None = None, finite: bool = True, text: bool = False, like: Any = None,
                fix: str = "") -> float:
    """``value`` as a float if it is a number (``is_number``: finite unless ``finite=False``, ``> above``,
    ``>= least``, ``<= most``), else ``bad_input``. ``text``: numeric text counts (``yaml_number``: YAML 1.1's
    ``1e-3``)."""
    x = yaml_number(value) if text else value
    if not is_number(x, above, least, most, finite):
        rule = " ".join(filter(None, ["a finite number" if finite else "a number", _bounds(least, most, above)]))
        raise bad_input(at, rule, value, like, fix)
    return float(x)


def read_flag(value: Any, at: str, *, fix: str = "") -> bool:
    """``value`` if it is a ``bool`` (``true`` / ``false``), else ``bad_input``: the text ``"false"`` would be
    truthy, and ``1`` is a count, not a flag."""
    if not isinstance(value, bool):
        raise bad_input(at, "true or false", value, fix=fix)
    return value


def read_choice(value: Any, at: str, choices: tuple | list, *, fix: str = "") -> Any:
    """``value`` if it is one of ``choices`` (compared with ``==``, so ``1`` never matches ``"1"``), else
    ``bad_input`` listing them."""
    if isinstance(value, (list, dict)) or value not in choices:
        raise bad_input(at, "one of " + ", ".join(map(str, choices)), value, fix=fix)
    return value


def read_kind(value: Any, at: str, kind: type, *, like: Any = None, fix: str = "") -> Any:
    """``value`` if it is a ``kind`` (``str``, ``dict`` or ``list``: ``KIND_NAMES``), else ``bad_input``."""
    if not isinstance(value, kind):
        raise bad_input(at, KIND_NAMES.get(kind, kind.__name__), value, like, fix)
    return value


def read_ints(value: Any, at: str, *, least: int | None = None, most: int | None = None, distinct: bool = False,
              rule: str = "", like: Any = None, fix: str = "") -> list[int]:
    """``value`` as a list if it is a list of whole numbers in ``[least, most]`` (each ``is_int``), with no value
    twice when ``distinct``; else ``bad_input`` with ``rule`` (default: spelled from the bounds)."""
    ok = isinstance(value, list) and all(is_int(v, least, most) for v in value)
    if not ok or (distinct and len(set(value)) < len(value)):
        rule = rule or " ".join(filter(None, ["a list of", "distinct" if distinct else "", "whole numbers",
                                              _bounds(least, most)]))
        raise bad_input(at, rule, value, like, fix)
    return list(value)


class Fields:
    """Typed reads of one parsed mapping, each naming ``where + key`` in its error and ending with ``fix``::

        conf = Fields(json_dict, "config.json: ", fix="fix config.json", null_is_absent=True)
        d_model = conf.int("hidden_size", least=1)           # required
        eps = conf.number("rms_norm_eps", 1e-6, above=0)     # optional: the default when absent

    A key that is absent (or null, with ``null_is_absent``: a transformers ``config.json`` writes null for unset
    fields) gives its ``default``, unchecked; without a default it is an error: ``{where}{key} is missing; {fix}``.
    Without ``null_is_absent`` a null is a value like any other, and refused by every rule. ``like`` defaults to the
    field's default, when it has one."""

    def __init__(self, data: Mapping, where: str = "", fix: str = "", null_is_absent: bool = False):
        self.data, self.where, self.fix, self.null_is_absent = data, where, fix, null_is_absent

    def get(self, key: str, default: Any = REQUIRED) -> tuple[Any, bool]:
        """``(value, given)``: the value of ``key``, or ``(default, False)`` when it is absent; raises
        ``ValueError`` for an absent key without a default."""
        if key in self.data and not (self.null_is_absent and self.data[key] is None):
            return self.data[key], True
        if default is REQUIRED:
            raise ValueError(f"{self.where}{key} is missing" + (f"; {self.fix}" if self.fix else ""))
        return default, False

    def _like(self, like: Any, default: Any) -> Any:
        return like if like is not None or default in (REQUIRED, None) else default

    def int(self, key: str, default: Any = REQUIRED, *, least: int | None = None, most: int | None = None,
            like: Any = None) -> Any:
        """``read_int`` of ``key`` (``default`` when absent)."""
        value, given = self.get(key, default)
        return read_int(value, self.where + key, least=least, most=most, like=self._like(like, default),
                        fix=self.fix) if given else value

    def number(self, key: str, default: Any = REQUIRED, *, above: float | None = None, least: float | None = None,
               most: float | None = None, finite: bool = True, text: bool = False, like: Any = None) -> Any:
        """``read_number`` of ``key`` (``default`` when absent)."""
        value, given = self.get(key, default)
        return read_number(value, self.where + key, above=above, least=least, most=most, finite=finite, text=text,
                           like=self._like(like, default), fix=self.fix) if given else value

    def flag(self, key: str, default: Any = REQUIRED) -> Any:
        """``read_flag`` of ``key`` (``default`` when absent)."""
        value, given = self.get(key, default)
        return read_flag(value, self.where + key, fix=self.fix) if given else value

    def choice(self, key: str, choices: tuple | list, default: Any = REQUIRED) -> Any:
        """``read_choice`` of ``key`` (``default`` when absent)."""
        value, given = self.get(key, default)
        return read_choice(value, self.where + key, choices, fix=self.fix) if given else value

    def kind(self, key: str, kind: type, default: Any = REQUIRED, *, like: Any = None) -> Any:
        """``read_kind`` of ``key`` (``default`` when absent)."""
        value, given = self.get(key, default)
        return read_kind(value, self.where + key, kind, like=like, fix=self.fix) if given else value

    def ints(self, key: str, default: Any = REQUIRED, *, least: int | None = None, most: int | None = None,
             distinct: bool = False, rule: str = "", like: Any = None) -> Any:
        """``read_ints`` of ``key`` (``default`` when absent)."""
        value, given = self.get(key, default)
        return read_ints(value, self.where + key, least=least, most=most, distinct=distinct, rule=rule,
                         like=self._like(like, default), fix=self.fix) if given else value


# --------------------------------------------------------------------------------------------- quoting


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


__all__ = ["SHORT", "REQUIRED", "KIND_NAMES", "is_int", "is_number", "yaml_number", "bad_input", "read_int",
           "read_number", "read_flag", "read_choice", "read_kind", "read_ints", "Fields", "short"]

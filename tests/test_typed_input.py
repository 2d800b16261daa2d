"""The one typed reader of parsed input (config/typed.py, DESIGN.md §12): each check's rule and its one-line message
"where.key must be RULE[, like EXAMPLE]; got VALUE[; FIX]", and that no reader outside the config package keeps its
own int/number/flag test."""

from __future__ import annotations

import math
import re

import pytest

from scalevec.config.typed import (
    Fields,
    bad_input,
    read_choice,
    read_flag,
    read_int,
    read_ints,
    read_kind,
    read_number,
    yaml_number,
)
from source_grep import lines_outside_config

# (call, the whole message it must raise)
REFUSED = [
    (lambda: read_int(True, "s.n", least=0), "s.n must be a whole number >= 0; got True"),
    (lambda: read_int(2.0, "s.n"), "s.n must be a whole number; got 2.0"),
    (lambda: read_int("3", "s.n", least=1, like=4), "s.n must be a whole number >= 1, like 4; got '3'"),
    (lambda: read_int(9, "s.n", least=1, most=8, fix="lower it"), "s.n must be a whole number >= 1 and <= 8; got 9; "
                                                                   "lower it"),
    (lambda: read_number(math.inf, "s.x", above=0), "s.x must be a finite number > 0; got inf"),
    (lambda: read_number(False, "s.x", finite=False), "s.x must be a number; got False"),
    (lambda: read_number("abc", "s.x", text=True, like="1e-3"), "s.x must be a finite number, like 1e-3; got 'abc'"),
    (lambda: read_number(101, "s.x", above=1, most=100), "s.x must be a finite number > 1 and <= 100; got 101"),
    (lambda: read_flag("false", "s.f"), "s.f must be true or false; got 'false'"),
    (lambda: read_flag(1, "s.f", fix="write true"), "s.f must be true or false; got 1; write true"),
    (lambda: read_choice("x", "s.c", ("a", "b")), "s.c must be one of a, b; got 'x'"),
    (lambda: read_kind(5, "s.t", str), "s.t must be text; got 5"),
    (lambda: read_kind("x", "s.m", dict), "s.m must be a mapping; got 'x'"),
    (lambda: read_ints([1, 1], "s.l", least=0, distinct=True), "s.l must be a list of distinct whole numbers >= 0; "
                                                               "got [1, 1]"),
    (lambda: read_ints([1.5], "s.l", rule="a list of seeds"), "s.l must be a list of seeds; got [1.5]"),
]


@pytest.mark.parametrize("call, message", REFUSED, ids=[m.split(" must")[0] + ":" + m[-12:] for _, m in REFUSED])
def test_each_check_refuses_in_the_one_message_form(call, message):
    """A value of the wrong kind or range raises ValueError whose text is exactly the rule's one-line form."""
    with pytest.raises(ValueError) as err:
        call()
    assert str(err.value) == message


def test_each_check_returns_the_good_value():
    """A good value comes back (numbers as float; numeric YAML 1.1 text with ``text=True``)."""
    assert read_int(0, "k", least=0) == 0 and read_int(2**70, "k") == 2**70
    assert read_number(3, "k", above=0) == 3.0 and isinstance(read_number(3, "k"), float)
    assert read_number("1e-3", "k", text=True) == 1e-3 and math.isnan(read_number(math.nan, "k", finite=False))
    assert read_flag(False, "k") is False and read_choice("b", "k", ("a", "b")) == "b"
    assert read_ints([3, 1], "k", least=0, distinct=True) == [3, 1] and read_kind([], "k", list) == []
    assert yaml_number("12") == 12 and isinstance(yaml_number("12"), int) and yaml_number("1e2") == 100.0
    assert yaml_number("x") == "x" and yaml_number(None) is None


def test_a_long_or_multiline_value_stays_one_short_line():
    """The value is quoted by ``short``: a 10,000-character text or a newline never breaks the one line."""
    msg = str(bad_input("f.k", "a whole number", "x" * 10_000 + "\n" + "y"))
    assert "\n" not in msg and len(msg) < 120 and msg.endswith("...")


def test_a_config_field_is_read_in_the_same_form_with_its_type():
    """The codec's field reader (from_dict, overrides) refuses in the one form and names the value's Python type:
    a float in an int field (8.0, 1e30) is never truncated into a count."""
    from scalevec.config import RunConfig, TrainConfig
    from scalevec.config.codec import apply_overrides, from_dict

    with pytest.raises(ValueError, match=r"^train\.steps must be a whole number; got 1e\+30 \(a float\)$"):
        from_dict(TrainConfig, {"steps": 1e30}, "train.")
    with pytest.raises(ValueError, match=r"^model\.tie_embeddings must be true or false; got 'maybe' \(a str\)$"):
        apply_overrides(RunConfig(), ["model.tie_embeddings=maybe"])
    with pytest.raises(ValueError, match=r"^optim\.betas must be a list, like \[a,b\] or a,b; got \{'a': 1\} "
                                         r"\(a dict\)$"):
        apply_overrides(RunConfig(), ["optim.betas={a: 1}"])


def test_fields_default_missing_and_null():
    """Fields: an absent key gives its default (unchecked); a required one is "missing" with the fix; a null is a
    value unless ``null_is_absent``; ``like`` defaults to the field's default."""
    f = Fields({"a": 1.5, "b": None}, "cfg.", fix="edit cfg")
    assert f.int("absent", 7, least=0) == 7 and f.number("a", above=0) == 1.5
    with pytest.raises(ValueError, match=r"^cfg\.zz is missing; edit cfg$"):
        f.int("zz")
    with pytest.raises(ValueError, match=r"^cfg\.a must be a whole number >= 0, like 4; got 1\.5; edit cfg$"):
        f.int("a", 4, least=0)
    with pytest.raises(ValueError, match=r"^cfg\.b must be true or false; got None; edit cfg$"):
        f.flag("b", False)
    assert Fields({"b": None}, null_is_absent=True).flag("b", False) is False


# hand-written type tests a reader of user input would keep instead of calling config/typed.py
ARG = r"(?:[^,()]|\([^()]*\))+"  # isinstance's first argument, one level of calls allowed: m.get("documents")
LOCAL_READER = re.compile(rf"isinstance\({ARG}, ?\((int, ?float|float, ?int)[^)]*\)\)|isinstance\({ARG}, ?(bool|int)\)"
                          r"|def _(\w+_)?(int|float|flag|bool|positive|nonnegative|number)\(")
# what stays, and why: formatting, not reading (sweep_grid, wd_guard); the JSON-safety of a metrics
# row (monitors); a tensor index (prepared); an argparse value already an int or "auto" (evaluation)
ALLOWED = {("experiments/sweep_grid.py", "isinstance(v, float)"),
           ("training/monitors.py", "(str, int, float, bool)"), ("data/prepared.py", "(int, np.integer)"),
           ("hf/evaluation.py", "isinstance(batch_size, int)")}


def test_no_local_int_number_or_flag_reader_outside_the_config_package():
    """Outside scalevec/config, no module tests ``isinstance(x, int)``, ``(int, float)`` or ``bool`` on input or
    defines its own ``_int`` / ``_float`` / ``_flag``: every such check is ``is_int`` / ``is_number`` / a reader."""
    found = lines_outside_config(LOCAL_READER, ALLOWED)
    assert not found, "local type tests; use scalevec.config.typed:\n" + "\n".join(found)

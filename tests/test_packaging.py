"""The package's declared Python matches what its pins and its tests support (pyproject.toml, constraints.txt)."""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import PackageNotFoundError, metadata
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def lowest(spec: str) -> Version:
    """The lowest Python X.Y a ``Requires-Python`` specifier admits (checked from 3.0 to 3.99)."""
    s = SpecifierSet(spec)
    return next(Version(f"3.{m}") for m in range(100) if Version(f"3.{m}") in s)


def pinned() -> list[str]:
    """The package names constraints.txt pins (``name==version``)."""
    lines = (ROOT / "constraints.txt").read_text().splitlines()
    return [m.group(1) for line in lines if (m := re.match(r"^([A-Za-z0-9_.\-]+)==", line.strip()))]


def test_requires_python_admits_no_python_the_pins_exclude():
    """requires-python's lowest Python is one every pinned, installed package supports (numpy 2.4 needs 3.11;
    the project said 3.10)."""
    ours = lowest(pyproject()["project"]["requires-python"])
    needed = {}
    for name in pinned():
        try:
            req = metadata(name).get("Requires-Python")
        except PackageNotFoundError:  # a pin of an optional extra not installed here
            continue
        if req:
            needed[name] = lowest(req)
    assert needed, "no pinned package is installed"
    worst = max(needed.values())
    assert ours >= worst, f"requires-python admits {ours}, but {[n for n, v in needed.items() if v == worst]} " \
                          f"need >= {worst}"


def test_ruff_targets_the_lowest_supported_python():
    """ruff's target-version is requires-python's lowest version (its rewrites must run there)."""
    ours = lowest(pyproject()["project"]["requires-python"])
    assert pyproject()["tool"]["ruff"]["target-version"] == f"py{ours.major}{ours.minor}"

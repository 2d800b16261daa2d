"""Names for groups of runs: which config keys define a cell, a model size, and a cell's short label (DESIGN.md §9).

Heuristics, kept apart from the statistics: the primary settings (preset, optimizer, schedule, tokens,
data, tokenizer) name a cell; keys those imply, or that a named bundle of the sweep grid sets, are left
out of its label; keys under ``preset``, ``model.`` and ``train.`` are "size" keys (what a scaling fit
varies). ``Labeler`` turns a cell's key into ``d96 · optimizer=adamw · schedule=cosine · tokens=1,024,000``.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from scalevec.config.run_budget import run_tokens
from scalevec.config.typed import is_number
from scalevec.experiments.records import RunRecord

SIZE_PREFIXES = ("preset", "model.", "train.")  # varying keys that define a model size / token budget

PRIMARY_KEYS = ("preset", "optim.name", "schedule.name", "train.tokens", "data.source", "data.tokenizer")

SHORT = {"optim.name": "optimizer", "schedule.name": "schedule", "train.tokens": "tokens", "data.source": "data",
         "data.tokenizer": "tokenizer", "optim.lr": "lr"}


def varying_keys(runs: list[RunRecord]) -> list[str]:
    keys = sorted({k for r in runs for k in r.flat})
    return [k for k in keys if len({r.flat.get(k) for r in runs}) > 1]


def is_size_key(k: str) -> bool:
    return k.startswith(SIZE_PREFIXES)


def si(n: float) -> str:
    for unit, div in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.3g}{unit}"
    return f"{n:g}"


class Labeler:
    """Short human labels for cells: the sweep's bundle names, the primary settings, other varying keys.

    A key is left out when the primary keys (preset, optimizer, schedule, tokens, data) determine it
    (e.g. ``model.n_layers`` given the preset) or when a named bundle of the sweep grid sets it.
    """

    def __init__(self, runs: list[RunRecord], keys: list[str], spec: dict):
        self.keys = keys
        primary = [k for k in keys if k in PRIMARY_KEYS]
        self.implied = set()
        for k in keys:
            groups: dict[tuple, set] = defaultdict(set)
            for r in runs:
                groups[tuple(r.flat.get(p) for p in primary)].add(r.flat.get(k))
            if k not in primary and primary and all(len(v) == 1 for v in groups.values()):
                self.implied.add(k)
        self.axes = [[(str(v["name"]), {k: x for k, x in v.items() if k != "name"}) for v in values
                      if isinstance(v, dict) and "name" in v]
                     for values in (spec.get("grid") or {}).values() if isinstance(values, list)]
        self.bundles = [b for axis in self.axes for b in axis]
        self.bundle_keys = {k for _, b in self.bundles for k in b}

    def bundle_names(self, run: RunRecord) -> list[str]:
        """Per grid axis of named bundles, the most specific bundle whose every field matches ``run``."""
        def matches(k: str, x: Any) -> bool:
            if k in ("preset", "strategy"):
                return getattr(run.cfg, k) == x
            v = run.flat.get(k)
            return k == "tokens_per_param" or v == x or (isinstance(v, tuple) and list(v) == x) or (
                is_number(v, finite=False) and is_number(x, finite=False) and float(v) == float(x))

        names = []
        for axis in self.axes:
            hits = [(len(b), name) for name, b in axis if all(matches(k, x) for k, x in b.items())]
            if hits:
                names.append(max(hits)[1])
        return names

    def size(self, run: RunRecord) -> str:
        names = [n for n, b in self.bundles if n in self.bundle_names(run) and any(is_size_key(k) for k in b)]
        return "+".join(names) or run.cfg.preset

    def label(self, key: tuple, run: RunRecord, sizes: bool = True) -> str:
        """``d96 · optimizer=adamw · schedule=cosine · tokens=1,024,000`` (without the size parts when
        ``sizes`` is False: the label of a scaling group)."""
        c = run.cfg
        names = self.bundle_names(run)
        tokens = (run.summary or {}).get("tokens") or run_tokens(c)
        parts = {"preset": c.preset, "optimizer": c.optim.name, "schedule": c.schedule.name, "tokens": f"{tokens:,}"}
        if names and "preset" in self.bundle_keys:
            parts.pop("preset")
        if not sizes:
            parts = {k: v for k, v in parts.items() if k not in ("preset", "tokens")}
            names = [n for n, b in self.bundles if n in names and not any(is_size_key(k) for k in b)]
        for k, v in key:
            short = SHORT.get(k, k.split(".")[-1] if k.startswith("model.") else k)
            if (k in self.implied or k in ("train.steps", "train.tokens") or short in parts
                    or (names or not sizes) and k in self.bundle_keys or (not sizes and is_size_key(k))):
                continue
            parts[short] = v
        return " · ".join(names + [f"{k}={v}" for k, v in parts.items()]) or "all runs"


__all__ = ["Labeler", "PRIMARY_KEYS", "SHORT", "SIZE_PREFIXES", "is_size_key", "si", "varying_keys"]

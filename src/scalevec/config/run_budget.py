"""Run arithmetic: what a run costs and uses, computed from its config (DESIGN.md §8, §9, §12).

The one step counter (``train_steps`` / ``total_steps``), the tokens of a step and of a run, a budget of
tokens per parameter, and the CPUs a run may use. Pure functions of a config (``usable_cpus``: of this
process's affinity mask); this module edits no config and builds nothing (the schemas: ``schema.py``;
their files: ``codec.py``, ``files.py``; the vocabulary fitted to a tokenizer: ``resolve.fit_vocab``).
"""

from __future__ import annotations

import os

from scalevec.config import RunConfig, TrainConfig
from scalevec.config.typed import read_number

TOKEN_LIMIT = 2**63  # a run's tokens and sample indices are int64 counters (data/sampler.py)


def tokens_per_step(cfg: RunConfig) -> int:
    """Tokens of one optimizer step: the global batch, ``train.batch_size × train.seq_len``."""
    return cfg.train.batch_size * cfg.train.seq_len


def train_steps(t: TrainConfig) -> int:
    """Optimizer steps of a run with training section ``t`` (the one step counter): ``ceil(train.tokens /
    (batch_size × seq_len))`` when ``train.tokens`` is set, else ``train.steps``."""
    if t.tokens > 0:
        return -(-t.tokens // (t.batch_size * t.seq_len))  # whole numbers: a float quotient overflows past 1e308
    return t.steps


def total_steps(cfg: RunConfig) -> int:
    """Optimizer steps of the run: ``train_steps(cfg.train)``."""
    return train_steps(cfg.train)


def run_tokens(cfg: RunConfig) -> int:
    """Training tokens of the run: its steps × tokens per step (``train.tokens`` rounded up to whole steps)."""
    return total_steps(cfg) * tokens_per_step(cfg)


def budget_tokens(tokens_per_param: float, params: int) -> int:
    """A token budget of ``tokens_per_param`` tokens per parameter (DESIGN.md §9: a cell's budget uses the
    baseline strategy's ``params`` so that every strategy trains on the same tokens), for ``train.tokens``.
    Raises ``ValueError`` for a ratio that is not a finite number > 0 (``true``, text and NaN are no ratio), or a
    budget below one token or of ``TOKEN_LIMIT`` tokens or more."""
    ratio = read_number(tokens_per_param, "tokens_per_param", above=0, text=True, like=20)
    tokens = round(ratio * params)
    if not 1 <= tokens < TOKEN_LIMIT:
        raise ValueError(f"tokens_per_param={tokens_per_param} gives {tokens:.3g} tokens for {params:,} parameters; "
                         f"use a ratio that gives 1 to 2**63 tokens (e.g. 20)")
    return tokens


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask): the thread count `scalevec train` and a one-job
    sweep use when ``train.threads`` is 0. Explicit rather than torch's default, which counts physical
    cores and so differs on a machine with SMT from what a parent's ``OMP_NUM_THREADS`` gives: a run's
    numbers then depended on how it was started."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


__all__ = ["tokens_per_step", "train_steps", "total_steps", "run_tokens", "budget_tokens", "usable_cpus"]

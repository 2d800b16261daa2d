"""Host syncs of the training step (DESIGN.md §8): at most one per optimizer step off log steps.

A host sync stalls Python until the device has run everything queued, so a step that syncs several times
measures the launch overhead of small models instead of their arithmetic. On CPU the synchronizing calls
are counted by patching the ``Tensor`` methods that copy a value to the host (``item``, ``tolist``,
``__bool__``, ``__int__``, ``__float__``, ``__index__``, ``numpy``), counting only calls made from
scalevec's own code (torch's optimizers call ``item`` on their CPU step counters, which never syncs).
On CUDA (``gpu`` marker) torch's own detector, ``torch.cuda.set_sync_debug_mode("warn")``, counts every
synchronizing operation, torch's included.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest
import torch

from scalevec.resolve import resolve_config
from scalevec.training import trainer as train_mod

SYNC_METHODS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "numpy")
PACKAGE = str(Path(train_mod.__file__).resolve().parents[1])  # .../src/scalevec


def tiny(tmp_path, device="cpu", **over):
    """10 steps of ``tiny`` in two micro-batches, a training row every 5 steps, one evaluation at the end."""
    items = {"train.steps": 10, "train.batch_size": 4, "train.micro_batch_size": 2, "train.seq_len": 32,
             "train.log_every": 5, "train.eval_every": 1000, "train.eval_batch_size": 8, "data.val_tokens": 512,
             "train.device": device, "data.cache_dir": str(tmp_path / "cache"), **over}
    return resolve_config("tiny", "unified", [f"{k}={v}" for k, v in items.items()])


def syncs_per_step(trainer, monkeypatch, count) -> dict[int, int]:
    """``{step: synchronizing calls from its start to the next step's}`` over ``trainer.fit()``; ``count()``
    reads a running total. The last step (it evaluates, checkpoints and summarizes) is left out."""
    starts: list[tuple[int, int]] = []
    real_step = trainer.train_step

    def step(s):
        starts.append((s, count()))
        return real_step(s)

    monkeypatch.setattr(trainer, "train_step", step)
    trainer.fit()
    return {s: nxt - n for (s, n), (_, nxt) in zip(starts, starts[1:])}


def non_log_steps(cfg) -> list[int]:
    return [s for s in range(cfg.train.steps - 1) if s % cfg.train.log_every]


def count_python_syncs(monkeypatch) -> list[int]:
    """Patch ``SYNC_METHODS`` to count the calls made from scalevec's modules; returns the one-item counter."""
    total = [0]
    for name in SYNC_METHODS:
        real = getattr(torch.Tensor, name)

        def counted(self, *args, _real=real, **kwargs):
            if sys._getframe(1).f_code.co_filename.startswith(PACKAGE):
                total[0] += 1
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    return total


def test_one_host_sync_per_step_on_cpu(tmp_path, monkeypatch):
    """Off log steps an optimizer step (two micro-batches) copies to the host once: the guard's scalars."""
    cfg = tiny(tmp_path)
    trainer = train_mod.Trainer(cfg, tmp_path / "run", quiet=True)
    total = count_python_syncs(monkeypatch)
    per_step = syncs_per_step(trainer, monkeypatch, lambda: total[0])
    assert {s: per_step[s] for s in non_log_steps(cfg)} == {s: 1 for s in non_log_steps(cfg)}, per_step


def test_sync_counter_sees_a_sync(monkeypatch):
    """The counter is live: ``int(tensor)`` and ``bool(tensor)`` in a scalevec module count, in a test do not."""
    total = count_python_syncs(monkeypatch)
    int(torch.ones(()).sum())
    assert total[0] == 0
    exec(compile("int(torch.ones(()).sum()); bool(torch.ones(()) > 0)", train_mod.__file__, "exec"), {"torch": torch})
    assert total[0] == 2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_one_host_sync_per_step_on_cuda(tmp_path, monkeypatch):
    """On CUDA, torch's sync detector sees at most one synchronizing operation per step off log steps."""
    cfg = tiny(tmp_path, device="cuda", **{"train.compile": "false", "train.dtype": "float32"})
    trainer = train_mod.Trainer(cfg, tmp_path / "run", quiet=True)
    seen: list[warnings.WarningMessage] = []
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            per_step = syncs_per_step(trainer, monkeypatch, lambda: sum("synchroniz" in str(w.message) for w in seen))
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    assert all(per_step[s] <= 1 for s in non_log_steps(cfg)), per_step

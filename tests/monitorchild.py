"""``python tests/monitorchild.py OUT CACHE KILL_AT``: train the tiny run of ``tiny_cfg`` into OUT with a
``RunningLoss`` monitor and SIGKILL the process right after step KILL_AT (-1: never), for the kill-and-resume
test of monitor state in tests/test_trainer_parts.py."""

from __future__ import annotations

import os
import signal
import sys

from scalevec.resolve import resolve_config
from scalevec.training import monitors
from scalevec.training.monitors import Monitor
from scalevec.training.trainer import train


def tiny_cfg(cache: str):
    """Six steps of the tiny preset, a checkpoint every 2 steps."""
    items = {"train.steps": 6, "train.batch_size": 4, "train.seq_len": 32, "train.eval_every": 3,
             "train.log_every": 1, "train.eval_batch_size": 8, "data.val_tokens": 512, "train.ckpt_every": 2,
             "train.threads": 1, "data.cache_dir": cache}
    return resolve_config("tiny", "unified", [f"{k}={v}" for k, v in items.items()])


class RunningLoss(Monitor):
    """The running mean of the training loss over the whole run: a monitor whose state a resume must keep."""

    def __init__(self):
        self.n, self.total = 0, 0.0

    def after_step(self, ev):
        self.n += 1
        self.total += ev.loss

    def state_dict(self):
        return {"n": self.n, "total": self.total}

    def load_state_dict(self, state):
        self.n, self.total = state["n"], state["total"]


class KillAfter(Monitor):
    """SIGKILLs its own process after step ``step`` (before that step's checkpoint), as a crash would."""

    def __init__(self, step: int):
        self.step = step

    def after_step(self, ev):
        if ev.step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    out, cache, kill_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
    train(tiny_cfg(cache), out, quiet=True, monitors=[*monitors.default(), RunningLoss(), KillAfter(kill_at)])

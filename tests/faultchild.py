"""``python tests/faultchild.py WHERE AT -- ARGV...``: run ``scalevec ARGV`` with a SIGKILL armed at one
point, for tests/test_rundir_faults.py. WHERE: ``step`` (before training step AT), ``consolidated``
(model.safetensors of checkpoint AT half written), ``train_state`` / ``manifest`` (that file of
checkpoint AT cut off), ``latest`` (checkpoint AT renamed into place, ``latest`` not yet updated),
``none`` (no kill)."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path


def arm(where: str, at: int) -> None:
    from scalevec.training import rundir
    from scalevec.training import trainer as train_mod
    from scalevec.training.checkpoint import integrity, layout, save_load

    def die():
        os.kill(os.getpid(), signal.SIGKILL)

    if where == "step":
        real_step = train_mod.Trainer.train_step

        def step(self, s):
            if s == at:
                die()
            return real_step(self, s)

        train_mod.Trainer.train_step = step
    elif where == "consolidated":
        real_cons = save_load.save_consolidated

        def consolidated(model, state, path):
            if path.parent.name.startswith(f".tmp_step_{at:07d}."):
                path.write_bytes(b"\0" * 100)
                die()
            return real_cons(model, state, path)

        save_load.save_consolidated = consolidated
    elif where in ("train_state", "manifest"):
        name, file = ("write_train_state", layout.TRAIN_STATE) if where == "train_state" else \
            ("write_manifest", layout.MANIFEST)
        real = getattr(integrity, name)

        def cut(path, step, *rest):
            if step == at:
                base = Path(path).parent if where == "train_state" else Path(path)
                (base / file).write_text('{"format": "scal')
                die()
            return real(path, step, *rest)

        setattr(integrity, name, cut)
    elif where == "latest":
        real_atomic = rundir.write_atomic

        def atomic(path, text):
            if Path(path).name == layout.LATEST and text == f"step_{at:07d}":
                die()
            return real_atomic(path, text)

        rundir.write_atomic = atomic


if __name__ == "__main__":
    where, at, sep, *argv = sys.argv[1:]
    assert sep == "--"
    arm(where, int(at))
    from scalevec.cli import main

    sys.exit(main(argv))

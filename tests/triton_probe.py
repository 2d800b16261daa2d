"""Run a Triton compile probe in a fresh process without the interpreter (tests/conftest.py sets
``TRITON_INTERPRET=1`` on a machine without CUDA, and Triton fixes that choice at its first import)."""

from __future__ import annotations

import os
import subprocess
import sys


def compiles_without_interpreter(probe: str) -> None:
    """Run ``probe`` (Python source that prints ``compiled`` when every kernel compiled) with
    ``TRITON_INTERPRET`` removed; fail with the probe's stderr otherwise."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0 and run.stdout.strip() == "compiled", run.stderr[-3000:]

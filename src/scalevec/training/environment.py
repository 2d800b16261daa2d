"""Where and with what a run ran: the record ``meta.json`` keeps (DESIGN.md §8, README "Run directories").

Versions (scalevec, torch, Python), the code's git commit, host, platform, start time, command line,
processes and threads, the CPU model and the instruction set its fp32 kernels use (the thread count and
the instruction set change the last bits of fp32 sums, so a run is reproduced with the same ones). The CPU's
name is ``flops.cpu_name``, the one reader of /proc/cpuinfo.
"""

from __future__ import annotations

import platform
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch

from scalevec import __version__
from scalevec.config import RunConfig
from scalevec.model.flops import cpu_name
from scalevec.training import distributed


def run_meta(cfg: RunConfig) -> dict:
    """Versions, code version, host and start time, for ``meta.json``."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                                cwd=Path(__file__).parent).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {
        "scalevec": __version__, "torch": torch.__version__, "python": platform.python_version(),
        "git_commit": commit, "host": socket.gethostname(), "platform": platform.platform(),
        "start_time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "argv": sys.argv,
        "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "world_size": distributed.world_size(), "threads": torch.get_num_threads(),
        "cpu": cpu_name(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }


__all__ = ["run_meta"]

"""A reusable multi-process harness for distributed tests on CPU (gloo) or CUDA (nccl) (DESIGN.md §8).

``run_distributed(fn, *args, world_size=2)`` spawns ``world_size`` processes, joins them in one process
group (env:// rendezvous on a free local port, a 120 s collective timeout so a hang fails instead of
blocking), runs ``fn(rank, *args)`` on each and returns every rank's (picklable) result, rank order.
OLMo-core's ``run_distributed_test`` and torchtitan's gloo unit tests work the same way.
"""

from __future__ import annotations

import os
import pickle
import socket
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world_size: int, port: int, backend: str, out: str, fn, args) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timedelta(seconds=120))
    failure = None
    try:
        result = fn(rank, *args)
    except Exception as e:  # re-raised below, after every rank has agreed to tear down
        failure = e
    # Every rank's collectives must finish before any rank tears its pairs down: a rank that destroys the group
    # while its peer still waits on the last all-gather's bytes aborts that peer (SIGABRT, "terminate called
    # without an active exception"; seen once in CI). Agreeing on the outcome is that barrier, and it lets a
    # rank whose peer failed exit quietly, so the failing rank's own exception is the one the test sees.
    failed = torch.tensor(float(failure is not None), device="cuda" if backend == "nccl" else "cpu")
    dist.all_reduce(failed)
    dist.destroy_process_group()
    if failure is not None:
        raise failure
    if failed.item():
        return
    with open(Path(out) / f"{rank}.pkl", "wb") as f:
        pickle.dump(result, f)


def run_distributed(fn, *args, world_size: int = 2, backend: str = "gloo", timeout: float = 600) -> list:
    """Run ``fn(rank, *args)`` in ``world_size`` spawned processes joined in one process group and return
    each rank's result.

    ``fn`` must be a module-level function (it is pickled by name). A failure on any rank re-raises here
    (``torch.multiprocessing.ProcessRaisedException`` with the rank's traceback); ``TimeoutError`` when the
    processes run past ``timeout`` seconds (they are killed). Children run single-threaded.
    """
    os.environ["OMP_NUM_THREADS"] = "1"  # inherited by the children before they import torch
    with tempfile.TemporaryDirectory() as out:
        ctx = mp.start_processes(_worker, args=(world_size, free_port(), backend, out, fn, args), nprocs=world_size,
                                 join=False, start_method="spawn")
        deadline = time.monotonic() + timeout
        while not ctx.join(timeout=1):
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    p.kill()
                raise TimeoutError(f"{world_size} processes did not finish in {timeout} s")
        results = []
        for r in range(world_size):
            with open(Path(out) / f"{r}.pkl", "rb") as f:
                results.append(pickle.load(f))
        return results

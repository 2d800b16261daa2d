"""Randomized fault injection on run directories (rundir.py, DESIGN.md §8), the long version of
tests/test_rundir_faults.py.

    python scripts/fault_injection.py --kills 30 --damages 40 --links 20 --seed 0 [--steps 12] [--work DIR]

Trains one uninterrupted `tiny` reference run, then:

- ``--kills`` runs, each a real `python -m scalevec train` subprocess SIGKILLed at a random moment
  (a random delay after start; many land inside checkpoint writes with ``train.ckpt_every=1``) and then
  resumed with `--resume`, possibly killed again (up to 3 times); each must end bit for bit equal to the
  reference (every logged loss and every final weight);
- ``--damages`` copies of a partial run with one random file of one random checkpoint truncated,
  zero-filled or with a random byte flipped: `--resume` must either skip the damaged checkpoint and end
  bit for bit equal, or stop with a one-line error (exit 2); it must never exit 0 with other weights;
- ``--links`` copies of a partial run with one file that a resume writes or reads (the lock, metrics.jsonl, the
  run files a restart rewrites, a checkpoint's files) replaced by a symbolic link or a hard link to a user's file,
  or by a FIFO: `--resume` must end bit for bit equal or stop with a one-line error (exit 2), within its timeout
  (a FIFO never hangs it), and the user's file must keep its bytes.

Prints one line per case and the totals; exits 1 if any case broke the contract. Not run in CI (minutes).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml
from safetensors.torch import load_file

from scalevec.config.codec import to_dict
from scalevec.resolve import resolve_config
from scalevec.training import rundir
from scalevec.training.checkpoint import layout
from scalevec.training.trainer import train


def config(steps: int, cache: Path):
    items = {"train.steps": steps, "train.batch_size": 2, "train.seq_len": 16, "train.eval_every": 4,
             "train.log_every": 1, "train.eval_batch_size": 4, "data.val_tokens": 512, "schedule.warmup": 2,
             "train.ckpt_every": 1, "optim.lr": 1e-2, "data.cache_dir": str(cache)}
    return resolve_config("tiny", "baseline", [f"{k}={v}" for k, v in items.items()])


def fingerprint(run: Path, steps: int):
    rows = [(r["kind"], r["step"], r.get("loss"), r.get("val_loss")) for r in rundir.read_metrics(run)
            if r["kind"] in ("train", "eval")]
    w = load_file(str(run / "checkpoints" / f"step_{steps:07d}" / "model.safetensors"))
    return rows, {k: v for k, v in sorted(w.items())}


def same(a, b) -> bool:
    return a[0] == b[0] and a[1].keys() == b[1].keys() and all(torch.equal(a[1][k], b[1][k]) for k in a[1])


def cli(args: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "scalevec", *args], capture_output=True, text=True, timeout=timeout)


def resume_argv(cfg_file: Path, out: Path) -> list[str]:
    """What a user runs after a kill: ``--resume``, or, when the kill came before the run's config was written
    (start-up under load can take longer than the delay), the first command again (``--overwrite`` clears the
    set-up's own files; a run that holds no config.yaml has nothing to resume and resume says so)."""
    if (out / rundir.CONFIG).is_file():
        return ["train", "--resume", "--out", str(out), "--quiet"]
    first = ["train", "--config", str(cfg_file), "--out", str(out), "--quiet"]
    return first + (["--overwrite"] if out.exists() else [])


def kill_case(i: int, rng: random.Random, cfg_file: Path, work: Path, ref, steps: int) -> tuple[bool, str]:
    out = work / f"kill{i}"
    kills = 0
    argv = ["train", "--config", str(cfg_file), "--out", str(out), "--quiet"]
    while kills < rng.randint(1, 3):
        proc = subprocess.Popen([sys.executable, "-m", "scalevec", *argv], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(2.0, 12.0))  # start-up takes a few seconds, then a step every ~0.1 s
        if proc.poll() is not None:
            break
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        kills += 1
        argv = resume_argv(cfg_file, out)
    r = cli(resume_argv(cfg_file, out)) if not rundir.is_done(out) else None
    if r is not None and r.returncode != 0:
        return False, f"kill {i}: resume exit {r.returncode}: {r.stderr.strip()[-300:]}"
    ok = same(fingerprint(out, steps), ref)
    return ok, f"kill {i}: {kills} SIGKILL(s), resumed {'bit for bit' if ok else 'WITH OTHER NUMBERS'}"


def damage_case(i: int, rng: random.Random, partial: Path, work: Path, ref, steps: int) -> tuple[bool, str]:
    out = work / f"damage{i}"
    shutil.copytree(partial, out)
    ckpts = layout.checkpoint_dirs(out)
    ckpt = rng.choice(ckpts)
    files = [p for p in ckpt.rglob("*") if p.is_file()]
    target = rng.choice(files)
    data = bytearray(target.read_bytes())
    how = rng.choice(["truncate", "zero", "flip"])
    if how == "truncate":
        data = data[: rng.randrange(len(data))] if data else data
    elif how == "zero":
        data = bytearray(len(data))
    elif data:
        data[rng.randrange(len(data))] ^= rng.randrange(1, 256)
    target.write_bytes(bytes(data))
    r = cli(["train", "--resume", "--out", str(out), "--quiet"])
    what = f"damage {i}: {how} {target.relative_to(out)}"
    if r.returncode == 0:
        ok = same(fingerprint(out, steps), ref)
        return ok, f"{what}: resumed {'bit for bit' if ok else 'WITH OTHER NUMBERS'}"
    lines = r.stderr.strip().splitlines()
    ok = r.returncode == 2 and "Traceback" not in r.stderr and bool(lines)
    return ok, f"{what}: exit {r.returncode}: {lines[-1] if lines else ''}"


LINKED = [rundir.LOCK, rundir.METRICS, rundir.GROUPS, rundir.CONFIG, rundir.META, "tokenizer/tokenizer.json",
          "tokenizer/tokenizer_config.json"]  # plus one random file of one random checkpoint


def link_case(i: int, rng: random.Random, partial: Path, work: Path, ref, steps: int) -> tuple[bool, str]:
    out = work / f"link{i}"
    shutil.copytree(partial, out)
    victim = work / f"victim{i}.txt"
    victim.write_text("the user's own data\n")
    ckpt_files = [p.relative_to(out).as_posix() for p in rng.choice(layout.checkpoint_dirs(out)).rglob("*")
                  if p.is_file()]
    name, how = rng.choice([*LINKED, rng.choice(ckpt_files)]), rng.choice(["symlink", "hardlink", "fifo"])
    target = out / name
    target.unlink(missing_ok=True)
    {"symlink": lambda: target.symlink_to(victim), "hardlink": lambda: os.link(victim, target),
     "fifo": lambda: os.mkfifo(target)}[how]()
    what = f"link {i}: {how} at {name}"
    try:
        r = cli(["train", "--resume", "--out", str(out), "--quiet"], timeout=300)
    except subprocess.TimeoutExpired:
        return False, f"{what}: HUNG"
    intact = victim.read_text() == "the user's own data\n"
    if r.returncode == 0:
        ok = intact and same(fingerprint(out, steps), ref)
        return ok, f"{what}: resumed {'bit for bit' if ok else 'WITH OTHER NUMBERS OR THE FILE CHANGED'}"
    lines = r.stderr.strip().splitlines()
    ok = intact and r.returncode == 2 and "Traceback" not in r.stderr and bool(lines)
    return ok, f"{what}: exit {r.returncode}{'' if intact else ' (THE FILE CHANGED)'}: {lines[-1] if lines else ''}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kills", type=int, default=20)
    p.add_argument("--damages", type=int, default=30)
    p.add_argument("--links", type=int, default=20)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work", help="working folder (default: a temporary one, removed at the end)")
    args = p.parse_args(argv)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="scalevec-faults-"))
    work.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    cfg = config(args.steps, work / "cache")
    cfg_file = work / "run.yaml"
    cfg_file.write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    train(cfg, work / "ref", quiet=True)
    ref = fingerprint(work / "ref", args.steps)
    partial = work / "partial"
    train(cfg, partial, stop_at=args.steps - 3, quiet=True)
    results = []
    for i in range(args.kills):
        results.append(("kill", *kill_case(i, rng, cfg_file, work, ref, args.steps)))
        print(results[-1][2], flush=True)
    for i in range(args.damages):
        results.append(("damage", *damage_case(i, rng, partial, work, ref, args.steps)))
        print(results[-1][2], flush=True)
    for i in range(args.links):
        results.append(("link", *link_case(i, rng, partial, work, ref, args.steps)))
        print(results[-1][2], flush=True)
    summary = {kind: {"cases": sum(k == kind for k, _, _ in results),
                      "ok": sum(k == kind and ok for k, ok, _ in results)} for kind in ("kill", "damage", "link")}
    print(json.dumps(summary))
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if all(ok for _, ok, _ in results) else 1


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())

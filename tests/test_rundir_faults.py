"""Fault injection on run directories (issue 13, rundir.py, DESIGN.md §8): kills, preemption, damaged
checkpoints, pickle payloads, two writers, a full disk and a read-only target, dead models and spikes.

Every case checks the same contract: a run either continues bit for bit (its losses and final weights
equal an uninterrupted run's), or the command stops with a one-line error (exit 2, or 3 during
training) and the run stays resumable; nothing read from a run directory runs code. Runs are `tiny`
with 8 steps of 2 x 16 tokens, so each case takes about a second. SIGKILL cases run in child processes
(tests/faultchild.py). The longer randomized version is scripts/fault_injection.py.
"""

from __future__ import annotations

import errno
import json
import os
import pickle
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from scalevec.cli import main
from scalevec.config import to_dict
from scalevec.experiments.sweep import expand, run_status, spec_from_dict
from scalevec.resolve import resolve_config
from scalevec.training import command, rundir
from scalevec.training import trainer as train_mod
from scalevec.training.trainer import TrainingDiverged, train

STEPS = 8
ITEMS = {"train.steps": STEPS, "train.batch_size": 2, "train.seq_len": 16, "train.eval_every": 4, "train.log_every": 1,
         "train.eval_batch_size": 4, "data.val_tokens": 512, "schedule.warmup": 2, "train.ckpt_every": 2,
         "optim.lr": 1e-2}


def tiny_cfg(cache: Path, **over):
    items = {**ITEMS, "data.cache_dir": str(cache), **over}
    return resolve_config("tiny", "baseline", [f"{k}={v}" for k, v in items.items()])


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    """The run's config and a config file for the CLI (no training: the fast test needs only these)."""
    root = tmp_path_factory.mktemp("faults")
    cfg = tiny_cfg(root / "cache")
    cfg_file = root / "run.yaml"
    cfg_file.write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    return {"root": root, "cfg": cfg, "cfg_file": cfg_file}


@pytest.fixture(scope="module")
def env(config):
    """``config`` and an uninterrupted reference run (its losses and final weights)."""
    ref = config["root"] / "ref"
    train(config["cfg"], ref, quiet=True)
    return {**config, "ref": ref}


def train_argv(env, out: Path, *extra: str) -> list[str]:
    return ["train", "--config", str(env["cfg_file"]), "--out", str(out), "--quiet", *extra]


def resume_argv(out: Path) -> list[str]:
    return ["train", "--resume", "--out", str(out), "--quiet"]


def losses(run: Path) -> tuple[list, list]:
    return ([(r["step"], r["loss"]) for r in rundir.read_metrics(run, "train")],
            [(r["step"], r["val_loss"]) for r in rundir.read_metrics(run, "eval")])


def final_weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run / "checkpoints" / f"step_{STEPS:07d}" / "model.safetensors"))


def assert_same_as_reference(env, run: Path) -> None:
    """Bitwise: every logged train and eval loss, each step logged once, and every final weight."""
    assert rundir.is_done(run)
    assert losses(run) == losses(env["ref"])
    a, b = final_weights(run), final_weights(env["ref"])
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def one_line_error(capsys, needle: str | None = None) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    last = err.splitlines()[-1] if err else ""
    assert "error" in last, err
    if needle:
        assert needle in last, err
    return last


# ----------------------------------------------------------------------------------------- SIGKILL


CHILD = str(Path(__file__).with_name("faultchild.py"))


def killed_run(env, out: Path, where: str, at: int) -> int:
    """Train into ``out`` in a subprocess that SIGKILLs itself at ``where``/``at`` (tests/faultchild.py)."""
    return subprocess.run([sys.executable, CHILD, where, str(at), "--", *train_argv(env, out)], timeout=600,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode


@pytest.mark.slow  # fault injection: subprocess trainings, kills and resumes
def test_sigkill_at_random_steps_and_inside_checkpoint_writes_resumes_bitwise(env, capsys):
    """SIGKILL before the first checkpoint, at two random steps and at four points inside a checkpoint
    write: `train --resume` ends bit for bit equal to the uninterrupted run (losses and weights)."""
    rng = random.Random(13)
    cases = [("step", 1)] + [("step", s) for s in rng.sample(range(2, STEPS), 2)] + [
        ("consolidated", 2), ("train_state", 4), ("manifest", 6), ("latest", 4)]
    for i, (where, at) in enumerate(cases):
        out = env["root"] / f"kill{i}"
        assert killed_run(env, out, where, at) == -signal.SIGKILL, (where, at)
        assert not rundir.is_done(out)
        assert main(resume_argv(out)) == 0, (where, at)
        assert_same_as_reference(env, out)
        assert not list((out / "checkpoints").glob(".tmp_*")), "temporary checkpoints are cleaned up"
    capsys.readouterr()


# ----------------------------------------------------------------------------------------- SIGTERM


@pytest.mark.slow  # fault injection: subprocess trainings, kills and resumes
def test_sigterm_checkpoints_at_the_step_boundary_then_resume_is_bitwise(env, capsys, monkeypatch):
    """SIGTERM during step 2 (3 and 5 with an odd stop): the step finishes, a checkpoint is written,
    exit 75; --resume then matches the uninterrupted run bit for bit."""
    for at in (2, 5):
        out = env["root"] / f"term{at}"
        real_step = train_mod.Trainer.train_step

        def step_then_term(self, s, at=at, real_step=real_step):
            result = real_step(self, s)
            if s == at:
                os.kill(os.getpid(), signal.SIGTERM)
            return result

        monkeypatch.setattr(train_mod.Trainer, "train_step", step_then_term)
        assert main(train_argv(env, out)) == command.PREEMPTED_EXIT
        assert "SIGTERM" in capsys.readouterr().err
        assert rundir.checkpoint_dirs(out)[0].name == f"step_{at + 1:07d}"
        monkeypatch.setattr(train_mod.Trainer, "train_step", real_step)
        assert main(resume_argv(out)) == 0
        assert_same_as_reference(env, out)


# ----------------------------------------------------------------------------------------- damage


def damage(path: Path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "truncate":
        data = data[: len(data) // 2]
    elif how == "zero":
        data = bytearray(len(data))
    else:  # flip one byte in the middle
        data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def partial(env):
    """A run stopped after 6 of 8 steps, with checkpoints at steps 2, 4 and 6."""
    out = env["root"] / "partial"
    assert train(env["cfg"], out, stop_at=6, quiet=True) == {"stopped_at": 6}
    assert [c.name for c in rundir.checkpoint_dirs(out)] == ["step_0000006", "step_0000004", "step_0000002"]
    return out


CKPT_FILES = ["dcp", "model.safetensors", "train_state.json", "MANIFEST.json"]


@pytest.mark.parametrize("how", ["truncate", "zero", "flip"])
@pytest.mark.slow  # fault injection: subprocess trainings, kills and resumes
def test_damaged_checkpoint_file_falls_back_or_fails_in_one_line(env, partial, capsys, how):
    """Each file of the newest checkpoint truncated, zero-filled or with a flipped byte: --resume skips
    it (saying which and why) and ends bit for bit equal to the uninterrupted run; export and generate
    refuse a damaged model.safetensors with a one-line error (exit 2), never other weights."""
    for name in CKPT_FILES:
        out = env["root"] / f"damaged-{how}-{name}"
        shutil.copytree(partial, out)
        ckpt = out / "checkpoints" / "step_0000006"
        target = next((ckpt / "dcp").glob("*.safetensors")) if name == "dcp" else ckpt / name
        damage(target, how)
        found, skipped = rundir.resumable_checkpoint(out)
        assert found.name == "step_0000004" and skipped[0].startswith("step_0000006"), (how, name)
        if name == "model.safetensors":
            hf = env["root"] / f"hf-{how}"
            assert main(["export", str(out), "--out", str(hf)]) == 2
            one_line_error(capsys, "model.safetensors")
            assert not hf.exists()
            assert main(["generate", str(out), "--prompt", "Hi", "--max-new-tokens", "2"]) == 2
            one_line_error(capsys, "model.safetensors")
        assert main(resume_argv(out)) == 0, (how, name)
        err = capsys.readouterr().err
        assert "skipped checkpoint step_0000006" in err and "resuming from step_0000004" in err
        assert_same_as_reference(env, out)


@pytest.mark.slow  # fault injection: subprocess trainings, kills and resumes
def test_cut_off_metrics_line_is_dropped_on_resume_and_skipped_by_report(env, partial, capsys):
    """A partial last line in metrics.jsonl (a kill or a full disk): report reads the rest, --resume drops
    it with a notice and the run ends bit for bit equal to the uninterrupted one."""
    out = env["root"] / "cutmetrics"
    shutil.copytree(partial, out)
    with open(out / "metrics.jsonl", "a") as f:
        f.write('{"kind": "train", "step": 6, "lo')
    assert len(rundir.read_metrics(out)) == len(rundir.read_metrics(partial))
    assert main(resume_argv(out)) == 0
    assert "cut-off last line" in capsys.readouterr().err
    assert_same_as_reference(env, out)


# ----------------------------------------------------------------------------------------- no code from files


class Payload:
    """Unpickling it runs ``exec``, which writes the marker file: proof that a file ran code."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').write('ran')",)


def payload_bytes(kind: str, marker: Path) -> bytes:
    if kind == "yaml":
        return f"!!python/object/apply:builtins.exec [\"open({str(marker)!r}, 'w').write('ran')\"]\n".encode()
    if kind == "torch":
        import io

        buf = io.BytesIO()
        torch.save({"x": Payload(marker)}, buf)
        return buf.getvalue()
    return pickle.dumps(Payload(marker))


# (file in the run, payload kind): every file a command reads, and the pickle files older formats had
PAYLOAD_FILES = [("config.yaml", "yaml"), ("meta.json", "pickle"), ("metrics.jsonl", "pickle"),
                 ("summary.json", "pickle"), ("DIVERGED", "pickle"), ("tokenizer/tokenizer.json", "pickle"),
                 ("checkpoints/latest", "pickle"), ("CKPT/model.safetensors", "pickle"),
                 ("CKPT/model.safetensors", "torch"), ("CKPT/train_state.json", "pickle"),
                 ("CKPT/MANIFEST.json", "pickle"), ("CKPT/DCP", "pickle"), ("CKPT/DCP", "torch"),
                 ("CKPT/dcp/.metadata", "pickle"), ("CKPT/dcp/__0_0.distcp", "torch"),
                 ("CKPT/train_state.pt", "torch")]


@pytest.mark.slow  # fault injection: subprocess trainings, kills and resumes
def test_pickle_payloads_in_every_file_never_run(env, partial, capsys):
    """A payload that writes a marker when unpickled (or YAML-constructed), placed in each file that any
    command reads: train --resume, export, generate and report refuse it (exit 2, one line) or never
    read it, and the marker is never created."""
    marker = env["root"] / "PWNED"
    must_refuse = {"config.yaml": {"export", "generate", "report", "train"},
                   "DIVERGED": {"export", "generate", "train"},
                   "model.safetensors": {"export", "generate"}, "MANIFEST.json": {"export", "generate"}}
    results = []
    for i, (rel, kind) in enumerate(PAYLOAD_FILES):
        out = env["root"] / "payloads" / f"p{i}"
        shutil.copytree(partial, out)
        ckpt = out / "checkpoints" / "step_0000006"
        rel = rel.replace("CKPT/", f"checkpoints/{ckpt.name}/")
        path = next((ckpt / "dcp").glob("*.safetensors")) if rel.endswith("/DCP") else out / rel
        path.write_bytes(payload_bytes(kind, marker))
        # readers first (resume repairs the run), then the trainer
        for argv in (["export", str(out), "--out", str(out.parent / f"hf{i}")],
                     ["generate", str(out), "--prompt", "Hi", "--max-new-tokens", "2"], ["report", str(out.parent)],
                     resume_argv(out)):
            rc = main(argv)
            err = capsys.readouterr().err.strip()
            assert not marker.exists(), (rel, kind, argv[0])
            assert rc in (0, 2) and "Traceback" not in err, (rel, kind, argv[0], rc, err)
            if rc == 2:
                assert "error" in err.splitlines()[-1] and len(err.splitlines()[-1]) < 500, err
            if argv[0] in must_refuse.get(Path(rel).name, ()):
                assert rc == 2, (rel, kind, argv[0], err)
            results.append((rel, argv[0], rc))
        shutil.rmtree(out.parent)
    assert len(results) == 4 * len(PAYLOAD_FILES)


# ----------------------------------------------------------------------------------------- two writers


HOLD_LOCK = """import fcntl, os, sys, time
fd = os.open(sys.argv[1] + "/.lock", os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
os.ftruncate(fd, 0); os.write(fd, f"{os.getpid()}\\n".encode())
print("locked", flush=True)
time.sleep(120)
"""


def hold_lock(run: Path) -> subprocess.Popen:
    """A process that holds ``run``'s lock the way ``rundir.RunLock`` takes it (flock, PID in the file)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(run)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


@pytest.mark.slow  # fault injection: subprocess trainings, kills and resumes
def test_second_writer_is_refused_and_sigkill_releases_the_lock(env, partial, capsys):
    """While another process holds the run's lock, --resume, --overwrite and a sweep are refused at once
    naming its PID (the sweep skips the run); after that process is SIGKILLed, --resume works and every
    step is logged once."""
    out = env["root"] / "locked"
    shutil.copytree(partial, out)
    holder = hold_lock(out)
    try:
        t0 = time.monotonic()
        assert main(resume_argv(out)) == 2
        one_line_error(capsys, f"in use by process {holder.pid}")
        assert main(train_argv(env, out, "--overwrite")) == 2
        one_line_error(capsys, f"in use by process {holder.pid}")
        assert time.monotonic() - t0 < 30, "refused at once, not after waiting"
        spec = spec_from_dict({"base": {"preset": "tiny"}, "grid": {"strategy": ["baseline"]}})
        run = expand(spec)[0]
        runs_dir = env["root"] / "lockedsweep" / "runs"
        runs_dir.mkdir(parents=True)
        (runs_dir / run.name).mkdir()
        (runs_dir / run.name / "config.yaml").write_text(yaml.safe_dump(to_dict(run.cfg)))
        holder2 = hold_lock(runs_dir / run.name)
        assert run_status(run, runs_dir) == "locked"
        holder2.kill()  # SIGKILL: the kernel releases the lock
        holder2.wait()
        assert run_status(run, runs_dir) == "restart"
    finally:
        holder.kill()
        holder.wait()
    assert main(resume_argv(out)) == 0
    assert_same_as_reference(env, out)


@pytest.mark.slow  # fault injection: subprocess trainings, kills and resumes
def test_two_trainers_on_one_new_directory(env, capsys):
    """Two `train` started together into one new --out: one trains, the other is refused with exit 2 (the
    lock or the run it finds), and metrics.jsonl holds each step once."""
    out = env["root"] / "race"
    procs = [subprocess.Popen([sys.executable, "-m", "scalevec", *train_argv(env, out)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    codes = sorted(p.wait(600) for p in procs)
    assert codes == [0, 2], [p.stderr.read() for p in procs]
    assert_same_as_reference(env, out)
    steps = [r["step"] for r in rundir.read_metrics(out, "train")]
    assert steps == sorted(set(steps))


@pytest.mark.slow  # fault injection: subprocess trainings, kills and resumes
def test_overwrite_never_deletes_a_run_that_appeared_meanwhile(env, capsys):
    """A trainer validated while --out did not exist finds a run there when it starts writing: it stops
    with FileExistsError and the other run keeps all its files."""
    out = env["root"] / "appeared"
    late = train_mod.Trainer(env["cfg"], out, quiet=True)
    train(env["cfg"], out, quiet=True)
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*"))
    with pytest.raises(FileExistsError, match="already holds a run"):
        late.fit()
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == files
    assert_same_as_reference(env, out)


# ----------------------------------------------------------------------------------------- resources


def enospc(path) -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))


@pytest.mark.slow  # fault injection: subprocess trainings, kills and resumes
def test_full_disk_during_training_is_one_line_exit_3_and_resumable(env, capsys, monkeypatch):
    """ENOSPC inside the step-4 checkpoint write, and in a metrics append at step 5: exit 3 with one line
    naming the file, no temporary checkpoint left, and --resume ends bit for bit equal."""
    real_manifest, real_append = rundir.write_manifest, rundir.append_metrics
    for case in ("checkpoint", "metrics"):
        out = env["root"] / f"enospc-{case}"
        if case == "checkpoint":
            def manifest(ckpt, step):
                if step == 4:
                    raise enospc(ckpt / rundir.MANIFEST)
                return real_manifest(ckpt, step)

            monkeypatch.setattr(rundir, "write_manifest", manifest)
        else:
            def append(run, row):
                if row["step"] == 5 and row["kind"] == "train":
                    with open(Path(run) / rundir.METRICS, "a") as f:
                        f.write('{"kind": "tr')  # what a full disk leaves
                    raise enospc(Path(run) / rundir.METRICS)
                return real_append(run, row)

            monkeypatch.setattr(rundir, "append_metrics", append)
        assert main(train_argv(env, out)) == command.FAILED_EXIT
        last = one_line_error(capsys, "No space left on device")
        assert "--resume" in last
        assert not list((out / "checkpoints").glob(".tmp_*"))
        monkeypatch.setattr(rundir, "write_manifest", real_manifest)
        monkeypatch.setattr(rundir, "append_metrics", real_append)
        assert main(resume_argv(out)) == 0
        assert_same_as_reference(env, out)


@pytest.mark.slow  # fault injection: subprocess trainings, kills and resumes
def test_unusable_target_is_one_line_exit_2(env, capsys, monkeypatch):
    """A read-only target (mkdir, or the lock of an existing run, fail with EROFS) and a full disk while
    the run directory is set up: exit 2, one line naming the path; the existing run resumes afterwards."""
    real_mkdir = Path.mkdir
    readonly = env["root"] / "readonly"

    def ro_mkdir(self, *a, **k):
        if str(self).startswith(str(readonly)):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))
        return real_mkdir(self, *a, **k)

    monkeypatch.setattr(Path, "mkdir", ro_mkdir)
    out = readonly / "run"
    assert main(train_argv(env, out)) == 2
    one_line_error(capsys, "Read-only file system")
    monkeypatch.setattr(Path, "mkdir", real_mkdir)

    existing = env["root"] / "ro-existing"
    assert train(env["cfg"], existing, stop_at=4, quiet=True) == {"stopped_at": 4}
    real_open = os.open

    def ro_open(path, flags, *a):
        if str(path).endswith(rundir.LOCK) and flags & os.O_CREAT:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, flags, *a)

    monkeypatch.setattr(os, "open", ro_open)
    assert main(resume_argv(existing)) == 2
    one_line_error(capsys, "Read-only file system")
    monkeypatch.setattr(os, "open", real_open)

    full = env["root"] / "full-setup"
    from scalevec.data.tokenizer import Tokenizer

    def no_space(self, directory):
        raise enospc(Path(directory) / "tokenizer.json")

    monkeypatch.setattr(Tokenizer, "save", no_space)
    assert main(train_argv(env, full)) == 2
    one_line_error(capsys, "No space left on device")
    monkeypatch.undo()
    assert main(resume_argv(existing)) == 0
    assert_same_as_reference(env, existing)


def test_overflowing_lr_is_refused_at_validation(config, capsys):
    """--lr 1e38 overflows float32 in AdamW's first update: refused before anything is written (exit 2)."""
    out = config["root"] / "lr1e38"
    assert main(train_argv(config, out, "--lr", "1e38")) == 2
    one_line_error(capsys, "overflows float32")
    assert not out.exists()


# ----------------------------------------------------------------------------------------- health guard


def poisoned(monkeypatch, trainer, first_bad: int, how: str) -> None:
    """From training step ``first_bad`` on (evaluation untouched), the loss is ln(vocab) with zero
    gradient (dead) or 10x (a spike)."""
    real = trainer.model.forward
    uniform = float(torch.log(torch.tensor(float(trainer.cfg.model.vocab_size))))

    def forward(tokens, targets=None):
        out = real(tokens, targets)
        if targets is None or not trainer.model.training or trainer.step < first_bad:
            return out
        ce, n = out[0], out[1]
        return (ce * 0 + uniform * n if how == "dead" else ce * 10), n, out[2]

    monkeypatch.setattr(trainer.model, "forward", forward)


@pytest.mark.parametrize("how,first_bad,kept", [("dead", 5, "step_0000004"), ("spike", 7, "step_0000006")])
@pytest.mark.slow  # fault injection: subprocess trainings, kills and resumes
def test_dead_model_and_spike_write_diverged_with_the_checkpoint_from_before(env, capsys, monkeypatch, how,
                                                                             first_bad, kept):
    """Dead from step 5 (3 steps at ln(vocab) with zero gradient) or a 10x loss spike at step 7 (window 4):
    DIVERGED names the step, the reason and the newest checkpoint from before the trouble; latest points at
    it; export uses it; --resume refuses the diverged run."""
    out = env["root"] / f"guard-{how}"
    cfg = tiny_cfg(env["root"] / "cache", **{"train.ckpt_every": 1, "train.guard_dead_steps": 3,
                                             "train.guard_spike_window": 4})
    trainer = train_mod.Trainer(cfg, out, quiet=True)
    poisoned(monkeypatch, trainer, first_bad, how)
    with pytest.raises(TrainingDiverged, match=kept):
        trainer.fit()
    trainer.release()
    div = rundir.read_diverged(out)
    assert div["first_bad_step"] == first_bad and div["checkpoint"] == kept
    assert ("dead model" if how == "dead" else "loss spike") in div["reason"]
    assert (out / "checkpoints" / "latest").read_text() == kept
    assert rundir.model_checkpoint(out)[0].name == kept
    assert main(["export", str(out), "--out", str(env["root"] / f"hf-{how}")]) == 0
    capsys.readouterr()
    assert main(resume_argv(out)) == 2
    one_line_error(capsys, "diverged")


@pytest.mark.slow  # fault injection: subprocess trainings, kills and resumes
def test_lr_that_kills_the_model_leaves_no_usable_checkpoint(env, capsys):
    """--lr 1e6: the run stops at the guard (non-finite gradient or dead model) with no checkpoint from
    before the trouble; export and generate refuse it with one line (exit 2)."""
    out = env["root"] / "lr1e6"
    assert main(train_argv(env, out, "--lr", "1e6")) == command.DIVERGED_EXIT
    assert "no checkpoint from before" in capsys.readouterr().err
    assert rundir.read_diverged(out)["checkpoint"] is None
    assert main(["export", str(out), "--out", str(env["root"] / "hf-1e6")]) == 2
    one_line_error(capsys, "no healthy model")
    assert main(["generate", str(out), "--prompt", "Hi"]) == 2
    one_line_error(capsys, "no healthy model")


@pytest.mark.slow  # fault injection: subprocess trainings, kills and resumes
def test_dead_checkpoint_without_diverged_is_refused_by_export(env, partial, capsys):
    """A checkpoint whose model predicts the uniform distribution (zero output head and final scale),
    without a DIVERGED marker: export and generate refuse it as a dead model (exit 2)."""
    out = env["root"] / "deadckpt"
    shutil.copytree(partial, out)
    ckpt = out / "checkpoints" / "step_0000006"
    weights = load_file(str(ckpt / "model.safetensors"))
    from safetensors.torch import save_file

    save_file({k: torch.zeros_like(v) for k, v in weights.items()}, str(ckpt / "model.safetensors"),
              metadata={"format": "pt"})
    manifest = json.loads((ckpt / "MANIFEST.json").read_text())
    (ckpt / "MANIFEST.json").unlink()
    rundir.write_manifest(ckpt, manifest["step"])
    assert main(["export", str(out), "--out", str(env["root"] / "hf-deadckpt")]) == 2
    one_line_error(capsys, "dead model")
    assert main(["generate", str(out), "--prompt", "Hi"]) == 2
    one_line_error(capsys, "dead model")


@pytest.mark.slow  # fault injection: subprocess trainings, kills and resumes
def test_guard_never_fires_on_a_healthy_run(env):
    """40 steps at lr 1e-2 with a short spike window (5) and the dead check on: no DIVERGED, and the
    losses equal a run with the guard off (the guard only reads, it never changes numbers)."""
    over = {"train.steps": 40, "train.ckpt_every": 0, "train.eval_every": 20, "train.guard_spike_window": 5}
    on = train(tiny_cfg(env["root"] / "cache", **over), env["root"] / "healthy-on", quiet=True)
    off = train(tiny_cfg(env["root"] / "cache", **over, **{"train.guard_dead_steps": 0, "train.guard_spike_ratio": 0}),
                env["root"] / "healthy-off", quiet=True)
    assert not (env["root"] / "healthy-on" / "DIVERGED").exists()
    assert losses(env["root"] / "healthy-on") == losses(env["root"] / "healthy-off")
    assert on["final_val_loss"] == off["final_val_loss"]

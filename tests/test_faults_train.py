"""Robustness of training, sweeps and their messages: the health guard's blow-up rule, the
checkpoint DIVERGED keeps, one-line errors that name what is wrong, trainers that die with their sweep,
and one exit-code contract (75 = stopped by SIGTERM and resumable, for train and sweep alike).

The contract is tests/test_rundir_faults.py's: a run continues bit for bit, or the command stops with a
one-line error (exit 2 for bad input, 3 during training) and the run stays resumable. Runs are `tiny`
with 8 steps of 2 x 16 tokens (about a second each); sweeps use the fake trainer tests/fakerun.py
unless a test needs the real one.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
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
from scalevec.experiments import sweepdir
from scalevec.experiments.sweep import expand, run_status, run_sweep, spec_from_dict
from scalevec.resolve import resolve_config
from scalevec.training import command, rundir
from scalevec.training import trainer as train_mod
from scalevec.training.checkpoint import integrity, layout
from scalevec.training.schedule import lr_multiplier
from scalevec.training.trainer import BLOWUP_RATIO, Preempted, TrainingDiverged, check_train_extra, train
from test_rundir_faults import STEPS, tiny_cfg, tiny_setup  # the fault suite's tiny run

UNIFORM = math.log(256)  # tiny's byte vocabulary
FAKE = (sys.executable, str(Path(__file__).with_name("fakerun.py")))
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """A config file for the CLI and a finished, uninterrupted reference run (its losses and weights)."""
    return tiny_setup(tmp_path_factory.mktemp("faults-train"), "ref")


def train_argv(env, out: Path, *extra: str) -> list[str]:
    return ["train", "--config", str(env["cfg_file"]), "--out", str(out), "--quiet", *extra]


def one_line_error(capsys, *needles: str) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and "[Errno" not in err, err
    last = err.splitlines()[-1] if err else ""
    assert "error" in last, err
    for needle in needles:
        assert needle in last, err
    return last


def losses(run: Path) -> tuple[list, list]:
    return ([(r["step"], r["loss"]) for r in rundir.read_metrics(run, "train")],
            [(r["step"], r["val_loss"]) for r in rundir.read_metrics(run, "eval")])


def assert_same_as_reference(env, run: Path) -> None:
    """Bitwise: every logged train and eval loss and every final weight equal the reference run's."""
    assert rundir.is_done(run)
    assert losses(run) == losses(env["ref"])
    last = Path("checkpoints") / f"step_{STEPS:07d}" / "model.safetensors"
    a, b = load_file(str(run / last)), load_file(str(env["ref"] / last))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# ----------------------------------------------------------------------------------------- 1. blow-up


@pytest.mark.parametrize("eval_every,reason,stop", [(4, "validation loss blow-up", 4), (100, "loss blow-up", 5)])
def test_lr_that_blows_the_loss_up_and_keeps_it_high_is_diverged(env, capsys, eval_every, reason, stop):
    """--lr 10: 5.5 nats at step 0, hundreds from step 1 on (finite, so no NaN check fires). The guard stops
    the run at the first evaluation above 3 ln(V) (step 4), or after 5 training steps in a row above it
    (step 5, evaluation only at the end): exit 3, DIVERGED from step 1 with no checkpoint before it, and
    export refuses the run."""
    out = env["root"] / f"lr10-eval{eval_every}"
    assert main(train_argv(env, out, "--lr", "10", f"train.eval_every={eval_every}")) == command.DIVERGED_EXIT
    assert "blow-up" in capsys.readouterr().err
    assert not rundir.is_done(out)
    div = rundir.read_diverged(out)
    assert div["reason"].startswith(reason) and div["step"] == stop, div
    assert div["first_bad_step"] == 1 and div["checkpoint"] is None, div
    assert all(loss > BLOWUP_RATIO * UNIFORM for step, loss in losses(out)[0] if step >= 1)
    assert main(["export", str(out), "--out", str(env["root"] / f"hf-lr10-{eval_every}")]) == 2
    one_line_error(capsys, "no healthy model")


def test_a_run_that_starts_above_uniform_is_judged_from_its_start(env, monkeypatch):
    """A model whose training loss is 4x its real one from step 0 (an odd initialisation, say) starts above
    3 ln(V) and stays there while it learns: the guard measures from the run's first loss and lets it finish."""
    cfg = tiny_cfg(env["cache"])
    trainer = train_mod.Trainer(cfg, env["root"] / "starts-high", quiet=True)
    real = trainer.model.forward

    def forward(tokens, targets=None):
        out = real(tokens, targets)
        if targets is None or not trainer.model.training:
            return out
        return out[0] * 4, out[1], out[2]

    monkeypatch.setattr(trainer.model, "forward", forward)
    summary = trainer.fit()
    first = rundir.read_metrics(env["root"] / "starts-high", "train")[0]["loss"]
    assert first > BLOWUP_RATIO * UNIFORM and summary["final_val_loss"] < UNIFORM
    assert not (env["root"] / "starts-high" / rundir.DIVERGED).exists()


# ----------------------------------------------------------------------------------------- 2. the kept checkpoint


def test_diverged_names_no_checkpoint_written_after_the_blow_up(env, capsys):
    """--lr 30 with a checkpoint every step: step 1 is already thousands of nats, a NaN follows at step 3.
    DIVERGED dates the trouble from step 1, so it keeps no checkpoint (step_0000002 holds a blown-up model)."""
    out = env["root"] / "lr30"
    assert main(train_argv(env, out, "--lr", "30", "train.ckpt_every=1")) == command.DIVERGED_EXIT
    capsys.readouterr()
    div = rundir.read_diverged(out)
    assert div["first_bad_step"] == 1 and div["checkpoint"] is None, div
    assert losses(out)[0][1][1] > BLOWUP_RATIO * UNIFORM  # the model used at step 1 had blown up
    assert (out / "checkpoints" / "step_0000002").is_dir()  # written, and rightly not kept


def test_dead_model_after_a_blow_up_keeps_the_checkpoint_from_before_the_blow_up(env, monkeypatch):
    """Steps 3-4 blown up (100x, too short for the blow-up rule), dead from step 5 (3 steps, the dead rule):
    the trouble began at step 3, so DIVERGED keeps step_0000002, not the blown-up step_0000004."""
    cfg = tiny_cfg(env["cache"], **{"train.ckpt_every": 1, "train.guard_dead_steps": 3})
    out = env["root"] / "blowup-then-dead"
    trainer = train_mod.Trainer(cfg, out, quiet=True)
    real = trainer.model.forward

    def forward(tokens, targets=None):
        out_ = real(tokens, targets)
        if targets is None or not trainer.model.training or trainer.step < 3:
            return out_
        ce, n = out_[0], out_[1]
        return (ce * 100 if trainer.step < 5 else ce * 0 + UNIFORM * n), n, out_[2]

    monkeypatch.setattr(trainer.model, "forward", forward)
    with pytest.raises(TrainingDiverged, match="dead model.*step_0000002"):
        trainer.fit()
    div = rundir.read_diverged(out)
    assert div["step"] == 7 and div["first_bad_step"] == 3 and div["checkpoint"] == "step_0000002"
    assert (out / "checkpoints" / "latest").read_text() == "step_0000002"


# ----------------------------------------------------------------------------------------- 3. messages


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A small random Llama written by transformers' save_pretrained (byte vocabulary)."""
    import transformers

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    path = tmp_path_factory.mktemp("hf") / "llama"
    transformers.LlamaForCausalLM(cfg).save_pretrained(path)
    return path


def test_preset_with_an_hf_init_from_names_the_init_from_source(env, hf_dir, capsys):
    """--init-from HF --preset tiny without --config: the error names --init-from (the model's shape comes
    from config.json), not a --config that was never given; nothing is written."""
    out = env["root"] / "hf-preset"
    assert main(["train", "--init-from", str(hf_dir), "--preset", "tiny", "--out", str(out), "--quiet"]) == 2
    last = one_line_error(capsys, f"--init-from {hf_dir}", "drop --preset")
    assert "--config" not in last
    assert not out.exists()


def test_a_finished_or_diverged_run_is_not_offered_resume(env, capsys):
    """train into a finished run: the error says it is finished and names --init-from RUN --schedule-from
    continue and --overwrite (it no longer says "pass --resume", which has nothing left to do); into a
    diverged run it says so (--resume would refuse it)."""
    assert main(train_argv(env, env["ref"])) == 2
    last = one_line_error(capsys, "finished", f"--init-from {env['ref']} --schedule-from continue", "--overwrite")
    assert "pass --resume" not in last
    diverged = env["root"] / "diverged"
    shutil.copytree(env["ref"], diverged)
    (diverged / rundir.DONE).unlink()
    rundir.mark_diverged(diverged, 5, 5, "loss spike at step 5", "step_0000004")
    assert main(train_argv(env, diverged)) == 2
    last = one_line_error(capsys, "diverged", "--overwrite")
    assert "pass --resume" not in last


def erofs(path) -> OSError:
    return OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))


def test_sweep_and_export_on_a_read_only_target_are_one_line(env, capsys, monkeypatch, tmp_path):
    """A sweep --out that cannot be created, a sweep folder whose files cannot be written, and an export
    --out on a read-only filesystem: exit 2 with one line naming the folder and the fix (no [Errno 30])."""
    spec_file = tmp_path / "s.yaml"
    spec_file.write_text(yaml.safe_dump({"name": "ro", "base": {"preset": "tiny"}, "grid": {"strategy": ["baseline"]}}))
    readonly = tmp_path / "readonly"
    real_mkdir = Path.mkdir

    def ro_mkdir(self, *a, **k):
        if str(self).startswith(str(readonly)):
            raise erofs(self)
        return real_mkdir(self, *a, **k)

    monkeypatch.setattr(Path, "mkdir", ro_mkdir)
    assert main(["sweep", str(spec_file), "--out", str(readonly / "sweep"), "--no-report"]) == 2
    one_line_error(capsys, f"sweep folder {readonly / 'sweep'}", "Read-only file system", "writable --out")
    assert main(["export", str(env["ref"]), "--out", str(readonly / "hf")]) == 2
    one_line_error(capsys, str(readonly), "Read-only file system", "writable --out")
    monkeypatch.setattr(Path, "mkdir", real_mkdir)

    def ro_spec(out, data):
        raise erofs(Path(out) / "sweep.yaml")

    monkeypatch.setattr(sweepdir, "write_spec", ro_spec)
    assert main(["sweep", str(spec_file), "--out", str(tmp_path / "mounted"), "--no-report"]) == 2
    one_line_error(capsys, f"sweep folder {tmp_path / 'mounted'}", "Read-only file system", "writable --out")


def test_a_checkpoint_whose_step_does_not_fit_is_skipped_not_fed_to_the_schedule(env, capsys):
    """train_state.json saying step -5 in step_0000006 (manifest rewritten to match) used to stop --resume
    with the schedule's bare "step -5 is outside [0, 8)": it is skipped naming the file, and the run resumes
    from step_0000004 bit for bit."""
    out = env["root"] / "badstep"
    assert train(env["cfg"], out, stop_at=6, quiet=True) == {"stopped_at": 6}
    ckpt = out / "checkpoints" / "step_0000006"
    state = json.loads((ckpt / layout.TRAIN_STATE).read_text())
    (ckpt / layout.TRAIN_STATE).write_text(json.dumps({**state, "step": -5}))
    (ckpt / layout.MANIFEST).unlink()
    integrity.write_manifest(ckpt, 6)
    assert main(["train", "--resume", "--out", str(out), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert f"skipped checkpoint step_0000006: {ckpt / layout.TRAIN_STATE}" in err and "outside" not in err, err
    assert_same_as_reference(env, out)


# edits of step_0000006's trainer extras: (the edit, the words its skip note must hold)
BAD_EXTRAS = {
    "best_val a string": (lambda x: x.update(best_val="x"), "extra.best_val is 'x', not a loss"),  # a TypeError
    "guard.recent a string": (lambda x: x["guard"].update(recent="x"), "extra.guard.recent is 'x'"),  # resumed on
}


@pytest.mark.parametrize("case", list(BAD_EXTRAS))
def test_a_checkpoint_with_edited_trainer_extras_is_skipped_naming_its_train_state(env, capsys, case):
    """train_state.json of step_0000006 with a best validation loss of "x" (manifest rewritten to match) was a
    TypeError traceback at the first evaluation after --resume, and a guard whose recent losses are "x" resumed
    with the letter as a loss; each is now skipped in one note naming the file and the key, and the run resumes
    from step_0000004 bit for bit."""
    edit, words = BAD_EXTRAS[case]
    out = env["root"] / f"extras-{case.replace(' ', '-')}"
    assert train(env["cfg"], out, stop_at=6, quiet=True) == {"stopped_at": 6}
    ckpt = out / "checkpoints" / "step_0000006"
    state = json.loads((ckpt / layout.TRAIN_STATE).read_text())
    edit(state["extra"])
    (ckpt / layout.TRAIN_STATE).write_text(json.dumps(state))
    (ckpt / layout.MANIFEST).unlink()
    integrity.write_manifest(ckpt, 6)
    assert main(["train", "--resume", "--out", str(out), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert f"skipped checkpoint step_0000006: {ckpt / layout.TRAIN_STATE}: {words}" in err, err
    assert "Traceback" not in err
    assert_same_as_reference(env, out)


@pytest.mark.parametrize("extra, key", [
    ({"elapsed_s": -1.0}, "extra.elapsed_s"), ({"elapsed_s": float("nan")}, "extra.elapsed_s"),
    ({"best_val": None}, "extra.best_val"), ({"guard": [1]}, "extra.guard is"),
    ({"guard": {"dead_run": 1.5}}, "extra.guard.dead_run"), ({"guard": {"bad_since": "3"}}, "extra.guard.bad_since"),
    ({"guard": {"reference": 0}}, "extra.guard.reference"), ({"monitors": {"m": 1}}, "extra.monitors"),
])
def test_check_train_extra_names_the_key_of_a_value_resume_cannot_use(extra, key):
    """Each extra value that Trainer.load would take wrongly (or trip over later) is refused naming its key; the
    extras of a fresh run's checkpoint (best_val inf, an empty guard) pass."""
    check_train_extra({"best_val": math.inf, "elapsed_s": 0.0, "guard": {}})
    with pytest.raises(ValueError, match=f"^{re.escape(key)}"):
        check_train_extra(extra)


def test_resume_after_the_steps_were_lowered_below_a_checkpoint_changes_nothing(env, capsys):
    """A run stopped at step 6 whose config.yaml is then edited to 3 steps: --resume is refused in one line naming
    the checkpoints past 3 and the fix, and the run's metrics and checkpoints are as they were; before, it resumed
    from step_0000002 and dropped the metrics of steps 3-6 (with no checkpoint at or below 3: all of them)."""
    out = env["root"] / "lowered"
    assert train(env["cfg"], out, stop_at=6, quiet=True) == {"stopped_at": 6}
    config = out / rundir.CONFIG
    config.write_text(config.read_text().replace(f"steps: {STEPS}\n", "steps: 3\n", 1))
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != rundir.LOCK}
    assert main(["train", "--resume", "--out", str(out), "--quiet"]) == 2
    one_line_error(capsys, "step_0000004, step_0000006 are past the 3 steps", "restore the step count", "--overwrite")
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != rundir.LOCK} == before


def test_schedule_step_error_says_which_setting_bounds_it():
    """lr_multiplier outside the run's steps names the settings that make the count."""
    cfg = resolve_config("tiny", "baseline", []).schedule
    with pytest.raises(ValueError, match=r"step -5 is outside \[0, 12\).*train\.steps.*0 to 11"):
        lr_multiplier(-5, 12, cfg)


# ----------------------------------------------------------------------------------------- 4.-5. sweeps and signals


SWEEP = {"name": "sig", "base": {"train": {"batch_size": 4, "seq_len": 32}},
         "grid": {"preset": ["tiny"], "strategy": ["baseline", "unified"], "lr": [3e-3]}}


def children(pid: int) -> list[int]:
    """The PIDs of ``pid``'s children (every thread's: the sweep starts trainers from worker threads)."""
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def running(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (an orphan's zombie waits for init to reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def start_sweep(tmp_path: Path, spec: dict, env: dict | None = None) -> tuple[subprocess.Popen, Path, list]:
    """``python -m scalevec sweep`` in its own session (so cleanup can kill the group), stderr piped."""
    spec_file, out = tmp_path / "s.yaml", tmp_path / "out"
    spec_file.write_text(yaml.safe_dump(spec, sort_keys=False))
    proc = subprocess.Popen([sys.executable, "-m", "scalevec", "sweep", str(spec_file), "--out", str(out),
                             "--no-report"], env={**os.environ, **(env or {})}, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    return proc, out, expand(spec_from_dict(spec))


def wait_for(cond, proc: subprocess.Popen, what: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout  # generous: start-ups on a loaded 2-core machine
    while not cond():
        assert proc.poll() is None and time.monotonic() < deadline, f"{what}: {proc.poll()} {proc.stderr.read()}"
        time.sleep(0.1)


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL whatever is left of the sweep's process group (its own session), then reap the sweep."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def second_run_sleeping(proc, out: Path, runs) -> int:
    """Wait until the fake trainer of the second run sleeps (FAKE_SLEEP, once the first run is DONE); its PID."""
    second = out / "runs" / runs[1].name
    wait_for(lambda: (second / "config.yaml").exists() and children(proc.pid), proc, "the second run never started")
    (child,) = children(proc.pid)
    return child


@pytest.mark.slow  # a sweep subprocess: ~5 s
def test_trainers_die_with_a_killed_sweep(tmp_path):
    """kill -9 of a sweep: its trainer (sleeping for a minute) gets SIGTERM from the kernel and is gone
    within seconds, instead of training on unwatched."""
    proc, out, runs = start_sweep(tmp_path, {**SWEEP, "command": list(FAKE)}, {"FAKE_SLEEP": "60"})
    try:
        child = second_run_sleeping(proc, out, runs)
        assert running(child)
        kill_sweep_and_wait(proc, child, 10)
    finally:
        kill_group(proc)


def kill_sweep_and_wait(proc, child: int, seconds: float) -> None:
    """SIGKILL the sweep ``proc``; assert its trainer ``child`` is gone within ``seconds``."""
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(30)
    deadline = time.monotonic() + seconds
    while running(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not running(child), "the trainer outlived its sweep"


@pytest.mark.slow  # a sweep subprocess with the real trainer, then a rerun: ~25 s
def test_a_killed_sweeps_real_trainer_checkpoints_and_the_rerun_resumes(tmp_path):
    """kill -9 of a sweep while its real trainer trains: the trainer checkpoints at its next step and exits
    75 (its log says so); rerunning the sweep resumes the run, and every step is logged once."""
    spec = {"name": "real", "base": {"preset": "tiny", "data.val_tokens": 512, "data.cache_dir": str(tmp_path / "c"),
                                     "train": {"steps": 300, "batch_size": 2, "seq_len": 16, "eval_every": 150,
                                               "eval_batch_size": 4, "log_every": 1, "ckpt_every": 0}},
            "grid": {"strategy": ["baseline"]}}
    proc, out, runs = start_sweep(tmp_path, spec)
    run_dir = out / "runs" / runs[0].name
    try:
        wait_for(lambda: (run_dir / rundir.METRICS).exists() and rundir.read_metrics(run_dir, "train"), proc,
                 "the trainer never logged a step")
        (child,) = children(proc.pid)
        kill_sweep_and_wait(proc, child, 120)  # the real trainer first checkpoints
    finally:
        kill_group(proc)
    log = (out / "runs" / f"{runs[0].name}.log").read_text()
    assert "SIGTERM: stopped after step" in log and "with a checkpoint" in log, log
    assert run_status(runs[0], out / "runs") == "resume"
    assert run_sweep(spec_from_dict(spec), out, quiet=True, report=False) == 0
    steps = [r["step"] for r in rundir.read_metrics(run_dir, "train")]
    assert steps == list(range(300))


@pytest.mark.parametrize("signum,code", [(signal.SIGTERM, command.PREEMPTED_EXIT), (signal.SIGINT, 130)])
@pytest.mark.slow  # a sweep subprocess: ~5 s
def test_sweep_exit_code_follows_trains_contract(tmp_path, signum, code):
    """SIGTERM to a sweep stops its trainers and exits 75 like train (stopped, resumable); Ctrl-C exits 130.
    The last line says how to go on."""
    proc, out, runs = start_sweep(tmp_path, {**SWEEP, "command": list(FAKE)}, {"FAKE_SLEEP": "60"})
    try:
        child = second_run_sleeping(proc, out, runs)
        os.kill(proc.pid, signum)
        assert proc.wait(60) == code
        assert not running(child)
        err = proc.stderr.read().strip()
        assert "Traceback" not in err
        if signum == signal.SIGTERM:
            assert "SIGTERM" in err.splitlines()[-1] and "rerun the same command" in err.splitlines()[-1], err
    finally:
        kill_group(proc)
    assert run_status(runs[1], out / "runs") == "restart"


def test_compare_exits_75_when_its_sweep_is_preempted(tmp_path, capsys, monkeypatch):
    """The same contract for the commands built on run_sweep (compare, study): Preempted (SIGTERM) is exit 75."""
    from scalevec.experiments import compare

    def preempted(*a, **k):
        raise Preempted("SIGTERM: stopped the sweep; its running trainers checkpointed; rerun the same command")

    monkeypatch.setattr(compare, "run_sweep", preempted)
    argv = ["compare", "--preset", "tiny", "--strategies", "baseline", "--seeds", "1", "--steps", "2", "--lr", "0.01",
            "--out", str(tmp_path / "cmp")]
    assert main(argv) == command.PREEMPTED_EXIT
    assert "SIGTERM" in capsys.readouterr().err

"""Fault injection on run directories (rundir.py, DESIGN.md §8): kills, preemption, damaged
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
from scalevec.config.codec import to_dict
from scalevec.experiments.sweep import expand, run_status, spec_from_dict
from scalevec.resolve import resolve_config
from scalevec.training import command, rundir
from scalevec.training import trainer as train_mod
from scalevec.training.checkpoint import integrity, layout
from scalevec.training.trainer import TrainingDiverged, train

STEPS = 8
ITEMS = {"train.steps": STEPS, "train.batch_size": 2, "train.seq_len": 16, "train.eval_every": 4, "train.log_every": 1,
         "train.eval_batch_size": 4, "data.val_tokens": 512, "schedule.warmup": 2, "train.ckpt_every": 2,
         "optim.lr": 1e-2}


def tiny_cfg(cache: Path, **over):
    items = {**ITEMS, "data.cache_dir": str(cache), **over}
    return resolve_config("tiny", "baseline", [f"{k}={v}" for k, v in items.items()])


def tiny_setup(root: Path, finished_run: str | None = None) -> dict:
    """The fault suites' shared set-up in ``root``: the tiny run's config (``cfg``), a config file for the CLI
    (``cfg_file``), its token cache folder (``cache``) and, given ``finished_run``, that run trained to the end
    (``STEPS`` steps, about a second) at ``root / finished_run``, under the same key."""
    cfg = tiny_cfg(root / "cache")
    cfg_file = root / "run.yaml"
    cfg_file.write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    out = {"root": root, "cache": root / "cache", "cfg": cfg, "cfg_file": cfg_file}
    if finished_run:
        out[finished_run] = root / finished_run
        train(cfg, out[finished_run], quiet=True)
    return out


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    """The run's config and a config file for the CLI (no training: the fast test needs only these)."""
    return tiny_setup(tmp_path_factory.mktemp("faults"))


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
        assert layout.checkpoint_dirs(out)[0].name == f"step_{at + 1:07d}"
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
    assert [c.name for c in layout.checkpoint_dirs(out)] == ["step_0000006", "step_0000004", "step_0000002"]
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
        found, skipped = integrity.resumable_checkpoint(out)
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


@pytest.mark.parametrize("how", ["zero", "nul-tail", "bad-line"])
@pytest.mark.slow  # fault injection: subprocess trainings, kills and resumes
def test_damaged_metrics_file_is_set_aside_never_destroyed(env, partial, capsys, how):
    """metrics.jsonl zero-filled, with NUL bytes after its rows (what a crash of the filesystem leaves, not a
    cut-off append) or with a bad line amid its rows: report refuses it in one line, and --resume moves it to
    metrics.jsonl.damaged byte for byte (with a note) and keeps its readable rows; with nothing lost from
    them, the run ends bit for bit equal to the uninterrupted one."""
    out = env["root"] / f"metrics-{how}" / "run"  # alone in its folder, for report
    shutil.copytree(partial, out)
    path = out / "metrics.jsonl"
    if how == "zero":
        damage(path, "zero")
    elif how == "nul-tail":
        path.write_bytes(path.read_bytes() + bytes(4096))
    else:
        lines = path.read_text().splitlines(keepends=True)
        path.write_text("".join(lines[:3]) + "not a row\n" + "".join(lines[3:]))
    original = path.read_bytes()
    with pytest.raises(rundir.RunDirError, match="is not a metrics row"):
        rundir.read_metrics(out)
    assert main(["report", str(out.parent)]) == 2
    one_line_error(capsys, "metrics.jsonl")
    assert main(resume_argv(out)) == 0
    err = capsys.readouterr().err
    assert "metrics.jsonl.damaged" in err and "cut-off" not in err, err
    assert (out / "metrics.jsonl.damaged").read_bytes() == original
    if how == "zero":  # no row was readable: the file holds the resumed steps only
        assert [r["step"] for r in rundir.read_metrics(out, "train")] == [6, 7]
    else:
        assert_same_as_reference(env, out)


def rewrite_manifest(ckpt: Path) -> None:
    """A new MANIFEST.json over the checkpoint's files as they are now: the damage passes the manifest."""
    step = json.loads((ckpt / "MANIFEST.json").read_text())["step"]
    (ckpt / "MANIFEST.json").unlink()
    integrity.write_manifest(ckpt, step)


def edit_train_state(ckpt: Path, edit) -> None:
    state = json.loads((ckpt / "train_state.json").read_text())
    edit(state)
    (ckpt / "train_state.json").write_text(json.dumps(state))


@pytest.mark.parametrize("how", ["step-huge", "step-older"])
@pytest.mark.slow  # fault injection: subprocess trainings, kills and resumes
def test_checkpoint_that_contradicts_itself_falls_back(env, partial, capsys, how):
    """A newest checkpoint whose train_state.json says step 10^15 (it would mark the run DONE untrained) or
    step 4 inside step_0000006 (it would retrain steps 4-5 from step 6's weights), each with a manifest
    rewritten to match: --resume skips it with a note and ends bit for bit equal to the uninterrupted run."""
    out = env["root"] / f"contradicts-{how}"
    shutil.copytree(partial, out)
    ckpt = out / "checkpoints" / "step_0000006"
    edit_train_state(ckpt, lambda st: st.update(step=10 ** 15 if how == "step-huge" else 4))
    rewrite_manifest(ckpt)
    found, skipped = integrity.resumable_checkpoint(out)
    assert found.name == "step_0000004" and skipped[0].startswith(ckpt.name), skipped
    assert main(resume_argv(out)) == 0
    err = capsys.readouterr().err
    assert f"skipped checkpoint {ckpt.name}" in err and "resuming from step_0000004" in err, err
    assert_same_as_reference(env, out)


@pytest.mark.slow  # fault injection: subprocess trainings, kills and resumes
def test_checkpoint_folder_renamed_past_the_steps_is_refused_and_kept(env, partial, capsys):
    """A folder renamed to step 10^15 with all its files saying so is, to --resume, a checkpoint past
    train.steps: the same case as a config edited to fewer steps (test_faults_train), so it is refused in
    one line naming the ways on, before anything is loaded, and every file of the run is left as it was
    (skipping it would train steps 5-8 again and leave a checkpoint the run can never reach)."""
    out = env["root"] / "contradicts-folder-huge"
    shutil.copytree(partial, out)
    ckpt = out / "checkpoints" / "step_0000006"
    huge = ckpt.rename(ckpt.with_name(f"step_{10 ** 15}"))
    edit_train_state(huge, lambda st: st.update(step=10 ** 15))
    (huge / "MANIFEST.json").unlink()
    integrity.write_manifest(huge, 10 ** 15)
    found, skipped = integrity.resumable_checkpoint(out)  # as a candidate it is unusable, never resumed from
    assert found.name == "step_0000004" and skipped[0].startswith(huge.name), skipped
    before = {f: f.read_bytes() for f in sorted(out.rglob("*")) if f.is_file()}
    assert main(resume_argv(out)) == 2
    err = capsys.readouterr().err
    assert f"checkpoints {huge.name} are past the 8 steps" in err and "--overwrite" in err, err
    assert {f: f.read_bytes() for f in sorted(out.rglob("*")) if f.is_file()} == before


def malform(ckpt: Path, how: str) -> None:
    """Damage the checkpoint in a way that passes a rewritten manifest (see MALFORMED)."""
    import base64

    from safetensors import safe_open
    from safetensors.torch import save_file

    shard = next((ckpt / "dcp").glob("*.safetensors"))
    if how == "not-safetensors":
        shard.write_bytes(b"not a safetensors file " * 64)
    elif how == "wrong-shape":
        with safe_open(str(shard), framework="pt") as f:
            metadata = f.metadata()
        tensors = load_file(str(shard))
        name = next(k for k in tensors if k.startswith("model/"))
        tensors[name] = torch.zeros(3, 3)
        save_file(tensors, str(shard), metadata=metadata)
    elif how == "rng-length":
        edit_train_state(ckpt, lambda st: st.update(rng_cpu=base64.b64encode(b"abc").decode()))
    elif how == "extra-list":
        edit_train_state(ckpt, lambda st: st.update(extra=[1, 2]))
    else:  # betas of one value in the optimizer's stored param groups
        def one_beta(st):
            for path, value in st["plain"]:
                if path[-1] == "betas":
                    value[:] = value[:1]

        edit_train_state(ckpt, one_beta)
    rewrite_manifest(ckpt)


# how -> found without a model (checkpoint/integrity.py checks the files), else only by loading them (save_load.py)
MALFORMED = {"not-safetensors": True, "rng-length": True, "extra-list": True, "wrong-shape": False, "betas": False}


@pytest.mark.parametrize("how", list(MALFORMED))
@pytest.mark.slow  # fault injection: subprocess trainings, kills and resumes
def test_malformed_checkpoint_that_passes_its_manifest_falls_back(env, partial, capsys, how):
    """A newest checkpoint that matches a rewritten manifest but is malformed: a DCP shard that is not
    safetensors, a tensor of another shape, rng_cpu of another length, extra a list, one beta. integrity finds
    the first kind without a model; the others only a load finds. Either way --resume (which resumes through
    save_load.resume_checkpoint) skips it with a note naming it, resumes from step 4 and continues bit for
    bit; and resume_checkpoint loads step 4 exactly as a direct load does."""
    out = env["root"] / f"malformed-{how}"
    shutil.copytree(partial, out)
    malform(out / "checkpoints" / "step_0000006", how)
    api = env["root"] / f"malformed-{how}-api"  # a copy for resume_checkpoint, which only reads
    shutil.copytree(out, api)
    found, skipped = integrity.resumable_checkpoint(out)
    assert (found.name == "step_0000004") == MALFORMED[how], (how, skipped)

    assert main(resume_argv(out)) == 0, how
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    assert "skipped checkpoint step_0000006" in err and "resuming from step_0000004" in err, (how, err)
    assert "no intact checkpoint" not in err, err
    assert_same_as_reference(env, out)

    from scalevec.training.checkpoint.save_load import load_checkpoint, resume_checkpoint

    notes: list[str] = []
    trainer = train_mod.Trainer(env["cfg"], api, resume=True, quiet=True)
    state = resume_checkpoint(api, trainer.model, trainer.optimizers, trainer.device, notice=notes.append)
    trainer.release()
    assert state["step"] == 4
    assert notes[0].startswith("skipped checkpoint step_0000006") and notes[-1].startswith("resuming from step_0000004")
    direct = train_mod.Trainer(env["cfg"], partial, resume=True, quiet=True)
    load_checkpoint(partial / "checkpoints" / "step_0000004", direct.model, direct.optimizers, direct.device)
    direct.release()
    a, b = trainer.model.state_dict(), direct.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    sa, sb = trainer.optimizers[0].state_dict()["state"], direct.optimizers[0].state_dict()["state"]
    assert all(torch.equal(sa[i][k], sb[i][k]) for i in sa for k in sa[i])


@pytest.mark.slow  # fault injection: subprocess trainings, kills and resumes
def test_symlinked_checkpoints_are_never_written_through(env, partial, capsys):
    """checkpoints/ a symbolic link to another run's: --resume refuses it in one line (exit 2) and the other
    run is untouched. A step_0000006 that links to another run's step_0000006 (another lr, so other weights):
    export refuses it, --resume skips it with a note, continues bit for bit from step 4 and replaces the link
    by its own checkpoint, and the other run's checkpoint is untouched."""
    other = env["root"] / "link-other"
    assert train(tiny_cfg(env["root"] / "cache", **{"optim.lr": 2e-2}), other, stop_at=6, quiet=True) == \
        {"stopped_at": 6}

    def snapshot(run: Path) -> dict:
        return {p.relative_to(run).as_posix(): p.read_bytes() for p in sorted((run / "checkpoints").rglob("*"))
                if p.is_file()}

    before = snapshot(other)
    out = env["root"] / "link-root"
    shutil.copytree(partial, out)
    shutil.rmtree(out / "checkpoints")
    (out / "checkpoints").symlink_to(other / "checkpoints")
    assert main(resume_argv(out)) == 2
    one_line_error(capsys, "symbolic link")
    assert snapshot(other) == before

    out = env["root"] / "link-step"
    shutil.copytree(partial, out)
    link = out / "checkpoints" / "step_0000006"
    shutil.rmtree(link)
    link.symlink_to(other / "checkpoints" / "step_0000006")
    assert main(["export", str(out), "--out", str(env["root"] / "hf-link")]) == 2
    one_line_error(capsys, "symbolic link")
    assert main(resume_argv(out)) == 0
    err = capsys.readouterr().err
    assert "skipped checkpoint step_0000006" in err and "symbolic link" in err, err
    assert_same_as_reference(env, out)
    assert not link.is_symlink() and link.is_dir()
    assert snapshot(other) == before


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


def test_overwrite_refuses_a_folder_that_only_has_a_config_yaml(config, capsys):
    """A project folder with its own config.yaml (even a valid scalevec config), precious.txt and src/main.py
    is no run: --overwrite refuses it in one line (exit 2) and every file stays."""
    out = config["root"] / "project"
    (out / "src").mkdir(parents=True)
    shutil.copy(config["cfg_file"], out / "config.yaml")
    (out / "precious.txt").write_text("precious")
    (out / "src" / "main.py").write_text("print('hi')\n")
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*"))
    assert main(train_argv(config, out, "--overwrite")) == 2
    one_line_error(capsys, "not a scalevec run directory")
    assert main(resume_argv(out)) == 2
    one_line_error(capsys, "not a scalevec run directory")
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == files
    assert (out / "precious.txt").read_text() == "precious"


def test_a_run_is_recognized_by_its_meta_json(tmp_path):
    """is_run: config.yaml with a meta.json that carries RUN_FORMAT (write_meta) or, from before the marker,
    the keys the trainer always wrote; not with a foreign or unreadable meta.json, another format, or none.
    A meta.json with RUN_FORMAT alone is no run, but --overwrite may empty it."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("preset: tiny\n")
    assert not rundir.is_run(run)
    rundir.write_meta(run, {"scalevec": "0.1.0"})
    assert json.loads((run / "meta.json").read_text())["format"] == rundir.RUN_FORMAT and rundir.is_run(run)
    legacy = {"scalevec": "0.1.0", "torch": "2.5.0", "python": "3.11.7", "start_time": "2025-01-01T00:00:00+0000",
              "host": "h"}
    for meta, ok in ((legacy, True), ({"version": 3}, False), ({**legacy, "format": "other/1"}, False), ([1], False)):
        (run / "meta.json").write_text(json.dumps(meta))
        assert rundir.is_run(run) is ok, meta
    (run / "meta.json").write_bytes(b"\x00" * 16)
    assert not rundir.is_run(run)
    # a set-up interrupted after meta.json (RUN_FORMAT) and before config.yaml: no run, but --overwrite empties it
    (run / "config.yaml").unlink()
    rundir.write_meta(run, {})
    assert not rundir.is_run(run)
    rundir.check_out_dir(run, resume=False, overwrite=True)
    assert rundir.remove_run(run) == [] and not any(run.iterdir())


@pytest.mark.slow  # fault injection: subprocess trainings, kills and resumes
def test_overwrite_deletes_only_what_scalevec_wrote(env, partial, capsys):
    """A run with the user's files beside scalevec's: remove_run deletes scalevec's entries (and its damaged
    files and temporaries), keeps the lock, leaves and names the rest; train --overwrite then trains the run
    bit for bit and the user's files are untouched."""
    out = env["root"] / "overwrite-mixed"
    shutil.copytree(partial, out)
    (out / "notes.txt").write_text("mine")
    assert main(train_argv(env, out, "--overwrite")) == 0
    assert (out / "notes.txt").read_text() == "mine"
    assert_same_as_reference(env, out)
    shutil.rmtree(out)
    shutil.copytree(partial, out)
    (out / "notes.txt").write_text("mine")
    (out / "analysis").mkdir()
    (out / "analysis" / "plot.py").write_text("print('plot')\n")
    (out / "metrics.jsonl.damaged").write_text("old")
    (out / ".summary.json.123.tmp").write_text("{")
    notes: list[str] = []
    assert rundir.remove_run(out, notice=notes.append) == ["analysis", "notes.txt"]
    assert sorted(p.name for p in out.iterdir()) == [".lock", "analysis", "notes.txt"]
    assert "analysis, notes.txt" in notes[0]


def test_overwrite_keeps_the_users_files_inside_checkpoints_and_tokenizer(tmp_path):
    """--overwrite empties checkpoints/ and tokenizer/ file by file: scalevec's checkpoint folders (their dcp/,
    model, train state, manifest), latest and temporaries, and the tokenizer's two files go; a user's file in
    either folder, or inside a checkpoint folder, stays, is named with its path, and keeps its folder."""
    run = tmp_path / "run"
    run.mkdir()
    rundir.write_meta(run, {})
    (run / "config.yaml").write_text("preset: tiny\n")
    ckpts = run / "checkpoints"
    for step in ("step_0000010", "step_0000020"):
        (ckpts / step / "dcp").mkdir(parents=True)
        for name in ("model.safetensors", "train_state.json", "MANIFEST.json", "dcp/__0_0.safetensors"):
            (ckpts / step / name).write_text("x")
    (ckpts / "latest").write_text("step_0000020")
    (ckpts / ".tmp_step_0000030.7").mkdir()
    (ckpts / "my_extra.txt").write_text("mine")
    (ckpts / "step_0000020" / "mine").mkdir()
    (ckpts / "step_0000020" / "mine" / "z.txt").write_text("mine")
    (run / "tokenizer").mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "my_vocab_notes.txt"):
        (run / "tokenizer" / name).write_text("x")
    notes: list[str] = []
    left = rundir.remove_run(run, notice=notes.append)
    assert left == ["checkpoints/my_extra.txt", "checkpoints/step_0000020/mine", "tokenizer/my_vocab_notes.txt"]
    assert "checkpoints/my_extra.txt, checkpoints/step_0000020/mine, tokenizer/my_vocab_notes.txt" in notes[0]
    assert sorted(str(p.relative_to(run)) for p in run.rglob("*") if p.is_file()) == [
        "checkpoints/my_extra.txt", "checkpoints/step_0000020/mine/z.txt", "tokenizer/my_vocab_notes.txt"]
    assert not (ckpts / "step_0000010").exists()  # emptied of scalevec's files: removed
    assert not rundir.is_run(run)


def test_dead_writers_temporaries_are_cleaned_in_the_run_and_its_checkpoints(tmp_path):
    """What the trainer removes under its lock before it writes: rundir.clean_temporaries, the run's own
    temporaries (write_atomic's ``.NAME.PID.tmp``); layout.clean_temporaries, a half-written checkpoint
    (``.tmp_step_*``) and checkpoints/'s temporaries. Nothing else goes, and a symbolic link in place of
    checkpoints/ is never cleaned through (another run's files)."""
    run = tmp_path / "run"
    (run / "checkpoints" / ".tmp_step_0000004.123" / "dcp").mkdir(parents=True)
    (run / "checkpoints" / "step_0000002").mkdir()
    (run / "checkpoints" / ".latest.123.tmp").write_text("step_0000004")
    (run / ".summary.json.123.tmp").write_text("{")
    (run / "summary.json").write_text("{}")
    assert rundir.clean_temporaries(run) == [".summary.json.123.tmp"]
    assert sorted(layout.clean_temporaries(run)) == [".latest.123.tmp", ".tmp_step_0000004.123"]
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints", "summary.json"]
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step_0000002"]
    other = tmp_path / "other"
    (other / "checkpoints" / ".tmp_step_0000006.9").mkdir(parents=True)
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "checkpoints").symlink_to(other / "checkpoints")
    assert layout.clean_temporaries(linked) == [] and (other / "checkpoints" / ".tmp_step_0000006.9").is_dir()


def test_meta_is_read_leniently_and_a_summary_strictly(tmp_path):
    """read_meta (what a report shows: the CPU, a branch's parent) gives {} for a missing, damaged or non-object
    meta.json; read_summary (a finished run's numbers) refuses those in one line naming the file."""
    run = tmp_path / "run"
    run.mkdir()
    assert rundir.read_meta(run) == {}
    for text in ('{"cpu": "x"', "[1, 2]", "\xff"):
        (run / "meta.json").write_text(text, encoding="latin-1")
        assert rundir.read_meta(run) == {}
    (run / "meta.json").write_text('{"cpu": "x"}')
    assert rundir.read_meta(run) == {"cpu": "x"}
    with pytest.raises(rundir.RunDirError, match=r"summary\.json does not exist; retrain"):
        rundir.read_summary(run, fix="retrain")
    (run / "summary.json").write_text("[1]")
    with pytest.raises(rundir.RunDirError, match=r"summary\.json is not a summary"):
        rundir.read_summary(run)


# ----------------------------------------------------------------------------------------- several processes


def _save_without_tag(rank: int, root: str) -> dict:
    """Each of the ranks saves a tiny model and AdamW state with ``tag=None``, then loads it back."""
    from scalevec.model.transformer import build_model
    from scalevec.training.checkpoint.save_load import load_checkpoint, save_checkpoint

    cfg = resolve_config("tiny", "baseline", ["model.n_layers=1", "model.d_model=32", "model.n_heads=2",
                                              "model.n_kv_heads=1", "model.d_ff=48"])
    model = build_model(cfg.model, cfg.scale, seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.arange(16).view(2, 8) % 256
    model(x, x)[0].backward()
    opt.step()
    ckpt = save_checkpoint(Path(root), 1, model, [opt], {}, tag=None)
    fresh = build_model(cfg.model, cfg.scale, seed=1)
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
    state = load_checkpoint(ckpt, fresh, [fresh_opt], torch.device("cpu"))
    a, b = model.state_dict(), fresh.state_dict()
    return {"step": state["step"], "same": all(torch.equal(a[k], b[k]) for k in a),
            "temporaries": sorted(p.name for p in (Path(root) / "checkpoints").iterdir() if p.name.startswith("."))}


@pytest.mark.slow  # spawns 2 processes that import torch: ~10 s
def test_save_checkpoint_without_a_tag_from_every_rank_loads(tmp_path):
    """save_checkpoint(..., tag=None) called from both ranks of a gloo group, as its docstring says: the ranks
    agree on one temporary directory (rank 0's PID), so the published checkpoint holds every rank's shards,
    loads on both ranks with the saved weights, and no temporary directory is left."""
    from dist_harness import run_distributed

    results = run_distributed(_save_without_tag, str(tmp_path), world_size=2)
    assert results == [{"step": 1, "same": True, "temporaries": []}] * 2, results
    from scalevec.training.checkpoint.save_load import writer_tag

    assert writer_tag(7) == 7 and writer_tag() == os.getpid()  # one process: its own PID


# ----------------------------------------------------------------------------------------- resources


def enospc(path) -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))


# what safetensors raises on a full disk (its Rust writer's I/O error; not an OSError)
SAFETENSORS_ENOSPC = "Error while serializing: I/O error: No space left on device (os error 28)"


@pytest.mark.slow  # fault injection: subprocess trainings, kills and resumes
def test_full_disk_during_training_is_one_line_exit_3_and_resumable(env, capsys, monkeypatch):
    """ENOSPC inside the step-4 checkpoint write (the manifest, the consolidated model: safetensors' own
    SafetensorError, the DCP shards: DCP's CheckpointException around the OSError) and in a metrics append
    at step 5: exit 3 with one line naming the file, no temporary checkpoint left, and --resume ends bit for
    bit equal."""
    from safetensors import SafetensorError
    from torch.distributed.checkpoint import HuggingFaceStorageWriter

    from scalevec.training.checkpoint import save_load

    real_manifest, real_append = integrity.write_manifest, rundir.append_metrics
    real_save_file, real_write_data = save_load.save_file, HuggingFaceStorageWriter.write_data
    for case in ("checkpoint", "consolidated", "dcp", "metrics"):
        out = env["root"] / f"enospc-{case}"
        if case == "checkpoint":
            def manifest(ckpt, step):
                if step == 4:
                    raise enospc(ckpt / layout.MANIFEST)
                return real_manifest(ckpt, step)

            monkeypatch.setattr(integrity, "write_manifest", manifest)
        elif case == "consolidated":
            def save_file(tensors, filename, metadata=None):
                if "step_0000004" in filename:
                    raise SafetensorError(SAFETENSORS_ENOSPC)
                return real_save_file(tensors, filename, metadata=metadata)

            monkeypatch.setattr(save_load, "save_file", save_file)
        elif case == "dcp":
            def write_data(self, plan, planner):
                if "step_0000004" in str(self.path):
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # as a write() fails: no file name
                return real_write_data(self, plan, planner)

            monkeypatch.setattr(HuggingFaceStorageWriter, "write_data", write_data)
        else:
            def append(run, row):
                if row["step"] == 5 and row["kind"] == "train":
                    with open(Path(run) / rundir.METRICS, "a") as f:
                        f.write('{"kind": "tr')  # what a full disk leaves
                    raise enospc(Path(run) / rundir.METRICS)
                return real_append(run, row)

            monkeypatch.setattr(rundir, "append_metrics", append)
        assert main(train_argv(env, out)) == command.FAILED_EXIT, case
        last = one_line_error(capsys, "No space left on device")
        assert "--resume" in last and str(out) in last, last
        assert not list((out / "checkpoints").glob(".tmp_*"))
        monkeypatch.undo()
        assert main(resume_argv(out)) == 0
        assert_same_as_reference(env, out)


@pytest.mark.slow  # fault injection: subprocess trainings, kills and resumes
def test_full_disk_during_export_is_one_line_exit_2(env, capsys, monkeypatch):
    """ENOSPC while export writes the model (safetensors' own SafetensorError, not an OSError): exit 2, one
    line naming the file and the error, nothing left beside --out; the export succeeds once there is space."""
    import safetensors.torch
    from safetensors import SafetensorError

    real_save_file = safetensors.torch.save_file
    folder = env["root"] / "export-full"
    folder.mkdir()
    hf = folder / "hf"

    def save_file(tensors, filename, metadata=None):
        if str(filename).startswith(str(folder)):
            raise SafetensorError(SAFETENSORS_ENOSPC)
        return real_save_file(tensors, filename, metadata=metadata)

    monkeypatch.setattr(safetensors.torch, "save_file", save_file)
    assert main(["export", str(env["ref"]), "--out", str(hf)]) == 2
    last = one_line_error(capsys, "No space left on device")
    assert "model.safetensors" in last, last
    assert not any(folder.iterdir())  # neither --out nor the temporary folder
    monkeypatch.undo()
    assert main(["export", str(env["ref"]), "--out", str(hf)]) == 0
    assert (hf / "model.safetensors").is_file()


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


@pytest.mark.parametrize("value, words", [("1.0e+30", ("train.steps", "float")), ("8.0", ("train.steps", "float")),
                                          ("'1e30'", ("train.steps", "whole number", "(a str)")),
                                          ("true", ("train.steps",))])
def test_stored_config_with_a_value_of_the_wrong_type_is_refused(config, capsys, value, words):
    """config.yaml with train.steps 1.0e+30 (or 8.0, '1e30', true) for the int field: reading it is a one-line
    error naming the field and the value's type, so no run trains 10^30 steps; `train --config` refuses it
    before writing anything (exit 2)."""
    out = config["root"] / f"wrongtype-{len(value)}-{value[:2]}"
    out.mkdir()
    text = config["cfg_file"].read_text()
    assert "  steps: 8\n" in text
    (out / "config.yaml").write_text(text.replace("  steps: 8\n", f"  steps: {value}\n"))
    with pytest.raises(rundir.RunDirError) as info:
        rundir.load_config(out)
    assert all(w in str(info.value) for w in words) and "\n" not in str(info.value), info.value
    target = config["root"] / f"wrongtype-run-{len(value)}-{value[:2]}"
    assert main(["train", "--config", str(out / "config.yaml"), "--out", str(target), "--quiet"]) == 2
    one_line_error(capsys, words[0])
    assert not target.exists()


def test_a_dangling_symlink_out_is_one_line_and_a_linked_directory_is_written_through(config, capsys):
    """--out as a link to a missing directory was a bare '[Errno 17] File exists': it is a one-line error naming
    the link's target (exit 2) and the link is kept; a link to an existing directory is an ordinary --out."""
    link = config["root"] / "dangling"
    link.symlink_to(config["root"] / "nowhere")
    assert main(["train", "--config", str(config["cfg_file"]), "--out", str(link), "--quiet"]) == 2
    line = one_line_error(capsys, os.path.realpath(config["root"] / "nowhere"))
    assert "is a symbolic link that leads nowhere" in line, line
    assert link.is_symlink() and not (config["root"] / "nowhere").exists()
    (config["root"] / "real").mkdir()
    good = config["root"] / "linked"
    good.symlink_to(config["root"] / "real")
    rundir.check_out_dir(good, resume=False, overwrite=False)  # no error: the run is written through the link


def refused_in_one_line(capsys, argv: list[str], *words: str) -> str:
    """Run the CLI: exit 2, one stderr line holding ``words``, no traceback and no raw errno. Returns the line."""
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err and "Errno" not in err, err
    assert all(w in err for w in words), err
    return err


def tree(root: Path) -> dict[str, str]:
    """Every entry under ``root`` (links not followed): a link as its target, a folder as ``dir``."""
    return {str(p.relative_to(root)): (f"-> {os.readlink(p)}" if p.is_symlink() else "dir" if p.is_dir() else "file")
            for p in root.rglob("*")}


@pytest.mark.parametrize("how", ["absolute", "relative", "chained"])
def test_a_dangling_link_above_out_is_one_line_naming_it(config, capsys, monkeypatch, how):
    """--out below a symbolic link that leads nowhere (one or more levels above it) was mkdir's bare '[Errno 17] File
    exists': one line (exit 2) naming --out, the link, where it really leads (a relative target read from the link's
    own folder, a chain followed to its end) and the fix; nothing is created, the link is kept."""
    root = config["root"] / f"above-{how}"
    (root / "sub").mkdir(parents=True)
    monkeypatch.chdir(root)  # --out as a relative path, as typed
    link, out = Path("sub/dang"), "sub/dang/a/b"
    if how == "absolute":
        link.symlink_to(root / "nowhere")
    elif how == "relative":  # relative to sub/, i.e. root/nowhere; read from the working directory it is elsewhere
        link.symlink_to("../nowhere")
    else:
        link.symlink_to("hop")
        Path("sub/hop").symlink_to(root / "nowhere")
    before = tree(root)
    line = refused_in_one_line(capsys, ["train", "--config", str(config["cfg_file"]), "--out", out, "--quiet"],
                               f"--out {out}: {link} is a symbolic link that leads nowhere "
                               f"(to {os.path.realpath(root / 'nowhere')}); remove it or choose another --out")
    assert "../nowhere" not in line and "hop" not in line
    assert tree(root) == before and not (root / "nowhere").exists()


@pytest.mark.parametrize("where", ["out", "above"])
def test_a_link_loop_at_or_above_out_says_loop(config, capsys, where):
    """A symbolic link loop as --out or above it is called a loop (never 'leads nowhere' or an errno's 'Too many
    levels of symbolic links'), with the circle it goes round; the links are kept. check_no_links names one too."""
    root = config["root"] / f"loop-{where}"
    root.mkdir()
    (root / "l1").symlink_to("l2")
    (root / "l2").symlink_to("l1")
    (root / "self").symlink_to("self")
    real = os.path.realpath(root)
    for link, circle in [("l1", f"{real}/l1 -> {real}/l2 -> {real}/l1"), ("self", f"{real}/self -> {real}/self")]:
        out = root / link if where == "out" else root / link / "run"
        named = f"--out {out} is" if where == "out" else f"--out {out}: {root / link} is"
        line = refused_in_one_line(capsys, ["train", "--config", str(config["cfg_file"]), "--out", str(out), "--quiet"],
                                   f"{named} a symbolic link loop ({circle}); remove")
        assert "nowhere" not in line and "levels" not in line
    assert tree(root) == {"l1": "-> l2", "l2": "-> l1", "self": "-> self"}
    run = root / "run"
    run.mkdir()
    (run / "checkpoints").symlink_to("checkpoints")
    with pytest.raises(rundir.RunDirError, match=r"checkpoints is a symbolic link loop \("):
        rundir.check_no_links(run)


@pytest.mark.parametrize("betas", ["0.9", "[0.9]", "[0.9,0.95,0.99]", "[0.9,1.5]"])
def test_bad_betas_name_the_field_and_the_expected_form(config, capsys, betas):
    """optim.betas of one number, one value, three values or a value >= 1: one line naming optim.betas and the
    form it takes (two numbers in [0, 1)), exit 2, nothing written."""
    out = config["root"] / f"betas-{len(betas)}"
    assert main(train_argv(config, out, f"optim.betas={betas}")) == 2
    last = one_line_error(capsys, "optim.betas")
    assert "two numbers in [0, 1)" in last, last
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
    assert integrity.model_checkpoint(out)[0].name == kept
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
    integrity.write_manifest(ckpt, manifest["step"])
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


def test_export_of_a_run_training_before_its_first_checkpoint_says_so(tmp_path, capsys):
    """export and generate on a run whose trainer holds the lock but has written no checkpoint yet: one line
    naming the process and "wait", not "train it first"."""
    from scalevec.cli import main

    run = tmp_path / "run"
    run.mkdir()
    rundir.write_meta(run, {})
    (run / "config.yaml").write_text("preset: tiny\n")
    with rundir.RunLock(run):
        for argv in (["export", str(run), "--out", str(tmp_path / "hf")], ["generate", str(run), "--prompt", "a"]):
            assert main(argv) == 2
            err = capsys.readouterr().err.strip()
            assert len(err.splitlines()) == 1 and f"is being trained by process {os.getpid()}" in err, err
            assert "wait for its first one" in err and "train it first" not in err


def test_overwrite_removes_the_done_marker_before_the_summary(tmp_path, monkeypatch):
    """--overwrite removes DONE (and DIVERGED) before anything else and meta.json last: a report reading the run
    meanwhile, or after an interrupted removal, sees an unfinished run, never DONE without its summary.json."""
    import fakerun
    from scalevec.training import rundir

    (run,) = expand(spec_from_dict({"base": {"preset": "tiny", "train": {"steps": 10, "batch_size": 2,
                                                                          "seq_len": 16}},
                                    "grid": {"strategy": ["baseline"]}}))
    out = tmp_path / run.name
    fakerun.write_run(out, to_dict(run.cfg))
    (out / "DIVERGED").write_text("{}")
    removed = []
    real_unlink = Path.unlink
    monkeypatch.setattr(Path, "unlink", lambda self, *a, **k: (removed.append(self.name), real_unlink(self, *a, **k)))
    rundir.remove_run(out)
    top = [n for n in removed if (out / n).parent == out]
    assert set(top[:2]) == {"DONE", "DIVERGED"} and top[-1] == "meta.json" and "summary.json" in top, top


def test_run_files_nested_too_deeply_are_damaged_files_not_tracebacks(tmp_path):
    """meta.json, summary.json and a checkpoint's manifest or train state nested 100,000 deep (JSON's C scanner
    recurses once per level) raised RecursionError tracebacks from resume and report; each is now what any other
    damaged file of its kind is: meta unreadable ({}), a RunDirError naming summary.json, a CorruptCheckpoint."""
    deep = "[" * 100_000 + "]" * 100_000
    (tmp_path / rundir.META).write_text(deep)
    assert rundir.read_meta(tmp_path) == {}
    (tmp_path / rundir.SUMMARY).write_text(deep)
    with pytest.raises(rundir.RunDirError, match=r"summary\.json cannot be read \(is not valid JSON \(it nests too"):
        rundir.read_summary(tmp_path)
    ckpt = tmp_path / layout.CKPT_DIR / "step_0000004"
    ckpt.mkdir(parents=True)
    for name in (layout.MANIFEST, layout.TRAIN_STATE):
        (ckpt / name).write_text(deep)
    with pytest.raises(integrity.CorruptCheckpoint, match=rf"{layout.MANIFEST} cannot be read"):
        integrity.verify_checkpoint(ckpt)
    with pytest.raises(integrity.CorruptCheckpoint, match=rf"{layout.TRAIN_STATE} cannot be read"):
        integrity.read_train_state(ckpt)

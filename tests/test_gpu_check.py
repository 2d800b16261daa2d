"""The GPU check (DESIGN.md §8): its summary code, its refusals, and the whole check rehearsed on CPU."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch

from scalevec.bench import gpu_torchtitan
from scalevec.bench.run_speed import run_figures
from scalevec.config.run_budget import tokens_per_step
from scalevec.model import flops
from scalevec.model.flops import flops_per_token
from scalevec.resolve import resolve_config
from scalevec.training.trainer import train

ROOT = Path(__file__).resolve().parents[1]


def _check_script():
    """scripts/gpu_check.py, the checkout's orchestrator of the check, as a module."""
    spec = importlib.util.spec_from_file_location("gpu_check_script", ROOT / "scripts" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check_script"] = mod  # its dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


gpu_check = _check_script()
Stage, write_summary = gpu_check.Stage, gpu_check.write_summary


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A finished 6-step CPU run of the tiny preset (seconds)."""
    run = tmp_path_factory.mktemp("run") / "run"
    cfg = resolve_config("tiny", "unified", {"train.steps": 6, "train.batch_size": 2, "train.seq_len": 32,
                                             "train.eval_every": 6, "train.log_every": 1, "train.threads": 1,
                                             "data.val_tokens": 256, "schedule.warmup": 1})
    train(cfg, run, quiet=True)
    return run, cfg


def test_run_figures_are_the_runs_arithmetic(tiny_run):
    """tokens/s = tokens per step ÷ the summary's step time; MFU = FLOPs/token × tokens/s ÷ the peak (the summary
    that crashed in the old heredoc: a function formatted as a number)."""
    run, cfg = tiny_run
    fig = run_figures(run)
    summary = json.loads((run / "summary.json").read_text())
    assert fig["tokens_per_step"] == tokens_per_step(cfg) == 2 * 32
    assert fig["tokens_per_s"] == pytest.approx(64 / summary["step_time_s"], rel=1e-12)
    assert fig["flops_per_token"] == flops_per_token(cfg.model, 32)
    assert fig["mfu"] == pytest.approx(fig["flops_per_token"] * fig["tokens_per_s"] / summary["peak_flops"], rel=1e-12)
    assert fig["matmul_dtype"] == "torch.float32" and fig["max_memory_gib"] is None  # CPU: no CUDA memory
    assert fig["loss_first"] > fig["loss_last"] > 0


def test_summary_files_list_every_stage(tmp_path):
    """summary.json holds one entry per stage (name, status, seconds, figures, note); summary.md a row each."""
    stages = [Stage("env", "ok", 1.5, {"torch": "2.13"}), Stage("bench", "failed", 3.0, {}, "exit 1: boom | x"),
              Stage("ladder_rung", "skipped", 0.0, {}, "5 s of the budget left")]
    write_summary(tmp_path, stages, {"device": "cpu"})
    data = json.loads((tmp_path / "summary.json").read_text())
    assert [(s["name"], s["status"]) for s in data["stages"]] == [("env", "ok"), ("bench", "failed"),
                                                                   ("ladder_rung", "skipped")]
    md = (tmp_path / "summary.md").read_text()
    assert md.count("\n| ") == 4 and "boom / x" in md  # header + 3 rows; a | in a note cannot break the table
    assert not list(tmp_path.glob(".*tmp"))  # atomic writes leave no temporary file


def test_stage_status_is_checked():
    with pytest.raises(ValueError, match="not one of ok, failed, skipped"):
        Stage("env", "passed")


def test_stage_results_from_exit_and_output(tmp_path):
    """A timed-out stage is failed with its time; a non-zero exit names its last line; pytest's counts are parsed,
    and on CUDA a gpu-test stage that passed nothing is not ok."""
    plan = gpu_check.Plan("busy", ["x"], 10)
    assert gpu_check.stage_result(plan, None, 10.2, "", tmp_path, "cuda").note == "timed out after 10 s"
    bad = gpu_check.stage_result(plan, 1, 1.0, "line 1\nValueError: broken\n", tmp_path, "cuda")
    assert bad.status == "failed" and bad.note == "exit 1: ValueError: broken"
    tests = gpu_check.Plan("gpu_tests", ["x"], 10)
    text = "sss\n3 skipped, 1460 deselected in 9.1s\n"
    assert gpu_check.pytest_counts(text) == {"skipped": 3, "deselected": 1460}
    assert gpu_check.stage_result(tests, 0, 1.0, text, tmp_path, "cpu").status == "ok"
    assert gpu_check.stage_result(tests, 0, 1.0, text, tmp_path, "cuda").status == "failed"
    assert gpu_check.stage_result(tests, 1, 1.0, "1 failed, 2 passed in 3s", tmp_path, "cuda").status == "failed"


def test_refuses_a_non_empty_out_and_a_missing_gpu(tmp_path, capsys):
    (tmp_path / "keep.txt").write_text("precious")
    assert gpu_check.main([str(tmp_path), "--device", "cpu"]) == 2
    assert (tmp_path / "keep.txt").read_text() == "precious"
    assert "not an empty folder" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert gpu_check.main([str(tmp_path / "new"), "--device", "cuda"]) == 2
        assert not (tmp_path / "new").exists()


def test_mfu_peak_follows_the_runs_dtype(monkeypatch, tmp_path):
    """A bf16 run divides by the GPU's bf16 spec figure; an fp32 run by a measured fp32 peak, never the bf16 one."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(flops, "gpu_spec_peak", lambda device: 989.4e12)
    monkeypatch.setattr(flops, "matmul_peak", lambda device, dtype: 51.0e12)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    cuda = torch.device("cuda")
    assert flops.peak_flops(cuda, torch.bfloat16) == (989.4e12, "spec")
    assert flops.peak_flops(cuda, torch.float32) == (51.0e12, "measured")


def test_pack_runs_leaves_checkpoints_out(tmp_path):
    work = tmp_path / "work"
    (work / "run" / "checkpoints" / "step_1").mkdir(parents=True)
    (work / "run" / "checkpoints" / "step_1" / "model.safetensors").write_bytes(b"x" * 1000)
    (work / "run" / "summary.json").write_text("{}")
    gpu_check.pack_runs(work, tmp_path / "runs.tar.gz")
    with tarfile.open(tmp_path / "runs.tar.gz") as tar:
        assert tar.getnames() == ["run", "run/summary.json"]


@pytest.mark.slow
def test_cpu_rehearsal_runs_every_stage_ok(tmp_path):
    """``DEVICE=cpu bash scripts/gpu_check.sh OUT`` with scalevec not installed (``python -S``: no .pth file, so no
    editable install; the checkout comes from the script's PYTHONPATH): every stage ok, at most 8 files in OUT,
    none over 16 MB, scalevec imported from this checkout."""
    site = [p for p in sys.path if p.endswith("site-packages")]
    wrapper = tmp_path / "python"
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")
    wrapper.chmod(0o755)
    env = {**os.environ, "DEVICE": "cpu", "PYTHON": str(wrapper), "PYTHONPATH": os.pathsep.join(site)}
    out = tmp_path / "out"
    r = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), str(out)], env=env, capture_output=True,
                       text=True, timeout=900)
    summary = json.loads((out / "summary.json").read_text())
    status = {s["name"]: (s["status"], s["note"]) for s in summary["stages"]}
    assert [s["name"] for s in summary["stages"]] == [p.name for p in gpu_check.plans("cpu", tmp_path, "py")
                                                      if not p.opt_in]
    assert all(v[0] == "ok" for v in status.values()), status
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    files = list(out.iterdir())
    assert len(files) <= 8 and all(f.stat().st_size < 16 * 2**20 for f in files)
    figures = json.loads((out / "stages.json").read_text())
    assert figures["env"]["scalevec_from"] == str(ROOT / "src" / "scalevec")
    assert figures["fsdp2_compile_resume"]["resume_bitwise"] is True  # CPU fp32: resume is bitwise
    assert figures["fsdp2_compile_resume"]["quiet_steps_timed"] > 0  # its speed from the steps that log nothing
    assert {"baseline_step_ms", "unified_step_ratio"} <= figures["bench_compiled"].keys()
    assert "| fsdp2_compile_resume | ok |" in (out / "summary.md").read_text()


def test_resume_is_judged_against_the_runs_own_drift():
    """On CUDA two uninterrupted runs drift apart (atomics): a resume within that drift passes (the H200 check's
    own losses), one that lost its optimizer state (a jump at the first resumed step) fails; on CPU only 0 passes."""
    from scalevec.bench.gpu_stages import resume_verdict

    a = {18: 3.2093, 19: 3.0946, 20: 3.1589, 21: 3.1289, 39: 2.8314}
    b = {18: 3.2096, 19: 3.0964, 20: 3.1587, 21: 3.1274, 39: 2.8377}  # results/gpu/2026-12-04: resume-a vs -b
    v = resume_verdict(a, b, 20, exact=False)
    assert v["resume_ok"] and v["drift_before_checkpoint"] == pytest.approx(0.0018)
    assert not resume_verdict(a, {**b, 20: 3.30}, 20, exact=False)["resume_ok"]  # a jump at the first resumed step
    assert not resume_verdict(a, {k: v for k, v in b.items() if k != 21}, 20, exact=False)["resume_ok"]  # a gap
    assert not resume_verdict(a, b, 20, exact=True)["resume_ok"]
    assert resume_verdict(a, dict(a), 20, exact=True)["resume_ok"]


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a killed process whose parent died may linger as a zombie until init reaps it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_timed_out_stage_dies_with_every_process_it_started(tmp_path):
    """GNU timeout (as gpu_ladder.sh runs the study) puts its child in a process group of its own: the stage's
    timeout still kills it, and the check does not wait for it on the open pipe."""
    import time

    pid_file = tmp_path / "pid"
    plan = gpu_check.Plan("x", ["bash", "-c", f"timeout 60 bash -c 'echo $$ > {pid_file}; sleep 60' & wait"], 1)
    t0 = time.monotonic()
    with open(tmp_path / "log", "w") as log:
        rc, seconds, _ = gpu_check.run_stage(plan, 2.0, log, dict(os.environ))
    assert rc is None and time.monotonic() - t0 < 15
    time.sleep(0.5)
    assert not alive(int(pid_file.read_text()))


def test_sigterm_stops_the_check_kills_its_stage_and_keeps_a_summary(tmp_path):
    """SIGTERM mid-stage: exit 75, the stage's process gone, summary.json says which stage was interrupted, the
    work folder removed."""
    import signal
    import time

    pid_file = tmp_path / "pid"
    stub = tmp_path / "python"  # every stage's interpreter: records its pid, then hangs
    stub.write_text(f"#!/bin/sh\necho $$ > {pid_file}\nexec sleep 60\n")
    stub.chmod(0o755)
    out = tmp_path / "out"
    env = {**os.environ, "PYTHON": str(stub), "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "gpu_check.py"), str(out), "--device", "cpu",
                             "--only", "env"], env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    for _ in range(200):
        if pid_file.exists() and pid_file.read_text().strip():
            break
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 75
    time.sleep(0.5)
    assert not alive(int(pid_file.read_text()))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stages"][0]["note"] == "interrupted by SIGTERM" and summary["header"]["interrupted"] == "SIGTERM"
    assert not list(tmp_path.glob("gpu_check_*"))


def test_bad_python_and_unwritable_out_are_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PYTHON", str(tmp_path / "no-such-python"))
    assert gpu_check.main([str(tmp_path / "a"), "--device", "cpu"]) == 2
    assert "not an interpreter" in capsys.readouterr().err
    monkeypatch.delenv("PYTHON")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere" / "x")
    assert gpu_check.main([str(tmp_path / "dangling"), "--device", "cpu"]) == 2
    assert "cannot write into" in capsys.readouterr().err
    r = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), str(tmp_path / "b")], capture_output=True,
                       text=True, env={**os.environ, "PYTHON": "/bin/false", "DEVICE": "cpu"})
    assert r.returncode == 2 and "cannot import torch" in r.stderr and not (tmp_path / "b").exists()


def test_the_benches_come_first_and_the_ladder_only_when_named():
    """After env, the first stages are the eager and the compiled bench of baseline and unified at llama-0.12b (what
    matters first); the ladder rung, which does not fit the default budget, runs only when --only names it."""
    plans = gpu_check.plans("cuda", Path("/w"), "py")
    assert [p.name for p in plans[:3]] == ["env", "bench", "bench_compiled"]
    for p in plans[1:3]:
        argv = " ".join(p.argv)
        assert "--preset llama-0.12b" in argv and "--dtype bfloat16" in argv and "baseline,unified" in argv
    assert "--compile" in plans[2].argv and "--compile" not in plans[1].argv
    assert [p.name for p in plans if p.opt_in] == ["torchtitan", "ladder_rung"]
    assert gpu_check.BUDGET_S["cuda"] * 2 + 180 <= 15 * 60  # two runs and a machine's start in 15 GPU minutes


def test_gpu_tests_collect_only_the_files_with_gpu_tests():
    """``pytest -m gpu`` is given the test files that hold a gpu-marked test, and no other (it imported the whole
    suite to deselect 1,574 tests on the H200)."""
    argv = next(p for p in gpu_check.plans("cuda", Path("/w"), "py") if p.name == "gpu_tests").argv
    files = {Path(a).name for a in argv if a.endswith(".py")}
    marked = {p.name for p in (ROOT / "tests").glob("test_*.py") if "@pytest.mark.gpu" in p.read_text()}
    assert files == marked and len(marked) >= 5


def test_an_implausible_ratio_or_mfu_fails_its_stage_on_cuda_only(tmp_path):
    """On CUDA a bench whose unified step is 23x faster than the baseline's, or whose MFU is 81 % (figures a CPU
    rehearsal once reported), is a failed stage naming the figure; plausible figures pass. On a shared CPU the same
    figures are named in the note and the stage stays ok (its peak and step times move with the machine's load)."""
    def bench_stage(ratio: float, mfu: float, device: str = "cuda"):
        rows = [{"name": "baseline", "median_s": 0.1, "tokens_per_s": 1e4, "mfu": 0.2, "ratio": 1.0},
                {"name": "unified", "median_s": 0.1 * ratio, "tokens_per_s": 1e4 / ratio, "mfu": mfu, "ratio": ratio}]
        bench = {"peak_tflops": 1.0, "peak_source": "x", "reference": "baseline", "train": rows}
        (tmp_path / "bench.json").write_text(json.dumps(bench))
        return gpu_check.stage_result(gpu_check.Plan("bench", ["x"], 10), 0, 1.0, "", tmp_path, device)

    assert bench_stage(1.1, 0.2).status == "ok"
    fast = bench_stage(0.043, 0.2)
    assert fast.status == "failed" and fast.note == "implausible: unified_step_ratio 0.043"
    high = bench_stage(1.1, 0.81)
    assert high.status == "failed" and high.note == "implausible: unified_mfu 0.81"
    on_cpu = bench_stage(0.043, 0.81, "cpu")
    assert on_cpu.status == "ok"
    assert on_cpu.note == "implausible on a shared CPU (not judged): unified_mfu 0.81, unified_step_ratio 0.043"


def test_quiet_step_times_leave_the_log_steps_out(tmp_path):
    """The resume stage's speed comes from the steps that log nothing: of 8 steps logged every 2nd (and the last),
    after the first, steps 1, 3 and 5."""
    from scalevec.bench.gpu_stages import quiet_step_times

    cfg = resolve_config("tiny", "baseline", {"train.steps": 8, "train.batch_size": 2, "train.seq_len": 16,
                                              "train.log_every": 2, "train.eval_every": 8, "train.threads": 1,
                                              "data.val_tokens": 128, "schedule.warmup": 1})
    times = quiet_step_times(cfg, tmp_path / "run", warmup=1)
    assert len(times) == 3 and all(t > 0 for t in times)


def _script(out: Path, env: dict) -> subprocess.Popen:
    return subprocess.Popen(["bash", str(ROOT / "scripts" / "gpu_check.sh"), str(out)], env={**os.environ, **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_script_exits_non_zero_when_no_summary_was_written(tmp_path):
    """A PYTHON that passes for a torch interpreter but runs nothing (exit 0) leaves no summary: the script says so
    and exits 1, never 0; /bin/true is refused as an interpreter without torch."""
    stub = tmp_path / "python"
    stub.write_text("#!/bin/sh\ncase \"$*\" in *'import torch'*) echo 'torch imported';; esac\nexit 0\n")
    stub.chmod(0o755)
    r = _script(tmp_path / "out", {"PYTHON": str(stub), "DEVICE": "cpu"})
    _, err = r.communicate(timeout=60)
    assert r.returncode == 1 and "no summary was written" in err
    r = _script(tmp_path / "out2", {"PYTHON": "/bin/true", "DEVICE": "cpu"})
    _, err = r.communicate(timeout=60)
    assert r.returncode == 2 and "cannot import torch" in err


def test_script_passes_sigterm_to_the_check(tmp_path):
    """SIGTERM to the script reaches the check once: it kills its running stage, writes its summary and exits 75,
    which the script returns."""
    import signal
    import time

    pid_file = tmp_path / "pid"
    stub = tmp_path / "python"  # the check runs; its stages hang
    stub.write_text(f"#!/bin/sh\ncase \"$*\" in *gpu_stages*) echo $$ > {pid_file}; exec sleep 60;; esac\n"
                    f"exec {sys.executable} \"$@\"\n")
    stub.chmod(0o755)
    out = tmp_path / "out"
    proc = _script(out, {"PYTHON": str(stub), "DEVICE": "cpu", "ONLY": "env", "TMPDIR": str(tmp_path)})
    for _ in range(300):
        if pid_file.exists() and pid_file.read_text().strip():
            break
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 75
    time.sleep(0.5)
    assert not alive(int(pid_file.read_text()))
    assert json.loads((out / "summary.json").read_text())["header"]["interrupted"] == "SIGTERM"


def test_torchtitan_stage_is_not_run_without_torchtitan(monkeypatch, tmp_path):
    """Where torchtitan does not import, the torchtitan stage reports "not run" with the install line: a status of its
    own in the summary, neither ok nor one that fails the check."""
    monkeypatch.setitem(sys.modules, "torchtitan", None)  # import torchtitan raises ModuleNotFoundError
    figures = gpu_torchtitan.torchtitan_stage("cpu")
    assert figures == {"not_run": gpu_torchtitan.NOT_INSTALLED}
    (tmp_path / "torchtitan.json").write_text(json.dumps(figures))
    plan = next(p for p in gpu_check.plans("cuda", tmp_path, "py") if p.name == "torchtitan")
    stage = gpu_check.stage_result(plan, 0, 2.0, "", tmp_path, "cuda")
    assert (stage.status, stage.note) == (
        "not run", "not run: torchtitan 0.3.0 not installed (pip install torchtitan==0.3.0 --no-deps)")
    assert stage.status != "ok" and stage.status in gpu_check.PASSING
    write_summary(tmp_path, [Stage("env", "ok"), stage], {})
    assert "| torchtitan | not run |" in (tmp_path / "summary.md").read_text()
    broken = ModuleNotFoundError("No module named 'tyro'", name="tyro")  # installed --no-deps without a dependency
    assert gpu_torchtitan.not_run_reason(broken) == \
        "torchtitan does not import here: ModuleNotFoundError: No module named 'tyro'"


def test_torchtitan_groups_check_sees_a_different_group():
    """``groups_equal`` fails on an optimizer whose groups differ from the wanted ones in decay, lr or tensors."""
    a, b, c = (torch.nn.Parameter(torch.ones(2)) for _ in range(3))
    want = [{"params": [a], "lr": 1e-3, "weight_decay": 0.1}, {"params": [b], "lr": 1e-3, "weight_decay": 0.0}]
    assert gpu_torchtitan.groups_equal(torch.optim.AdamW([dict(g) for g in want]), want)
    for key, value in (("weight_decay", 0.0), ("lr", 2e-3), ("params", [c])):
        assert not gpu_torchtitan.groups_equal(torch.optim.AdamW([{**want[0], key: value}, want[1]]), want)


@pytest.mark.slow  # builds and trains torchtitan's debugmodel twice on the CPU (~20 s on the shared 2 cores)
def test_torchtitan_stage_trains_the_converted_debugmodel_on_cpu():
    """The stage's CPU rehearsal (SDPA attention: flex has no CPU backward): torchtitan's training step of the
    debugmodel converted to unified, stepped by ScalevecOptimizers (its container passes the weight-decay guard),
    lowers the loss on its fixed batch; the optimizer's groups are param_groups' (unified decays the input scales,
    not the embedding); both step times are measured."""
    fig = gpu_torchtitan.torchtitan_stage("cpu", steps=3)
    assert fig["ok"] and fig["loss_falls"] and fig["groups_equal_param_groups"], fig
    assert fig["attention"].startswith("sdpa") and len(fig["unified_losses"]) == len(fig["baseline_losses"]) == 3
    assert fig["unified_loss_last"] < fig["unified_loss_first"]
    assert fig["groups"]["input_scale"]["weight_decay"] == 0.1 and fig["groups"]["embedding"]["weight_decay"] == 0.0
    assert fig["optimizer_groups"] == len(fig["groups"]) and fig["unified_step_ms"] > 0 and fig["baseline_step_ms"] > 0

"""The GPU check (DESIGN.md §8): every stage of the CUDA path, cheapest first, within one wall-time
budget, everything it learns written into one output folder. ``scripts/gpu_check.sh OUT`` runs this script.

    python scripts/gpu_check.py OUT [--device cuda|cpu] [--budget-s S] [--only STAGE,...]

It is the checkout's tool, not the library's: it runs this checkout's GPU tests and ``scripts/gpu_ladder.sh``, so
it lives beside them; what it measures in-process is the installed ``scalevec.bench.gpu_stages`` (each stage a
``python -m scalevec.bench.gpu_stages NAME`` of its own) and ``scalevec bench``.

Stages (each its own process and timeout; a failed or timed-out stage never stops the next; a stage that would
not fit in what is left of the budget is skipped and said so), what matters first:

1. ``env``: torch, CUDA, the GPU, ``grouped_mm``, every scalevec module imports (``gpu_stages.env_report``);
2. ``bench``: ``scalevec bench`` eager baseline / unified / HF Llama at 0.12B, 16 × 2048 tokens, bf16, MFU against
   the measured bf16 matmul peak;
3. ``bench_compiled``: the same, compiled per block (baseline and unified: the step a long run takes);
4. ``gpu_tests``: ``pytest -m gpu`` on the test files that hold GPU tests, only (on CPU they skip: the stage
   checks that they are collected);
5. ``parity``: CUDA vs CPU fp32 logits of every strategy, at init and after 5 steps (``gpu_stages.parity``);
6. ``busy``: eager bf16 steps of baseline and unified at a GPU-ladder rung's size: step time, tokens/s, GPU-busy
   fraction (``gpu_stages.busy``);
7. ``fsdp2_compile_resume``: ``llama-0.12b`` unified under ``torchrun`` FSDP2 + compile, bf16, checkpoint and
   resume (``gpu_stages.resume``): speed (from the steps that log nothing), MFU, memory, the resumed losses against
   an uninterrupted run;
8. ``torchtitan`` (opt-in: ``--only torchtitan``, ``ONLY=torchtitan``; the seven stages above already take the
   default budget, and torchtitan is an optional framework): torchtitan 0.3.0's Llama3 debugmodel converted to
   ``unified`` by ``ScalevecConverter`` trains 10 steps of torchtitan's training step with ``ScalevecOptimizers``
   beside the unconverted model (``gpu_torchtitan.py``): the loss falls, the optimizer's groups are
   ``param_groups``', the two step times. Where torchtitan does not import its status is "not run" (the reason in
   its note), which leaves the exit status 0;
9. ``ladder_rung`` (opt-in: ``--only ladder_rung``, ``ONLY=ladder_rung``; it does not fit the default budget): the
   first GPU-ladder rung (``scripts/gpu_ladder.sh cpu-1m``, each strategy at its predicted lr, 2 seeds), its folder
   in the format of ``results/``.

The default budget on CUDA (360 s) leaves room for a second run within 15 minutes of GPU time. Every speed figure
is checked for plausibility (``PLAUSIBLE``): on CUDA a ratio or an MFU no training step can have marks its stage
failed; on CPU the note names it and the stage stays ok (a shared CPU's measured peak and step times move with its
load: the rehearsal once failed this way at random).
On CPU (``--device cpu``, the rehearsal) the same stages run at tiny sizes in about five minutes (compiling takes most).

``OUT`` receives at most 5 files: ``summary.json`` and ``summary.md`` (rewritten after every stage),
``gpu_check.log`` (every stage's output), ``stages.json`` (every stage's full figures) and ``runs.tar.gz`` (the
run directories and the ladder rung's folder, checkpoints left out). Exit status: 0 when every stage ran ok (or
was "not run": torchtitan absent), 1 when one failed or was skipped, 2 for bad input (a device that is not there, an
``OUT`` that is not empty or not writable, a ``PYTHON`` that is not an interpreter), 130 after Ctrl-C and 75 after
SIGTERM (the running stage and everything it started killed, the summary of the stages so far written).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

# the checkout whose scripts/, tests/ and results/ the stages run: this script's own
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))  # scalevec from this checkout

from scalevec.config.typed import is_number  # noqa: E402
from scalevec.training.checkpoint.layout import CKPT_DIR  # noqa: E402
from scalevec.training.rundir import DONE, METRICS, SUMMARY  # noqa: E402

# cuda: two runs and a machine's start fit in 15 minutes of GPU time; cpu: the compiled bench alone takes minutes
BUDGET_S = {"cuda": 360, "cpu": 360}
MIN_STAGE_S = 20  # a stage that would get less than this is skipped
LADDER_RUNG = "cpu-1m"
MAX_TAR_BYTES = 16 * 2**20


# "not run": a stage that needs something this machine lacks by choice (torchtitan): neither ok nor a failure
STATUSES = ("ok", "failed", "skipped", "not run")
PASSING = ("ok", "not run")  # the statuses that leave the check's exit status 0


@dataclass
class Stage:
    """One stage of the check: ``status`` one of ``STATUSES``; ``seconds`` wall time; ``figures`` its key
    numbers; ``note`` one line (why it failed or was skipped, what it saw). Raises ``ValueError`` for another
    status."""

    name: str
    status: str
    seconds: float = 0.0
    figures: dict = field(default_factory=dict)
    note: str = ""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"stage {self.name}: status {self.status!r} is not one of {', '.join(STATUSES)}")


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def summary_markdown(stages: list[Stage], header: dict) -> str:
    """The check as a markdown table: one row per stage with its status, seconds and key figures."""
    lines = ["# GPU check", ""] + [f"- {k}: {_fmt(v)}" for k, v in header.items()] + [
        "", "| stage | status | seconds | figures | note |", "|---|---|---:|---|---|"]
    for s in stages:
        figs = "; ".join(f"{k} {_fmt(v)}" for k, v in s.figures.items() if not isinstance(v, (dict, list)))
        lines.append(f"| {s.name} | {s.status} | {s.seconds:.0f} | {figs} | {s.note.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def write_summary(out: str | Path, stages: list[Stage], header: dict) -> None:
    """Write ``out/summary.json`` (``{"header": ..., "stages": [...]}``) and ``out/summary.md``, each atomically, so
    a check killed between stages still leaves a readable summary of the stages it finished."""
    out = Path(out)
    _atomic_write(out / "summary.json", json.dumps({"header": header, "stages": [asdict(s) for s in stages]},
                                                   indent=1, default=str))
    _atomic_write(out / "summary.md", summary_markdown(stages, header))


@dataclass
class Plan:
    """One stage to run: ``argv`` under ``timeout_s`` (capped by what is left), with extra ``env``."""

    name: str
    argv: list[str]
    timeout_s: float
    env: dict[str, str] | None = None
    figures_file: str | None = None  # WORK/NAME.json written by a gpu_stages stage
    opt_in: bool = False  # run only when ``--only`` names it


# What a training step's figures can be (a rehearsal once reported unified 23x faster than the baseline and
# 81 % MFU of a mis-measured peak as ok). unified does the baseline's work and more: 0.5-8x its step covers load
# noise on a shared CPU and the 3.5x a small GPU step measured (results/gpu/2026-12-04); no training step reaches
# 75 % of the matmul peak (the best large runs report 40-60 %).
PLAUSIBLE = {"ratio": (0.5, 8.0), "mfu": (0.0, 0.75)}


def gpu_test_files() -> list[str]:
    """The test files that hold a ``gpu``-marked test: ``pytest -m gpu`` collects these only, not the whole suite."""
    return [str(p) for p in sorted((ROOT / "tests").glob("test_*.py")) if "pytest.mark.gpu" in p.read_text()]


def plans(device: str, work: Path, py: str) -> list[Plan]:
    """The stages of the check, in order, for ``device`` (see the module docstring)."""
    stages = [py, "-m", "scalevec.bench.gpu_stages"]
    common = ["--work", str(work), "--device", device]
    cuda = device == "cuda"
    bench_preset = "llama-0.12b" if cuda else "cpu-25k"
    ladder_env = {"DEVICE": device, "RESULTS": str(ROOT / "results"), "DEST": str(work / "results"),
                  "PREDICTED_ONLY": "1", "SEEDS": "2", "JOBS": "6" if cuda else "2", "PYTHON": py}
    if not cuda:  # the rehearsal: a rung of a few steps
        ladder_env.update(TPP="0.02", VAL_TOKENS="4096", SEEDS="1")
    def bench(name: str, strategies: str, compile: bool, timeout: float) -> Plan:
        return Plan(name, [py, "-m", "scalevec", "bench", "--device", device, "--dtype",
                           "bfloat16" if cuda else "float32", "--preset", bench_preset, "--strategies", strategies,
                           "--steps", "10" if cuda else "3", "--warmup", "3" if cuda else "1", "--no-inference",
                           "--no-memory", "--save", str(work / f"{name}.json")]
                    + (["--compile"] if compile else []) + ([] if cuda else ["--threads", "2"]), timeout)

    return [
        Plan("env", stages + ["env"] + common, 90, figures_file="env.json"),
        bench("bench", "baseline,unified,hf-llama", False, 120),
        bench("bench_compiled", "baseline,unified", True, 240),
        Plan("gpu_tests", [py, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "-rs", *gpu_test_files()],
             120),
        Plan("parity", stages + ["parity"] + common, 120, figures_file="parity.json"),
        Plan("busy", stages + ["busy"] + common, 150, figures_file="busy.json"),
        Plan("fsdp2_compile_resume", [py, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1",
                                      "-m", "scalevec.bench.gpu_stages", "resume"] + common, 300,
             figures_file="resume.json"),
        Plan("torchtitan", stages + ["torchtitan"] + common, 120, figures_file="torchtitan.json", opt_in=True),
        Plan("ladder_rung", ["bash", str(ROOT / "scripts" / "gpu_ladder.sh"), LADDER_RUNG], 400, env=ladder_env,
             opt_in=True),
    ]


def implausible(figures: dict) -> list[str]:
    """The figures of a stage outside ``PLAUSIBLE``: every ``*ratio`` key (a step against the baseline's) and every
    ``*mfu`` key, as ``"name value"`` strings (empty when all are plausible or absent)."""
    out = []
    for key, value in figures.items():
        kind = "ratio" if key.endswith("ratio") else "mfu" if key.endswith("mfu") else None
        if kind is None or not is_number(value, finite=False):
            continue
        lo, hi = PLAUSIBLE[kind]
        if not lo < value <= hi:
            out.append(f"{key} {value:.4g}")
    return out


def pytest_counts(text: str) -> dict:
    """``{"passed": n, "failed": n, "skipped": n, ...}`` from pytest's last summary line in ``text``."""
    counts = {}
    for n, what in re.findall(r"(\d+) (passed|failed|skipped|deselected|errors?|xfailed|xpassed)", text):
        counts[what.rstrip("s") if what.startswith("error") else what] = int(n)
    return counts


def bench_figures(path: Path) -> dict:
    """Per candidate: step ms, tokens/s, MFU against the measured peak and the spec, and the peak, from
    ``scalevec bench --save``'s JSON."""
    data = json.loads(path.read_text())
    out = {"peak_tflops": data["peak_tflops"], "peak_source": data["peak_source"]}
    for row in data["train"]:
        n = row["name"]
        out[f"{n}_step_ms"] = row["median_s"] * 1e3
        out[f"{n}_tokens_per_s"] = row["tokens_per_s"]
        out[f"{n}_mfu"] = row["mfu"]
        if n != data["reference"]:  # paired round by round against the first candidate (the baseline)
            out[f"{n}_step_ratio"] = row["ratio"]
        if row.get("mfu_spec") is not None:
            out[f"{n}_mfu_spec"] = row["mfu_spec"]
    return out


def ladder_figures(dest: Path) -> dict:
    """How many runs of the rung finished, and their final validation losses (``run name -> nats/token``)."""
    runs = sorted(dest.glob(f"ladder-{LADDER_RUNG}-*/runs/*/{SUMMARY}"))
    done = {p.parent.name: json.loads(p.read_text()).get("final_val_loss") for p in runs
            if (p.parent / DONE).exists()}
    return {"runs_done": len(done), "final_val_loss": done}


def stage_result(plan: Plan, rc: int | None, seconds: float, text: str, work: Path, device: str) -> Stage:
    """The summary line of a finished (``rc``) or timed-out (``rc`` None) stage, from its exit, output and files."""
    figures, note = {}, ""
    try:
        if plan.figures_file and (work / plan.figures_file).exists():
            figures = json.loads((work / plan.figures_file).read_text())
        elif plan.name == "gpu_tests":
            figures = pytest_counts(text)
        elif plan.name.startswith("bench") and (work / f"{plan.name}.json").exists():
            figures = bench_figures(work / f"{plan.name}.json")
        elif plan.name == "ladder_rung":
            figures = ladder_figures(work / "results")
    except (OSError, ValueError, KeyError) as e:
        note = f"figures unreadable: {type(e).__name__}: {e}"
    if rc is None:
        return Stage(plan.name, "failed", seconds, figures, note or f"timed out after {seconds:.0f} s")
    if rc == 0 and figures.get("not_run"):  # the stage found what it needs missing on this machine
        return Stage(plan.name, "not run", seconds, figures, f"not run: {figures['not_run']}")
    ok = rc == 0
    if plan.name == "gpu_tests":
        ok = rc == 0 and figures.get("failed", 0) == 0 and figures.get("error", 0) == 0
        ran = figures.get("passed", 0) + figures.get("skipped", 0)
        if device == "cuda":
            ok = ok and figures.get("passed", 0) > 0
        else:  # no CUDA: every gpu test skips; the stage checks they were collected and skipped, nothing else
            ok = rc in (0, 5) and figures.get("failed", 0) == 0 and ran > 0
            note = note or f"{figures.get('skipped', 0)} gpu test(s) skipped: no CUDA device"
    odd = implausible(figures)
    if ok and odd and device == "cuda":
        ok, note = False, f"implausible: {', '.join(odd)}"
    elif ok and odd:  # a shared CPU's peak and step times move with its load: the rehearsal reports, never fails, them
        note = f"implausible on a shared CPU (not judged): {', '.join(odd)}"
    if not ok and not note:
        tail = [ln for ln in text.strip().splitlines() if ln.strip()][-1:] or [""]
        note = f"exit {rc}: {tail[0][:200]}"
    return Stage(plan.name, "ok" if ok else "failed", seconds, figures, note)


def kill_session(sid: int) -> None:
    """SIGKILL every process of session ``sid`` (a stage started with ``start_new_session``): its own process group
    and any group a child made of its own (GNU ``timeout`` does, in gpu_ladder.sh), found in ``/proc``."""
    groups = {sid}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after "pid (comm)": state ppid pgrp session ...
        except (OSError, IndexError):
            continue
        if len(fields) > 3 and int(fields[3]) == sid:
            groups.add(int(fields[2]))
    for pgid in groups:
        try:
            os.killpg(pgid, 9)
        except OSError:  # gone already
            pass


def run_stage(plan: Plan, timeout_s: float, log, env: dict) -> tuple[int | None, float, str]:
    """Run ``plan`` in its own session; ``(exit code, or None on timeout, seconds, its output)``. On a timeout, and
    on Ctrl-C or SIGTERM of the check itself, every process of the stage's session is killed (a stage left behind
    would hold the GPU); the interrupt then propagates."""
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(plan.argv, cwd=ROOT, env={**env, **(plan.env or {})}, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
    except OSError as e:  # the interpreter or bash is missing
        return 127, time.monotonic() - t0, f"cannot start {plan.argv[0]}: {e}"
    try:
        out, _ = proc.communicate(timeout=timeout_s)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        kill_session(proc.pid)
        out, _ = proc.communicate()
        rc = None
    except BaseException:  # KeyboardInterrupt, or Interrupted from the SIGTERM handler
        kill_session(proc.pid)
        proc.communicate()
        raise
    log.write(out or "")
    log.flush()
    return rc, time.monotonic() - t0, out or ""


class Interrupted(Exception):
    """SIGTERM reached the check: it stops like Ctrl-C (the running stage killed, the summary written)."""


def pack_runs(work: Path, tar_path: Path) -> int:
    """``work``'s run directories and ladder folder as one gzipped tarball without checkpoints or token caches;
    returns its size in bytes (a tarball over ``MAX_TAR_BYTES`` is rebuilt without ``metrics.jsonl`` files)."""
    def keep(metrics: bool):
        def f(info: tarfile.TarInfo):
            parts = Path(info.name).parts
            if CKPT_DIR in parts or info.name.endswith((".pt", ".bin", ".safetensors")) or ".cache" in parts:
                return None
            if not metrics and info.name.endswith(METRICS):
                return None
            return info
        return f

    for metrics in (True, False):
        with tarfile.open(tar_path, "w:gz") as tar:
            for p in sorted(work.iterdir()):
                if p.is_dir():
                    tar.add(p, arcname=p.name, filter=keep(metrics))
        if tar_path.stat().st_size <= MAX_TAR_BYTES:
            break
    return tar_path.stat().st_size


def check(out: Path, device: str, budget_s: float, py: str = sys.executable, only: list[str] | None = None) -> int:
    """Run every stage (or those named in ``only``) into ``out`` (see the module docstring); the exit status."""
    start = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="gpu_check_"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])),
           "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}  # a GPU machine may have no network: never wait on a hub
    if device == "cpu":
        env.setdefault("OMP_NUM_THREADS", "2")
    header = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
              "device": device, "budget_s": budget_s, "python": sys.version.split()[0]}
    try:
        import torch

        header.update(torch=torch.__version__, cuda=torch.version.cuda,
                      gpu=torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
    except Exception as e:  # the env stage reports it in full
        header["torch"] = f"not importable: {e}"
    results: list[Stage] = []
    interrupted = None

    def on_term(signum, frame):
        raise Interrupted()

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        with open(out / "gpu_check.log", "a") as log:
            for plan in plans(device, work, py):
                if (only and plan.name not in only) or (plan.opt_in and not only):
                    continue
                left = budget_s - (time.monotonic() - start)
                if left < MIN_STAGE_S:
                    results.append(Stage(plan.name, "skipped", 0.0, {}, f"{left:.0f} s of the budget left"))
                    print(f"gpu_check: {plan.name} skipped: {left:.0f} s of the budget left", flush=True)
                else:
                    timeout = min(plan.timeout_s, left)
                    if plan.name == "ladder_rung":  # the ladder's own deadline, inside the stage's
                        plan.env = {**(plan.env or {}), "BUDGET_S": str(max(1, int(timeout - 15)))}
                    log.write(f"\n== {datetime.datetime.now(datetime.UTC):%H:%M:%S} {plan.name}: "
                              f"{' '.join(plan.argv)} (timeout {timeout:.0f} s)\n")
                    log.flush()
                    print(f"gpu_check: {plan.name} (timeout {timeout:.0f} s)", flush=True)
                    try:
                        rc, seconds, text = run_stage(plan, timeout, log, env)
                    except (KeyboardInterrupt, Interrupted) as e:
                        interrupted = "SIGTERM" if isinstance(e, Interrupted) else "Ctrl-C"
                        results.append(Stage(plan.name, "failed", 0.0, {}, f"interrupted by {interrupted}"))
                        break
                    results.append(stage_result(plan, rc, seconds, text, work, device))
                    s = results[-1]
                    print(f"gpu_check: {s.name} {s.status} in {s.seconds:.0f} s {s.note}", flush=True)
                header["seconds"] = round(time.monotonic() - start, 1)
                write_summary(out, results, header)
    finally:
        signal.signal(signal.SIGTERM, previous)
        if interrupted:
            header["interrupted"] = interrupted
        (out / "stages.json").write_text(json.dumps({s.name: s.figures for s in results}, indent=1, default=str))
        try:
            header["runs_tar_bytes"] = pack_runs(work, out / "runs.tar.gz")
        except OSError as e:
            header["runs_tar_bytes"] = f"not written: {e}"
        header["seconds"] = round(time.monotonic() - start, 1)
        write_summary(out, results, header)
        shutil.rmtree(work, ignore_errors=True)
    if interrupted:
        print(f"gpu_check: interrupted by {interrupted}; the stages so far are in {out}/summary.md", file=sys.stderr)
        return 130 if interrupted == "Ctrl-C" else 75
    return 0 if all(s.status in PASSING for s in results) else 1


def main(argv: list[str] | None = None) -> int:
    """CLI of the check (the module docstring). Bad input: one line on stderr, exit 2."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", help="an empty or new folder for the check's files")
    p.add_argument("--device", choices=["cuda", "cpu"], default=os.environ.get("DEVICE", "cuda"))
    p.add_argument("--budget-s", type=float, help="wall-time budget in seconds (default 360)")
    p.add_argument("--only", help="comma-separated stage names to run (default: all but the opt-in torchtitan and "
                                  "ladder_rung, in order)")
    args = p.parse_args(argv)
    names = [pl.name for pl in plans("cpu", Path("."), "python")]
    only = [x.strip() for x in args.only.split(",")] if args.only else None
    if only and set(only) - set(names):
        print(f"gpu_check: --only {args.only}: unknown stage(s) {', '.join(sorted(set(only) - set(names)))}; "
              f"choose from {', '.join(names)}", file=sys.stderr)
        return 2
    out = Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        print(f"gpu_check: {out} is not an empty folder; give a new or empty one", file=sys.stderr)
        return 2
    if args.budget_s is not None and not args.budget_s > 0:
        print(f"gpu_check: --budget-s {args.budget_s} must be positive", file=sys.stderr)
        return 2
    if args.device == "cuda":
        try:
            import torch

            cuda = torch.cuda.is_available()
        except ImportError:
            cuda = False
        if not cuda:
            print("gpu_check: this python's torch sees no CUDA device; run with DEVICE=cpu for the CPU rehearsal",
                  file=sys.stderr)
            return 2
    py = os.environ.get("PYTHON") or sys.executable
    if not (shutil.which(py) or os.access(py, os.X_OK)):
        print(f"gpu_check: PYTHON={py} is not an interpreter here; point PYTHON at a python3 with torch",
              file=sys.stderr)
        return 2
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / "gpu_check.log").touch()
    except OSError as e:
        print(f"gpu_check: cannot write into {out} ({e.strerror or e}); give a new folder you can write",
              file=sys.stderr)
        return 2
    return check(out, args.device, args.budget_s or BUDGET_S[args.device], py, only)


if __name__ == "__main__":
    sys.exit(main())

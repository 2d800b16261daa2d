"""The health guard: stops a run that diverged and records why in ``DIVERGED`` (DESIGN.md §8).

``HealthGuard`` reads the global figures of each step (loss, aux loss, gradient norm: every rank sees the
same) before the optimizer step, and each validation loss, and stops the run with ``TrainingDiverged``
on a non-finite figure, a loss blow-up, a dead model or a loss spike. Its state (the recent losses, the
runs of unhealthy steps, the blow-up reference) goes into every checkpoint (``state_dict``) and comes back
on resume (``load_state_dict``), so a resumed run judges its steps as the straight run would. It only
reads: a healthy run is bitwise the same with or without it. Rank 0 writes ``DIVERGED``.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from pathlib import Path

from scalevec.config import RunConfig
from scalevec.config.typed import is_int, is_number, short
from scalevec.training import rundir
from scalevec.training.checkpoint import layout
from scalevec.training.checkpoint.integrity import resumable_checkpoint
from scalevec.training.checkpoint.save_load import point_latest


class TrainingDiverged(RuntimeError):
    """The health guard stopped the run (non-finite loss or gradient norm, a loss blow-up, a dead model,
    a loss spike); ``DIVERGED`` records the step and reason, and the checkpoint from before the trouble
    is kept."""


# The blow-up rule of the health guard (always on, like the non-finite check). A model can always reach
# the uniform-prediction loss ln(V): a fresh model starts there (tiny: 5.53-5.56 at step 0 for ln 256 =
# 5.545) and training only lowers it. A loss of BLOWUP_RATIO x ln(V) gives the targets a geometric-mean
# probability of V^-3, V^2 times less than guessing uniformly: the weights blew up (lr 10 on tiny:
# 500-2500 nats from step 1), it is never a healthy state. One training batch can still be far off (a confident
# model on a batch of garbage bytes), hence BLOWUP_STEPS steps in a row; the validation loss averages
# the whole held-out set, so one evaluation above the threshold is enough. The reference is the larger
# of ln(V) and the run's first loss, so that an unusual initialisation that starts above uniform is
# judged against where it started. Healthy runs stay at or below ln(V) and never come near 3 ln(V).
BLOWUP_RATIO = 3.0
BLOWUP_STEPS = 5
FIX = "lower the lr or raise the warmup"


class HealthGuard:
    """The health guard of one run (DESIGN.md §8): ``check_step`` before each optimizer step, ``check_eval``
    on each validation loss; both raise ``TrainingDiverged`` after writing ``DIVERGED`` (rank 0, ``write``)."""

    def __init__(self, cfg: RunConfig, out: Path, write: bool):
        self.cfg, self.out, self.write = cfg, Path(out), write
        self.recent: deque[float] = deque(maxlen=cfg.train.guard_spike_window)
        self.dead_run = 0  # steps in a row at the uniform loss with no gradient
        self.high_run = 0  # steps in a row above the blow-up threshold
        self.bad_since: int | None = None  # first step of the current run of unhealthy steps (None: healthy)
        self.reference: float | None = None  # the blow-up rule's reference: max(ln V, the run's first loss)

    # -- the checkpoint's part -------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """The guard's state, JSON-ready (the checkpoint's ``extra["guard"]``)."""
        return {"recent": list(self.recent), "dead_run": self.dead_run, "high_run": self.high_run,
                "bad_since": self.bad_since, "reference": self.reference}

    @staticmethod
    def check_state(state) -> None:
        """Raise ``ValueError`` naming the key where ``state`` (a checkpoint's ``extra["guard"]``) is not what
        ``state_dict`` writes: ``None`` or a mapping whose ``recent`` is a list of numbers, ``dead_run`` and
        ``high_run`` counts, ``bad_since`` a step or null and ``reference`` a finite number > 0 or null (any key may
        be absent: a checkpoint from before it was kept). Before, ``"recent": "x"`` resumed with the letters of a
        string as losses and ``"guard": "x"`` was an AttributeError traceback."""
        if state is None:
            return
        if not isinstance(state, dict):
            raise ValueError(f"extra.guard is {short(state)}, not a mapping")
        recent = state.get("recent", [])
        if not isinstance(recent, list) or not all(is_number(x, finite=False) for x in recent):
            raise ValueError(f"extra.guard.recent is {short(recent)}, not a list of losses")
        for key in ("dead_run", "high_run"):
            if not is_int(state.get(key, 0), least=0):
                raise ValueError(f"extra.guard.{key} is {short(state[key])}, not a count of steps")
        if state.get("bad_since") is not None and not is_int(state["bad_since"], least=0):
            raise ValueError(f"extra.guard.bad_since is {short(state['bad_since'])}, not a step or null")
        if state.get("reference") is not None and not is_number(state["reference"], above=0):
            raise ValueError(f"extra.guard.reference is {short(state['reference'])}, not a loss > 0 or null")

    def load_state_dict(self, state: dict | None, fresh_start: bool = False) -> None:
        """Restore ``state_dict``'s output (``None`` or ``{}``: a checkpoint from before the guard kept state).
        ``fresh_start``: a step-0 checkpoint (``scalevec convert``), judged from its first loss as a new run."""
        state = state or {}
        self.recent.extend(state.get("recent", []))
        self.dead_run = state.get("dead_run", 0)
        self.high_run = state.get("high_run", 0)
        self.bad_since = state.get("bad_since")
        # a checkpoint from before the blow-up rule: judge against ln V (its first loss is not known)
        self.reference = None if fresh_start else state.get("reference") or math.log(self.cfg.model.vocab_size)

    def keep_window(self, step: int) -> int:
        """How many steps back checkpoint pruning must keep (``save_checkpoint(keep_window=...)``): the
        checkpoint that ``DIVERGED`` would name, the newest from before the current run of unhealthy steps,
        and the dead rule's look-back."""
        return max(self.cfg.train.guard_dead_steps, 1, step - self.bad_since + 1 if self.bad_since is not None else 0)

    # -- the rules -----------------------------------------------------------------------------------------

    def check_step(self, step: int, stats: list[float]) -> None:
        """Judge step ``step`` from its global ``[loss, aux loss, gradient norm]`` (nats/token; host floats,
        one transfer). Stops the run on a non-finite figure; on a loss blow-up, ``BLOWUP_STEPS`` steps in a
        row above ``BLOWUP_RATIO`` x the reference (ln(vocab), or the run's first loss when that is higher);
        on a dead model, ``train.guard_dead_steps`` steps in a row at the uniform loss ln(vocab) (relative
        1e-4) with a gradient norm <= 1e-6 (what an lr that blew the model up leaves: nothing can be learnt
        any more); and on a loss spike, a loss above both ``train.guard_spike_ratio`` x the mean of the last
        ``train.guard_spike_window`` losses and that mean + 6 std (OLMo-core's stability monitor flags mean +
        k std; the ratio keeps ordinary noise and early-training drops far from the threshold). The trouble
        starts at the first step of the unbroken run of unhealthy steps (blown-up or dead) that leads to the
        stop, so ``DIVERGED`` never names a checkpoint written after it."""
        t = self.cfg.train
        loss, grad_norm = stats[0], stats[2]
        uniform = math.log(self.cfg.model.vocab_size)
        if self.reference is None:  # the run's first step (a resumed run restored it from its checkpoint)
            self.reference = max(uniform, loss) if math.isfinite(loss) else uniform
        if not all(math.isfinite(v) for v in stats):
            self.diverge(step, f"non-finite loss or gradient norm at step {step} (loss {loss}, grad norm {grad_norm})")
        dead = abs(loss - uniform) <= 1e-4 * uniform and grad_norm <= 1e-6
        high = loss > BLOWUP_RATIO * self.reference
        self.dead_run = self.dead_run + 1 if dead else 0
        self.high_run = self.high_run + 1 if high else 0
        self.bad_since = (step if self.bad_since is None else self.bad_since) if dead or high else None
        if self.high_run >= BLOWUP_STEPS:
            first = step - self.high_run + 1
            self.diverge(step, f"loss blow-up at step {step}: {loss:.1f} nats, above {BLOWUP_RATIO:g}x "
                               f"{self.reference_text()} for {self.high_run} steps since step {first}")
        if t.guard_dead_steps and self.dead_run >= t.guard_dead_steps:
            self.diverge(step, f"dead model at step {step}: loss {loss:.4f} = ln({self.cfg.model.vocab_size}) with "
                               f"gradient norm {grad_norm:.1e} for {self.dead_run} steps since step "
                               f"{step - self.dead_run + 1}")
        if t.guard_spike_ratio and len(self.recent) == self.recent.maxlen:
            mean, std = statistics.fmean(self.recent), statistics.pstdev(self.recent)
            if loss > t.guard_spike_ratio * mean and loss > mean + 6 * std:
                self.diverge(step, f"loss spike at step {step}: {loss:.4f}, {loss / mean:.1f}x the mean {mean:.4f} of "
                                   f"the last {len(self.recent)} steps", f"{FIX} (or raise train.guard_spike_ratio)")
        self.recent.append(loss)

    def check_eval(self, step: int, val_loss: float) -> None:
        """The blow-up rule on the evaluation of checkpoint ``step`` (``step`` steps done), before its row is
        logged: a non-finite validation loss, or one above ``BLOWUP_RATIO`` x the reference (one evaluation is
        enough: it averages the whole held-out set), stops the run; the trouble starts at ``step`` at the
        latest."""
        if self.reference is None:  # no training step in this session yet
            self.reference = math.log(self.cfg.model.vocab_size)
        if math.isfinite(val_loss) and val_loss <= BLOWUP_RATIO * self.reference:
            return
        self.diverge(step, f"validation loss blow-up at step {step}: {val_loss:.1f} nats, above {BLOWUP_RATIO:g}x "
                           f"{self.reference_text()}")

    def first_bad(self, step: int) -> int:
        """The first step of the trouble found at ``step``: the start of the unbroken run of unhealthy
        steps before it, else ``step`` itself (checkpoint N holds the model used at step N)."""
        return step if self.bad_since is None else min(self.bad_since, step)

    def reference_text(self) -> str:
        """What the blow-up threshold is a multiple of, for the ``DIVERGED`` reason."""
        v = self.cfg.model.vocab_size
        if self.reference is None or self.reference <= math.log(v):
            return f"the uniform-prediction loss ln({v}) = {math.log(v):.2f}"
        return f"the run's first loss {self.reference:.2f}"

    def diverge(self, step: int, reason: str, fix: str = FIX) -> None:
        """Write ``DIVERGED`` naming the newest intact checkpoint from before the trouble's first step (and
        point ``checkpoints/latest`` at it), then raise ``TrainingDiverged`` with ``reason`` and ``fix``."""
        first_bad = self.first_bad(step)
        kept = None
        if self.write:
            ckpt, _ = resumable_checkpoint(self.out, before=first_bad)  # checkpoint N = the model used at step N
            kept = ckpt.name if ckpt is not None else None
            rundir.mark_diverged(self.out, step, first_bad, reason, kept)
            if kept:
                point_latest(self.out, kept)
        where = (f"the checkpoint from before it is kept: {self.out / layout.CKPT_DIR / kept}" if kept else
                 f"no checkpoint from before step {first_bad} was written (rerun with --overwrite)")
        raise TrainingDiverged(f"{reason}: {fix}; {where}; {self.out / rundir.DIVERGED} records it")


__all__ = ["BLOWUP_RATIO", "BLOWUP_STEPS", "HealthGuard", "TrainingDiverged"]

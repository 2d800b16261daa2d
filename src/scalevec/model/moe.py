"""The mixture-of-experts MLP with every scale-vector strategy (DESIGN.md §3, §6).

One Input-Norm feeds the router and every expert's gate and up projections::

    x ──n──> u ──(γ)──┬──(γ_router)── W_router ── softmax ── top-k ── renormalize ──> w_t1..w_tk
                      │                                                        (which experts, how much)
                      ├──(γ_gate[e])── W_gate[e] ──(s_gate[e])──> g ─┐
                      ├──(γ_up[e])──── W_up[e] ────(s_up[e])──> v ───┴─ silu(g)·v ── W_down[e] ──(s_down[e])──> y_e
                      └── shared experts (optional): an always-on SwiGLU reading the same u

    MoE(x) = Σ_j w_tj · y_{e_tj}(u_t)  (+ shared experts' output)

Where scale vectors sit is ``ScalePlan.moe`` (``scales.scale_plan``, the same rules as a dense MLP):
``shared`` puts one γ on the norm; ``branch`` (HG) gives γ_router, γ_gate and γ_up (shared by all experts,
or one per expert with ``per_expert``: shape ``(E, d_model)``); ``dual`` (DP) adds an output scale s per
expert, shape ``(E, d_expert)``, on gate and up (foldable into the expert's rows); ``dual_norm`` (DNP)
computes ``s ⊙ n(W_e u)`` with n over d_expert (``NormedExpertProj``). The down banks are planned too
(``ScalePlan.expert_down``, and ``ScalePlan.down`` for the shared experts): with ``dual_sites`` ``down`` (opt-in)
each expert's W_down gets an s of its own, shape ``(E, d_model)``, folded into its rows. The router never gets an
output scale. ``magdir``/``magdir_exp`` reparameterize every γ and s (per expert: one magnitude per expert).

Expert weights are 3-D banks ``(E, d_out, d_in)`` with role ``matrix`` (Muon treats each expert slice as
its own matrix, DESIGN.md §5); the router weight ``(E, d_model)`` has role ``router``. Scales are always
folded into the banks on the fly (``scales.fold_weight``: ``W'_e = diag(s_e) W_e diag(γ γ_e)``, cost
E·d_expert·d_model per step, below the tokens·k·(d_model + d_expert) of scaling activations at every
preset), so ``ScaleConfig.apply`` chooses only the implementation of the norm here (``scales.Ops``).

Routing (Mixtral convention): softmax over all experts, top-k, the k weights renormalized to sum to 1.
Dispatch is dropless: the (token, slot) assignments are sorted by expert, each expert runs once on its
contiguous segment (cost ∝ tokens·k; the segment ends stay on the device, ``grouped_linear_offsets``),
and the weighted outputs are scatter-added back. The auxiliary loss
is ``lb_coef · E Σ_i f_i P_i + z_loss_coef · mean(logsumexp(logits)²)``.

This module builds no Transformer (``transformer.py`` puts an ``MoE`` in a block) and no optimizer.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from scalevec.config import ModelConfig
from scalevec.model.device_path import autocast_dtype, on_cuda_path
from scalevec.model.params import new_param, normal_init
from scalevec.model.scales import (
    PLAIN,
    BranchPlan,
    Ops,
    Projection,
    ScalePlan,
    fold_weight,
    gamma_of,
    make_branch,
    multiply,
    refuse_unfoldable,
)

# ------------------------------------------------------------------------------------ routing and losses


def route(logits: Tensor, top_k: int) -> tuple[Tensor, Tensor, Tensor]:
    """Top-k routing, Mixtral convention (DESIGN.md §6).

    ``logits: (N, E)`` (float32) -> ``probs (N, E)`` softmax over all experts, ``idx (N, k)`` the k most
    probable experts (descending), ``weights (N, k)`` their probabilities renormalized to sum to 1.
    """
    probs = logits.softmax(dim=-1)
    top, idx = probs.topk(top_k, dim=-1)
    return probs, idx, top / top.sum(dim=-1, keepdim=True)


def expert_counts(idx: Tensor, n_experts: int) -> Tensor:
    """Assignments per expert, ``(n_experts,)`` int64, of the expert ids in ``idx`` (any shape).

    ``bincount(minlength=E)`` counts the same, but its output length depends on the largest id (the data),
    which ``torch.compile`` cannot trace without a graph break; ``scatter_add_`` into E zeros has a
    static shape and reads nothing back to the host."""
    flat = idx.flatten()
    return flat.new_zeros(n_experts).scatter_add_(0, flat, torch.ones_like(flat))


def load_balancing_loss(probs: Tensor, idx: Tensor) -> Tensor:
    """Switch-style load-balancing loss ``E · Σ_i f_i P_i`` (DESIGN.md §6), a float scalar.

    ``probs: (N, E)`` router probabilities, ``idx: (N, k)`` chosen experts. ``f_i``: fraction of the N·k
    (token, slot) assignments sent to expert i (no gradient); ``P_i``: mean probability of expert i over
    the N tokens. Equals 1 for uniform probabilities (whatever the assignments) and E when every token
    puts all its probability on one expert and goes there.
    """
    n_experts = probs.shape[-1]
    f = expert_counts(idx, n_experts).to(probs.dtype) / idx.numel()  # (E,)
    return n_experts * (f * probs.mean(dim=0)).sum()


def router_z_loss(logits: Tensor) -> Tensor:
    """Router z-loss ``mean_t logsumexp(logits_t)²`` (ST-MoE), a float scalar; ``logits: (N, E)``."""
    return torch.logsumexp(logits, dim=-1).pow(2).mean()


def grouped_linear(x: Tensor, weight: Tensor, counts: list[int]) -> Tensor:
    """Each expert's rows times its matrix: ``x: (M, d_in)`` holds ``counts[e]`` contiguous rows for expert
    e (in expert order), ``weight: (E, d_out, d_in)`` -> ``(M, d_out)``. Cost ∝ M, not M·E; an expert with
    no rows costs nothing and gets a zero gradient. The reference form of ``grouped_linear_offsets``
    (``counts`` are host integers: on a GPU, reading them is a device-to-host sync)."""
    return torch.cat([F.linear(xe, we) for xe, we in zip(x.split(counts), weight)])


def grouped_linear_offsets(x: Tensor, weight: Tensor, offsets: Tensor) -> Tensor:
    """``grouped_linear`` with the segment ends on the device: ``offsets: (E,) int32``, ``offsets[e]`` the end
    of expert e's rows (``cumsum`` of the counts), so that nothing is read back to the host in the step.

    Runs ``torch.nn.functional.grouped_mm`` (public in recent torch, 2.13 here) where it has a kernel for
    the inputs: on CPU (fp32, and bf16 under CPU autocast; there it multiplies segment by segment, the same
    numbers as ``grouped_linear`` to the bit, tests/test_moe_dispatch.py) and on CUDA for bf16 (one grouped
    GEMM). Elsewhere (fp32 on CUDA or under ``torch.compile``, whose tracing of grouped_mm accepts bf16
    only; an older torch; float64; d_in / d_out rows not a multiple of 16 bytes, which grouped_mm requires)
    it falls back to ``grouped_linear`` on host counts: a host sync and, under compile, a graph break.
    Under autocast the matmul runs in the autocast dtype, as ``F.linear`` would.
    """
    device = "cuda" if on_cuda_path(x) else x.device.type
    dtype = autocast_dtype(x) or x.dtype
    grouped = getattr(F, "grouped_mm", None)
    size = dtype.itemsize
    aligned = (x.shape[-1] * size) % 16 == 0 and (weight.shape[-2] * size) % 16 == 0  # grouped_mm's stride rule
    # grouped_mm's compile-time (meta) kernel accepts bf16 only, and CUDA has a kernel for bf16 only
    bf16_only = device == "cuda" or torch.compiler.is_compiling()
    supported = dtype == torch.bfloat16 or (dtype in (torch.float32, torch.float16) and not bf16_only)
    if grouped is None or not aligned or not supported or device not in ("cpu", "cuda"):
        counts = torch.diff(offsets, prepend=offsets.new_zeros(1)).tolist()
        return grouped_linear(x, weight, counts)
    with torch.autocast(device, enabled=False):
        return grouped(x.to(dtype), weight.to(dtype).transpose(-2, -1), offs=offsets)


# ------------------------------------------------------------------------------------ modules


class ExpertProj(nn.Module):
    """A bank of E bias-free linear maps ``weight: (E, d_out, d_in)`` (role ``matrix``) with the §3 scales of
    ``plan`` (a ``scales.BranchPlan``): the expert analogue of ``scales.Branch``, expert e computes
    ``s_e ⊙ (W_e diag(γ_e) u)``. ``in_scale``: HG's γ, shape ``(d_in,)`` shared by all experts or ``(E, d_in)``
    per expert; ``out_scale``: DP's s, shape ``(E, d_out)``; both fold into the bank (``folded_weight``).
    """

    out_norm = False  # DNP's output normalization (``NormedExpertProj``): for readers, never for forward

    def __init__(self, n_experts: int, d_in: int, d_out: int, plan: BranchPlan, eps: float, ops: Ops = PLAIN,
                 std: float = 0.02):
        super().__init__()
        self.eps, self.ops = eps, ops
        new_param(self, "weight", (n_experts, d_out, d_in), "matrix", normal_init(std))
        g, s = plan.gamma, plan.s
        self.in_scale = g.build((n_experts, d_in) if g.per_expert else (d_in,), ops) if g is not None else None
        self.out_scale = s.build((n_experts, d_out), ops) if s is not None else None

    def fold_vectors(self) -> tuple[Tensor | None, Tensor | None]:
        """``(γ or None, s or None)``: the vectors that fold into the bank."""
        return gamma_of(self.in_scale), gamma_of(self.out_scale)

    def folded_weight(self, shared: Tensor | None = None) -> Tensor:
        """``diag(s_e) W_e diag(γ_e ⊙ shared)`` for every e, ``(E, d_out, d_in)``, with the vectors that fold."""
        g, s = self.fold_vectors()
        return fold_weight(self.weight, multiply(g, shared), s)

    def finish(self, y: Tensor, expert: Tensor) -> Tensor:
        """The output side that is not in the bank, on rows ``y: (M, d_out)`` of experts ``expert: (M,)``: none."""
        return y


class NormedExpertProj(ExpertProj):
    """DNP's expert bank: expert e computes ``s_e ⊙ n(W_e diag(γ_e) u)``, n over d_out; s acts after the norm."""

    out_norm = True

    def fold_vectors(self) -> tuple[Tensor | None, Tensor | None]:
        return gamma_of(self.in_scale), None

    def finish(self, y: Tensor, expert: Tensor) -> Tensor:
        return self.ops.rms_norm(y, self.eps) * self.out_scale()[expert].to(y.dtype)


def make_expert_proj(n_experts: int, d_in: int, d_out: int, plan: BranchPlan, eps: float, ops: Ops = PLAIN,
                     std: float = 0.02) -> ExpertProj:
    """The ``ExpertProj`` or ``NormedExpertProj`` (DNP) of ``plan``."""
    return (NormedExpertProj if plan.normalized else ExpertProj)(n_experts, d_in, d_out, plan, eps, ops, std)


class Experts(nn.Module):
    """E routed SwiGLU experts of width ``d_expert`` as banks ``gate, up: (E, d_expert, d_model)`` and
    ``down: (E, d_model, d_expert)``, with dropless sorted dispatch (DESIGN.md §6); each an ``ExpertProj`` placed by
    the plan (gate, up: ``plan.moe``'s branches; down: ``plan.expert_down``).

    ``forward(u: (N, d_model), idx: (N, k), weights: (N, k), shared γ (d_model,) or None) -> (N, d_model)``:
    ``Σ_j weights[t, j] · expert_{idx[t, j]}(u_t)``. Every assignment is computed; none is dropped.
    """

    def __init__(self, cfg: ModelConfig, plan: ScalePlan, ops: Ops):
        super().__init__()
        moe, d = cfg.moe, cfg.d_model
        self.n_experts = moe.n_experts
        for site in ("gate", "up"):
            self.add_module(site, make_expert_proj(moe.n_experts, d, moe.d_expert,
                                                   plan.moe.branches[f"experts.{site}"], cfg.norm_eps, ops,
                                                   cfg.weight_std))
        self.down = ExpertProj(moe.n_experts, moe.d_expert, d, plan.expert_down, cfg.norm_eps, ops,
                               cfg.weight_std / (2 * cfg.n_layers) ** 0.5)

    def forward(self, u: Tensor, idx: Tensor, weights: Tensor, shared: Tensor | None = None) -> Tensor:
        k = idx.shape[1]
        flat = idx.flatten()  # (N·k,) expert of each (token, slot), token-major
        order = flat.argsort(stable=True)  # assignments grouped by expert
        expert, token = flat[order], order // k  # (N·k,) each
        # segment ends on the device (no host sync, no graph break under compile)
        offsets = expert_counts(flat, self.n_experts).cumsum(0).to(torch.int32)
        x = u[token]  # (N·k, d)
        g = grouped_linear_offsets(x, self.gate.folded_weight(shared).to(x.dtype), offsets)  # (N·k, d_expert)
        v = grouped_linear_offsets(x, self.up.folded_weight(shared).to(x.dtype), offsets)
        h = F.silu(self.gate.finish(g, expert)) * self.up.finish(v, expert)
        y = self.down.finish(grouped_linear_offsets(h, self.down.folded_weight().to(h.dtype), offsets), expert)
        y = y * weights.flatten()[order].unsqueeze(-1).to(y.dtype)
        return y.new_zeros(u.shape).index_add(0, token, y)  # (N, d)


class SharedExperts(nn.Module):
    """Always-on SwiGLU of width ``d_expert · n_shared_experts`` reading the MoE's normalized input (§6).

    Its gate and up are ``scales.Branch``es (``NormedBranch`` under DNP) and its down a ``scales.Projection``,
    placed by the plan as a dense MLP's (``plan.moe``'s branches, ``plan.down``).
    ``forward(u: (N, d_model), shared γ (d_model,) or None) -> (N, d_model)``.
    """

    def __init__(self, cfg: ModelConfig, plan: ScalePlan, ops: Ops):
        super().__init__()
        d, width = cfg.d_model, cfg.moe.d_expert * cfg.moe.n_shared_experts
        for site in ("gate", "up"):
            self.add_module(site, make_branch(d, width, plan.moe.branches[f"shared_experts.{site}"], cfg.norm_eps,
                                              ops, std=cfg.weight_std))
        self.down = Projection(width, d, plan.down, cfg.norm_eps, ops, std=cfg.weight_std / (2 * cfg.n_layers) ** 0.5)

    def forward(self, u: Tensor, shared: Tensor | None = None) -> Tensor:
        g, v = (b.finish(F.linear(u, b.folded_weight(shared).to(u.dtype))) for b in (self.gate, self.up))
        return self.down(F.silu(g) * v)


class MoE(nn.Module):
    """Mixture-of-experts MLP reading an Input-Norm (DESIGN.md §6; the sketch is in the module docstring).

    ``forward(x: (B, T, d_model)) -> (y: (B, T, d_model), aux)``: ``aux`` is the float32 scalar
    ``lb_coef · load_balancing_loss + z_loss_coef · router_z_loss`` for the training loss. Detached
    telemetry of the last call is in ``last_stats``: ``load`` (E,) fraction of assignments per expert
    (sums to 1), ``tokens_per_expert`` (E,) assignment counts (sum N·k), ``lb`` (raw, before lb_coef),
    ``z_loss`` (raw), ``router_entropy`` (mean over tokens of the routing distribution's entropy, nats).
    Parameters: ``scale`` (the norm's γ under scale=shared), ``router`` (``scales.Branch``, role
    ``router``), ``experts`` (``Experts``), ``shared_experts`` (``SharedExperts`` or None), placed by
    ``plan.moe`` (``scales.scale_plan``). ``norm(x)`` is the Input-Norm without its γ: here γ (and every
    branch's γ_b, s) is folded into the router and expert weights instead.
    """

    def __init__(self, cfg: ModelConfig, plan: ScalePlan, ops: Ops = PLAIN):
        super().__init__()
        moe, p = cfg.moe, plan.moe
        self.n_experts, self.top_k, self.eps, self.ops = moe.n_experts, moe.top_k, cfg.norm_eps, ops
        self.lb_coef, self.z_loss_coef = moe.lb_coef, moe.z_loss_coef
        self.scale = p.gamma.build((cfg.d_model,), ops) if p.gamma is not None else None
        self.router = make_branch(cfg.d_model, moe.n_experts, p.branches["router"], cfg.norm_eps, ops, role="router",
                                  std=cfg.weight_std)
        self.experts = Experts(cfg, plan, ops)
        self.shared_experts = SharedExperts(cfg, plan, ops) if moe.n_shared_experts else None
        self.last_stats: dict[str, Tensor] = {}

    def norm(self, x: Tensor) -> Tensor:
        return self.ops.rms_norm(x, self.eps)

    def forward(self, u: Tensor) -> tuple[Tensor, Tensor]:
        shape, u = u.shape, u.flatten(0, -2)  # (N, d)
        shared = gamma_of(self.scale)
        logits = F.linear(u, self.router.folded_weight(shared).to(u.dtype)).float()  # (N, E)
        probs, idx, weights = route(logits, self.top_k)
        y = self.experts(u, idx, weights, shared)
        if self.shared_experts is not None:
            y = y + self.shared_experts(u, shared)
        lb, z = load_balancing_loss(probs, idx), router_z_loss(logits)
        self._record(probs, idx, lb, z)
        return y.view(shape), self.lb_coef * lb + self.z_loss_coef * z

    @torch.no_grad()
    def _record(self, probs: Tensor, idx: Tensor, lb: Tensor, z: Tensor) -> None:
        counts = expert_counts(idx, self.n_experts)
        self.last_stats = {
            "load": counts.float() / idx.numel(),
            "tokens_per_expert": counts,
            "lb": lb.detach(),
            "z_loss": z.detach(),
            "router_entropy": torch.special.entr(probs).sum(-1).mean(),
        }

    def folded_state(self) -> dict[str, Tensor]:
        """Local state of the equivalent scale-free MoE (the fold protocol of ``fold.py``, DESIGN.md §4):
        ``router.weight``, ``experts.{gate,up}.weight`` and ``shared_experts.{gate,up}.weight`` with every
        scale folded in (``diag(s_e) W_e diag(γ γ_e)``), and ``experts.down.weight`` with its own (``diag(s_e) W_e``;
        the shared experts' down is a ``scales.Projection``, which folds itself).

        Raises ``ValueError`` naming the projections whose DNP output normalization cannot fold.
        """
        refuse_unfoldable([name for name, m in self.named_modules() if getattr(m, "out_norm", False)])
        shared = gamma_of(self.scale)
        parts = {"router": self.router, "experts.gate": self.experts.gate, "experts.up": self.experts.up}
        if self.shared_experts is not None:
            parts.update({"shared_experts.gate": self.shared_experts.gate, "shared_experts.up": self.shared_experts.up})
        state = {f"{name}.weight": m.folded_weight(shared) for name, m in parts.items()}
        return {**state, "experts.down.weight": self.experts.down.folded_weight()}

    def inactive_params(self) -> int:
        """Parameters of the routed experts that one token does not use: ``(E - k)/E`` of every per-expert
        tensor (banks, per-expert γ and s; their leading dim is E and they have ≥ 2 dims, while vectors
        shared by all experts are 1-D). ``params.count_params`` subtracts it for ``active_params`` (DESIGN.md §6)."""
        per_expert = sum(p.numel() for p in self.experts.parameters() if p.dim() >= 2)
        return per_expert // self.n_experts * (self.n_experts - self.top_k)


__all__ = ["route", "expert_counts", "load_balancing_loss", "router_z_loss", "grouped_linear", "grouped_linear_offsets",
           "ExpertProj", "NormedExpertProj", "make_expert_proj", "Experts", "SharedExperts", "MoE"]

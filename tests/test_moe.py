"""Mixture-of-experts MLP (DESIGN.md §6): routing, dropless dispatch, losses, scales, fold, HF parity, training."""

from __future__ import annotations

import dataclasses
import gzip
import math
from importlib import resources

import pytest
import torch
import torch.nn.functional as F

from scalevec import ModelConfig, MoEConfig, ScaleConfig, build_model, fold_scales, get_preset
from scalevec.config import PRESET_NAMES, OptimConfig
from scalevec.model.kernels import FAST
from scalevec.model.moe import MoE, load_balancing_loss, route, router_z_loss
from scalevec.model.params import SCALE_ROLES, count_params, init_params, param_roles
from scalevec.model.scales import scale_plan
from scalevec.training import optim

EPS = 1e-6
# every strategy of the table, and each HG one (scale='branch') also with per-expert gate/up scales
STRATEGIES = [v for n in PRESET_NAMES
              for v in ((n, f"{n}+per_expert") if ScaleConfig.preset(n).scale == "branch" else (n,))]
FOLDABLE = [s for s in STRATEGIES if ScaleConfig.preset(s.partition("+")[0]).foldable]


def _scfg(name: str) -> ScaleConfig:
    """A §3 strategy by name; ``+per_expert`` gives every expert its own gate/up scale vectors."""
    base, _, flag = name.partition("+")
    return dataclasses.replace(ScaleConfig.preset(base), per_expert=flag == "per_expert")


def _standalone(cfg: ModelConfig, scfg: ScaleConfig) -> MoE:
    """One MoE layer placed by the strategy's plan, on the fast path (as in a model with apply='weight')."""
    return MoE(cfg, scale_plan(scfg, cfg), FAST)


def _cfg(init_std: float = 0.02, **moe) -> ModelConfig:
    """A 2-layer GQA model whose every MLP is an MoE of 4 experts (top-2, width 16) unless overridden."""
    moe_cfg = MoEConfig(**{"n_experts": 4, "top_k": 2, "d_expert": 16, **moe})
    return ModelConfig(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=48, vocab_size=64, max_seq_len=16,
                       init_std=init_std, moe=moe_cfg)


def _perturb(module: torch.nn.Module, seed: int = 0, spread: float = 0.5) -> None:
    """Move every scale parameter reproducibly away from its init (γ, s, β, α to ~1 ± spread; ER's b to ±spread)."""
    g = torch.Generator().manual_seed(seed)
    roles = param_roles(module)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if roles[name] in SCALE_ROLES:
                noise = spread * torch.randn(p.shape, generator=g).clamp(-1.5, 1.5)
                p.copy_(noise if name.endswith("log_magnitude") else 1.0 + noise)


def _moe(strategy: str, init_std: float = 0.2, **moe) -> MoE:
    """A standalone perturbed MoE layer; init_std 0.2 makes routing decisive and outputs O(1)."""
    torch.manual_seed(0)
    layer = _standalone(_cfg(init_std, **moe), _scfg(strategy))
    init_params(layer)
    _perturb(layer)
    return layer


def _x(n_tokens: int = 24, d: int = 32, seed: int = 1) -> torch.Tensor:
    return torch.randn(2, n_tokens // 2, d, generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------------------------ the slow reference


def _n(v: torch.Tensor) -> torch.Tensor:
    return v / torch.sqrt(v.pow(2).mean(-1, keepdim=True) + EPS)


def _g(scale) -> torch.Tensor | float:
    return scale().double() if scale is not None else 1.0


def _proj(p, e: int, u: torch.Tensor) -> torch.Tensor:
    """Expert e's gate or up output for one token, activation-side scales: s_e ⊙ [n](W_e (γ_e ⊙ u))."""
    g = _g(p.in_scale)
    g = g[e] if isinstance(g, torch.Tensor) and g.dim() == 2 else g
    y = p.weight.double()[e] @ (g * u)
    s = p.out_scale().double()[e] if p.out_scale is not None else 1.0
    return s * (_n(y) if p.out_norm else y)


def _branch(b, u: torch.Tensor) -> torch.Tensor:
    """A shared expert's gate or up (``scales.Branch``) for one token, activation-side scales."""
    y = b.weight.double() @ (_g(b.in_scale) * u)
    s = _g(b.out_scale)
    return s * (_n(y) if b.out_norm else y)


def _reference(layer: MoE, x: torch.Tensor) -> tuple[torch.Tensor, list[list[int]], list[torch.Tensor]]:
    """Token by token, slot by slot, in float64, from the DESIGN.md §6 definition. Returns the output
    ``(N, d)``, each token's chosen experts and each token's router probabilities."""
    ex, out, chosen, all_probs = layer.experts, [], [], []
    for xt in x.reshape(-1, x.shape[-1]).double():
        u = _n(xt) * _g(layer.scale)
        probs = torch.softmax(layer.router.weight.double() @ (_g(layer.router.in_scale) * u), dim=-1)
        top = sorted(range(len(probs)), key=lambda e: -probs[e].item())[: layer.top_k]
        norm = sum(probs[e] for e in top)
        y = torch.zeros_like(xt)
        for e in top:
            h = F.silu(_proj(ex.gate, e, u)) * _proj(ex.up, e, u)
            y = y + probs[e] / norm * (ex.down.weight.double()[e] @ h)
        if layer.shared_experts is not None:
            se = layer.shared_experts
            y = y + se.down.weight.double() @ (F.silu(_branch(se.gate, u)) * _branch(se.up, u))
        out.append(y)
        chosen.append(top)
        all_probs.append(probs)
    return torch.stack(out), chosen, all_probs


# ------------------------------------------------------------------------------------ dispatch and routing


@pytest.mark.parametrize("strategy", ["baseline", "unified+per_expert", "unified_foldable", "dnp"])
@pytest.mark.parametrize("n_shared", [0, 1])
def test_dispatch_matches_per_token_reference(strategy, n_shared):
    """Sorted dropless dispatch equals the slow loop over tokens and their top-k experts (float64, ≤ 1e-6)."""
    layer = _moe(strategy, n_shared_experts=n_shared).double()  # logic, not fp32 rounding, is under test
    x = _x().double()
    y, _ = layer(layer.norm(x))
    ref, _, _ = _reference(layer, x)
    assert ref.abs().max() > 0.5  # outputs are O(1), so 1e-6 is a tight bound
    torch.testing.assert_close(y.reshape(-1, 32), ref, rtol=0, atol=1e-6)


def test_experts_with_no_tokens_work_and_get_zero_gradient():
    """All assignments on experts 0 and 1: output still equals the reference; idle experts get zero grads."""
    layer = _moe("hg+per_expert").double()
    u = _n(_x().reshape(-1, 32).double())
    n = u.shape[0]
    idx = torch.tensor([[0, 1], [1, 0]]).repeat(n // 2, 1)  # (N, 2)
    weights = torch.rand(n, 2, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    y = layer.experts(u, idx, weights)
    ex = layer.experts
    ref = torch.stack([sum(weights[t, j].double() * (ex.down.weight.double()[e] @ (
        F.silu(_proj(ex.gate, e, u[t])) * _proj(ex.up, e, u[t])))
        for j, e in enumerate(idx[t].tolist())) for t in range(n)])
    torch.testing.assert_close(y, ref, rtol=0, atol=1e-6)
    y.pow(2).sum().backward()
    for bank in (ex.gate.weight, ex.up.weight, ex.down.weight, ex.gate.in_scale.weight):
        assert bank.grad[2:].abs().max() == 0 and bank.grad[:2].abs().min(dim=-1).values.max() > 0


def test_routing_counts_sum_to_tokens_times_k():
    """Every token goes to exactly k distinct experts; per-expert counts match the reference and sum to N·k."""
    layer = _moe("unified")
    x = _x(n_tokens=40)
    layer(layer.norm(x))
    _, chosen, _ = _reference(layer, x)
    stats = layer.last_stats
    expected = torch.zeros(4, dtype=torch.long)
    for top in chosen:
        assert len(set(top)) == 2
        expected[top] += 1
    assert torch.equal(stats["tokens_per_expert"], expected)
    assert stats["tokens_per_expert"].sum().item() == 40 * 2
    torch.testing.assert_close(stats["load"], expected.float() / 80)


def test_route_renormalizes_top_k_of_softmax():
    """route: softmax over all experts, the k largest, renormalized to sum to 1 (Mixtral convention)."""
    logits = torch.log(torch.tensor([[0.1, 0.4, 0.2, 0.3], [0.5, 0.125, 0.125, 0.25]]))
    probs, idx, weights = route(logits, 2)
    torch.testing.assert_close(probs, torch.tensor([[0.1, 0.4, 0.2, 0.3], [0.5, 0.125, 0.125, 0.25]]))
    assert idx.tolist() == [[1, 3], [0, 3]]
    torch.testing.assert_close(weights, torch.tensor([[4 / 7, 3 / 7], [2 / 3, 1 / 3]]))


# ------------------------------------------------------------------------------------ auxiliary losses


def test_lb_loss_is_exactly_one_for_uniform_probs():
    """E·Σ f_i P_i = Σ f_i = 1 exactly when every P_i = 1/E, whatever the assignments."""
    probs = torch.full((8, 4), 0.25)
    idx = torch.tensor([[0, 1]] * 5 + [[2, 3], [3, 0], [1, 2]])
    assert load_balancing_loss(probs, idx).item() == 1.0


def test_lb_loss_grows_to_n_experts_when_collapsed():
    """All probability and all tokens on expert 0 gives E (the maximum), far above the balanced 1."""
    probs = torch.zeros(8, 4)
    probs[:, 0] = 1.0
    idx = torch.zeros(8, 1, dtype=torch.long)
    assert load_balancing_loss(probs, idx).item() == 4.0


def test_lb_loss_hand_computed_example():
    """A worked example, E = 4, k = 2, two tokens:

    probs t1 = [1/2, 1/4, 1/8, 1/8] -> top-2 experts {0, 1};  t2 = [1/8, 1/2, 1/4, 1/8] -> {1, 2}.
    Counts [1, 2, 1, 0] of 4 assignments: f = [1/4, 1/2, 1/4, 0].
    P = mean over tokens = [5/16, 3/8, 3/16, 1/8].
    Σ f_i P_i = 5/64 + 12/64 + 3/64 + 0 = 20/64 = 5/16, so E·Σ f_i P_i = 4 · 5/16 = 5/4 (exact in binary).
    """
    probs = torch.tensor([[1 / 2, 1 / 4, 1 / 8, 1 / 8], [1 / 8, 1 / 2, 1 / 4, 1 / 8]])
    _, idx, _ = route(probs.log(), 2)
    assert idx.tolist() == [[0, 1], [1, 2]]
    assert load_balancing_loss(probs, idx).item() == 1.25


def test_z_loss_of_zero_logits_is_log_e_squared():
    """Router z-loss mean(logsumexp(logits)²) is (log E)² for all-zero logits."""
    assert router_z_loss(torch.zeros(5, 4)).item() == pytest.approx(math.log(4) ** 2, rel=1e-6)


def test_aux_loss_and_telemetry():
    """aux = lb_coef·lb + z_coef·z with lb, z, load and entropy as defined on the reference probabilities."""
    layer = _moe("hg", lb_coef=0.01, z_loss_coef=0.001)
    x = _x()
    _, aux = layer(layer.norm(x))
    _, chosen, probs = _reference(layer, x)
    probs = torch.stack(probs)
    lb = load_balancing_loss(probs, torch.tensor(chosen))
    logits = torch.stack([layer.router.weight.double() @ (layer.router.in_scale().double() * _n(t))
                          for t in x.reshape(-1, 32).double()])
    z = router_z_loss(logits)
    s = layer.last_stats
    assert s["lb"].item() == pytest.approx(lb.item(), rel=1e-5) and lb.item() > 1.0
    assert s["z_loss"].item() == pytest.approx(z.item(), rel=1e-5)
    assert aux.item() == pytest.approx(0.01 * lb.item() + 0.001 * z.item(), rel=1e-5)
    entropy = -(probs * probs.log()).sum(-1).mean()
    assert s["router_entropy"].item() == pytest.approx(entropy.item(), rel=1e-5)
    assert s["load"].sum().item() == pytest.approx(1.0)


# ------------------------------------------------------------------------------------ the model


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_strategy_builds_and_gets_gradients(strategy):
    """Every parameter (router, banks, every γ/s/β/α, shared experts) receives a finite, nonzero gradient."""
    cfg = _cfg(n_shared_experts=1, first_dense=1, z_loss_coef=1e-3)
    model = build_model(cfg, _scfg(strategy), seed=0)
    tokens = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(3))
    ce, n, aux = model(tokens, tokens.roll(-1, 1))
    (ce / n + aux).backward()
    assert aux.item() > 0
    roles = model.param_roles()
    assert "router" in roles.values() and all(roles[k] == "matrix" for k in roles if k.endswith("experts.gate.weight"))
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().max() > 0, name


def test_scale_shapes_and_roles_follow_the_strategy():
    """HG: γ_router, γ_gate, γ_up, no shared γ; per_expert: (E, d); DP: s (E, d_expert); DNP gate s is output_scale."""
    hg = _standalone(_cfg(), _scfg("hg"))
    assert hg.scale is None and hg.router.in_scale().shape == (32,) and hg.experts.gate.in_scale().shape == (32,)
    assert hg.experts.gate.out_scale is None and hg.experts.down.in_scale is None
    pe = _standalone(_cfg(), _scfg("unified+per_expert"))
    assert pe.experts.gate.in_scale().shape == (4, 32) and pe.experts.up.out_scale().shape == (4, 16)
    assert pe.router.out_scale is None
    roles = param_roles(pe)
    assert roles["experts.gate.out_scale.magnitude"] == "output_scale"
    assert roles["experts.up.out_scale.magnitude"] == "input_scale"
    assert roles["router.weight"] == "router" and roles["experts.down.weight"] == "matrix"
    assert pe.experts.gate.out_norm and pe.experts.up.out_norm
    assert _standalone(_cfg(), _scfg("baseline")).scale().shape == (32,)


def test_non_dnp_strategies_agree_at_init():
    """Every γ, s starts at 1, so all strategies without DNP give the same logits from the same seed."""
    tokens = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(4))
    cfg = _cfg(init_std=0.1, n_shared_experts=1)
    ref = build_model(cfg, _scfg("none"), seed=0)(tokens)
    for s in FOLDABLE:
        torch.testing.assert_close(build_model(cfg, _scfg(s), seed=0)(tokens), ref, rtol=0, atol=1e-6)


@pytest.mark.parametrize("strategy", FOLDABLE)
def test_fold_is_exact(strategy):
    """Folding router, gate/up (incl. per-expert γ and DP's s) and shared-expert scales keeps the logits (1e-5)."""
    cfg = _cfg(init_std=0.1, n_shared_experts=1, first_dense=1)
    tokens = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(5))
    model = build_model(cfg, _scfg(strategy), seed=0)
    plain = model(tokens)
    _perturb(model)
    logits = model(tokens)
    folded = fold_scales(model)
    assert not any(r in SCALE_ROLES for r in folded.param_roles().values())
    torch.testing.assert_close(folded(tokens), logits, rtol=0, atol=1e-5)
    if strategy != "none":
        assert (logits - plain).abs().max() > 1e-2  # the scales matter, so the fold is not vacuous


@pytest.mark.parametrize("strategy", ["dnp", "unified+per_expert"])
def test_fold_refuses_dnp_experts(strategy):
    """DNP's per-expert output normalization has no linear-map counterpart: fold raises ValueError naming it."""
    model = build_model(_cfg(), _scfg(strategy), seed=0)
    with pytest.raises(ValueError, match=r"layers\.0\.mlp\.experts\.gate"):
        fold_scales(model)


def test_active_params_counts_k_of_e_experts():
    """active = total − (E − k)·(one expert's params); per-expert γ count per expert, shared γ always."""
    cfg = _cfg(first_dense=1)
    d, h = 32, 16
    base = count_params(build_model(cfg, _scfg("baseline"), device="meta"))
    assert base["active_params"] == base["params"] - (4 - 2) * 3 * d * h  # one MoE layer
    pe = count_params(build_model(cfg, _scfg("hg+per_expert"), device="meta"))
    assert pe["active_params"] == pe["params"] - (4 - 2) * (3 * d * h + 2 * d)
    dense = count_params(build_model(dataclasses.replace(cfg, moe=None), _scfg("baseline"), device="meta"))
    assert dense["active_params"] == dense["params"]


def test_moe_presets_sizes():
    """moe-0.5b and moe-2b are around 0.5B and 2B total parameters; active is well below total."""
    for name, lo, hi in (("moe-0.5b", 0.45e9, 0.55e9), ("moe-2b", 1.9e9, 2.1e9)):
        n = count_params(build_model(get_preset(name), _scfg("baseline"), device="meta"))
        assert lo < n["params"] < hi and n["active_params"] < 0.35 * n["params"]


# ------------------------------------------------------------------------------------ Hugging Face parity


def _hf_state(model) -> dict[str, torch.Tensor]:
    """Our baseline MoE model's weights under Mixtral / Qwen3-MoE names (γ on the norms, gate|up fused)."""
    sd = {"model.embed_tokens.weight": model.embed.weight, "model.norm.weight": model.head.scale(),
          "lm_head.weight": model.head.branches["lm_head"].weight}
    for i, layer in enumerate(model.layers):
        p, attn, mlp = f"model.layers.{i}.", layer.attn, layer.mlp
        sd[p + "input_layernorm.weight"] = attn.proj.scale()
        for n in "qkv":
            sd[p + f"self_attn.{n}_proj.weight"] = attn.proj.branches[n].weight
        sd[p + "self_attn.o_proj.weight"] = attn.o.weight
        if model.cfg.qk_norm:
            sd[p + "self_attn.q_norm.weight"] = attn.q_norm.scale()
            sd[p + "self_attn.k_norm.weight"] = attn.k_norm.scale()
        if isinstance(mlp, MoE):
            sd[p + "post_attention_layernorm.weight"] = mlp.scale()
            sd[p + "mlp.gate.weight"] = mlp.router.weight
            sd[p + "mlp.experts.gate_up_proj"] = torch.cat([mlp.experts.gate.weight, mlp.experts.up.weight], dim=1)
            sd[p + "mlp.experts.down_proj"] = mlp.experts.down.weight
        else:
            sd[p + "post_attention_layernorm.weight"] = mlp.proj.scale()
            for n in ("gate", "up"):
                sd[p + f"mlp.{n}_proj.weight"] = mlp.proj.branches[n].weight
            sd[p + "mlp.down_proj.weight"] = mlp.down.weight
    return {k: v.detach().clone() for k, v in sd.items()}


def _hf_kwargs(cfg: ModelConfig) -> dict:
    return dict(vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, num_hidden_layers=cfg.n_layers,
                num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_kv_heads, head_dim=cfg.head_dim,
                num_experts_per_tok=cfg.moe.top_k, rms_norm_eps=cfg.norm_eps, tie_word_embeddings=False,
                max_position_embeddings=cfg.max_seq_len, rope_parameters={"rope_type": "default",
                                                                         "rope_theta": cfg.rope_theta})


def _parity(model, hf) -> None:
    hf.load_state_dict(_hf_state(model), strict=True)
    hf.eval()
    tokens = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        ours, theirs = model(tokens), hf(tokens).logits
    assert ours.abs().max() > 0.1
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)


def test_parity_with_mixtral():
    """A baseline MoE model with perturbed γ equals MixtralForCausalLM with copied weights (fp32, 1e-5)."""
    import transformers
    cfg = _cfg(init_std=0.1)
    model = build_model(cfg, _scfg("baseline"), seed=0)
    _perturb(model)
    hf = transformers.MixtralForCausalLM(transformers.MixtralConfig(
        **_hf_kwargs(cfg), intermediate_size=cfg.moe.d_expert, num_local_experts=cfg.moe.n_experts))
    _parity(model, hf)


def test_parity_with_qwen3_moe_qk_norm_and_dense_first_layer():
    """With QK-norm and first_dense=1 our model equals Qwen3MoeForCausalLM (norm_topk_prob, mlp_only_layers=[0])."""
    import transformers
    cfg = dataclasses.replace(_cfg(init_std=0.1, first_dense=1), qk_norm=True)
    model = build_model(cfg, _scfg("baseline"), seed=0)
    _perturb(model)
    hf_cfg = transformers.Qwen3MoeConfig(
        **_hf_kwargs(cfg), intermediate_size=cfg.d_ff, moe_intermediate_size=cfg.moe.d_expert,
        num_experts=cfg.moe.n_experts, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[0])
    hf = transformers.Qwen3MoeForCausalLM(hf_cfg)
    assert not hasattr(hf.model.layers[0].mlp, "experts") and hasattr(hf.model.layers[1].mlp, "experts")
    _parity(model, hf)


# ------------------------------------------------------------------------------------ optimizer and training


def test_muon_updates_each_expert_of_a_bank_on_its_own():
    """Muon over the MoE model's matrix group steps each expert slice like torch.optim.Muon on that 2-D matrix."""
    model = build_model(_cfg(), _scfg("unified"), seed=0)
    ocfg = OptimConfig(name="muon", lr=0.02)
    groups = optim.param_groups(model, ocfg, model.scfg)
    muon_group = next(g for g in groups if g.optimizer == "muon")
    bank = model.layers[0].mlp.experts.up.weight
    assert any(p is bank for p in muon_group.params) and bank.dim() == 3
    muon = next(o for o in optim.build_optimizers(groups, ocfg) if isinstance(o, optim.Muon))
    mats = [torch.nn.Parameter(bank.detach()[e].clone()) for e in range(bank.shape[0])]
    assert muon_group.weight_decay == ocfg.weight_decay > 0
    ref = torch.optim.Muon(mats, lr=0.02, momentum=ocfg.muon_momentum, weight_decay=ocfg.weight_decay,
                           adjust_lr_fn="match_rms_adamw")
    g = torch.Generator().manual_seed(7)
    for _ in range(2):
        grad = torch.randn(bank.shape, generator=g)
        for p in muon_group.params:
            p.grad = torch.zeros_like(p)
        bank.grad = grad.clone()
        for e, m in enumerate(mats):
            m.grad = grad[e].clone()
        muon.step()
        ref.step()
    for e, m in enumerate(mats):
        torch.testing.assert_close(bank.detach()[e], m.detach(), rtol=0, atol=1e-7)


@pytest.mark.slow  # 30 training steps: ~2 s
def test_moe_tiny_unified_training_lowers_loss():
    """30 AdamW steps of moe-tiny with `unified` on Shakespeare bytes, through the project's own role groups
    (router, expert banks, scale vectors each in their group), cut the loss by over 1 nat from ~ln 256."""
    text = resources.files("scalevec").joinpath("data/corpora/shakespeare.txt.gz").read_bytes()
    data = torch.frombuffer(bytearray(gzip.decompress(text)[:200_000]), dtype=torch.uint8).long()
    cfg = get_preset("moe-tiny")
    model = build_model(cfg, _scfg("unified"), seed=0)
    ocfg = OptimConfig(lr=1e-2)
    groups = optim.param_groups(model, ocfg, model.scfg)
    assert {g.role for g in groups} >= {"matrix", "router", "input_scale", "scale_direction"}
    (opt,) = optim.build_optimizers(groups, ocfg)
    g = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(30):
        starts = torch.randint(0, len(data) - 65, (8,), generator=g)
        batch = torch.stack([data[s: s + 65] for s in starts.tolist()])
        ce, n, aux = model(batch[:, :-1], batch[:, 1:])
        loss = ce / n + aux
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append((ce / n).item())
    assert abs(losses[0] - math.log(256)) < 0.3
    assert sum(losses[-5:]) / 5 < losses[0] - 1.0, losses

"""Strategies in someone else's stack (docs/integrations.md): ``apply_strategy`` on transformers models,
``param_groups``, ``fold`` / ``save``, and the per-scale-vector metrics in any loop, in HF ``Trainer`` and in
TensorBoard.

Every model is a tiny one built locally from a transformers config (no hub download). Its norm weights are drawn
away from 1 (γ = 1 + 0.3·N(0, 1)) so that where γ goes (shared, per branch, folded) is tested, not hidden by ones.

Tolerances (fp32, CPU). Logits of the tiny models are O(1). Against the *source* HF model a foldable strategy
computes the same function in another association (``γ ⊙ u`` before the matmul against HF's norm weight, the
fold ``W diag(γ)``, MoE dispatch sorted by expert): each op rounds at 2^-24 ≈ 6e-8 relative, and through 2
layers the measured logit gap is at most 3.6e-7 on the 4 families × 9 foldable strategies. Against scalevec's own
model built by ``convert`` (the same modules, kernels and attention call) the measured gap is 0: logits, loss,
gradients and the 20-step AdamW trajectory are bitwise equal on this machine (torch 2.13 CPU, AVX2). The
tolerances leave room for kernels that reorder sums elsewhere (another CPU kind, a GPU, HF's eager attention):
LOGIT_TOL = 2e-5 (~50x the source gap, ~1e3 below any real difference: a γ misplaced by one branch moves logits by
1e-2 or more, DNP's normalization by 0.8), GRAD_TOL = 1e-4 relative to each gradient's norm, TRAJ_TOL = 2e-4 nats
over 20 steps (Adam's normalization amplifies a rounding gap: its early updates are ≈ lr·sign(g)).
"""

from __future__ import annotations

import gzip
import json
import math
import warnings
from importlib import resources

import pytest
import torch
import transformers  # a dev dependency: missing it fails these tests, never skips

from scalevec import ScaleConfig, build_model
from scalevec.config import PRESET_NAMES, OptimConfig
from scalevec.hf_format.hf_import import import_hf
from scalevec.integrations import (
    ScaleMetricsCallback,
    add_scale_metrics,
    apply_strategy,
    fold,
    model_roles,
    param_groups,
    save,
    scale_metrics,
    to_scalevec,
)
from scalevec.integrations.hf_model import scalevec_name
from scalevec.model.params import count_params, param_roles
from scalevec.training.optim import build_optimizers
from scalevec.training.optim import param_groups as scalevec_groups
from scalevec.training.telemetry import ScaleTelemetry

LOGIT_TOL, GRAD_TOL, TRAJ_TOL = 2e-5, 1e-4, 2e-4
FAMILIES = ("llama", "qwen3", "mixtral", "qwen3_moe")


def tiny_hf(family: str = "llama", seed: int = 0, tie: bool = False):
    """A random 2-layer model of ``family`` (vocab 256: bytes), its norm weights away from 1, in eval mode."""
    torch.manual_seed(seed)
    common = dict(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=96, max_position_embeddings=128, tie_word_embeddings=tie)
    if family == "llama":
        cfg = transformers.LlamaConfig(**common)
    elif family == "qwen3":
        cfg = transformers.Qwen3Config(head_dim=16, **common)
    elif family == "mixtral":
        cfg = transformers.MixtralConfig(num_local_experts=4, num_experts_per_tok=2, **common)
    else:
        cfg = transformers.Qwen3MoeConfig(head_dim=16, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
                                          norm_topk_prob=True, **common)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.3 * torch.randn_like(p))
    return model.eval()


def batch(seed: int = 1, b: int = 2, t: int = 24) -> torch.Tensor:
    return torch.randint(0, 256, (b, t), generator=torch.Generator().manual_seed(seed))


def apply(model, strategy, **switches):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DNP's "the function changes" (tested on its own below)
        return apply_strategy(model, strategy, **switches)


def hf_loss(model, x):
    return model(input_ids=x, labels=x).loss


def sv_loss(model, x):
    """scalevec's loss on HF's targets: token i predicts token i+1, the last position has none."""
    y = torch.cat([x[:, 1:], torch.full_like(x[:, :1], -100)], dim=1)
    ce, n, _ = model(x, y)
    return ce / n


# ------------------------------------------------------------------------------------------ apply_strategy


def cases(pairs, fast):
    """``pytest.param``s of ``pairs``, all but those in ``fast`` marked slow (a family keeps one or two fast cases)."""
    return [pytest.param(*p, marks=() if p in fast else pytest.mark.slow) for p in pairs]


@pytest.mark.parametrize("family,strategy", cases([(f, s) for f in FAMILIES for s in PRESET_NAMES],
                                                  {("llama", "unified"), ("mixtral", "unified_foldable")}))
def test_apply_strategy_keeps_the_function_of_a_foldable_strategy(family, strategy):
    """Every strategy on every family: the class stays; a foldable strategy keeps the logits (LOGIT_TOL), one that
    is not says so (DNP); the scale vectors are where the plan puts them (the parameter count of scalevec's model
    of the same strategy), and ``to_scalevec`` is that model with the same function."""
    model, x = tiny_hf(family), batch()
    cls = type(model)
    with torch.no_grad():
        ref = model(x).logits
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert apply_strategy(model, strategy) is model
    assert type(model) is cls
    info = model.scalevec_info
    with torch.no_grad():
        got = model(x).logits
    qk_lost = strategy == "none" and family.startswith("qwen3")  # QK-norm γ has no slot under none
    if ScaleConfig.preset(strategy).foldable and not qk_lost:
        assert (got - ref).abs().max().item() <= LOGIT_TOL
        assert info.function_preserved and not caught
    else:
        assert (got - ref).abs().max().item() > 1e-3
        assert not info.function_preserved and any("THE FUNCTION CHANGES" in str(w.message) for w in caught)
    sv = to_scalevec(model)
    assert count_params(model)["params"] == count_params(sv)["params"]
    assert count_params(model)["scale_params_by_role"] == count_params(sv)["scale_params_by_role"]
    with torch.no_grad():
        assert (sv(x) - got).abs().max().item() <= LOGIT_TOL


def test_apply_strategy_refuses_bad_input_in_one_line():
    """An unknown strategy, switch or model; apply='fused'; a second strategy on an unfoldable one."""
    with pytest.raises(ValueError, match="unknown strategy 'uni'"):
        apply_strategy(tiny_hf(), "uni")
    with pytest.raises(ValueError, match="unknown strategy switch lr_multiplier; the switches are"):
        apply_strategy(tiny_hf(), "unified", lr_multiplier=0.5)
    with pytest.raises(ValueError, match="apply='fused'"):
        apply_strategy(tiny_hf(), "unified", apply="fused")
    with pytest.raises(ValueError, match="not Linear"):
        apply_strategy(torch.nn.Linear(2, 2), "unified")
    model = apply(tiny_hf(), "unified")
    with pytest.raises(ValueError, match="already carries strategy unified, which cannot fold"):
        apply_strategy(model, "baseline")
    tied = tiny_hf(tie=True)  # none cannot hold the final γ with a tied head: refused before anything changes
    with pytest.raises(ValueError, match="strategy none with tied embeddings"):
        apply_strategy(tied, "none")
    assert type(tied.model.layers[0].self_attn.q_proj) is torch.nn.Linear and not hasattr(tied, "scalevec_info")


def test_apply_strategy_to_scalevecs_own_model_converts_in_place():
    """A scalevec Transformer goes through convert's plain form: same object, new strategy, same logits."""
    from scalevec.config.presets import get_preset

    model = build_model(get_preset("tiny"), ScaleConfig.preset("baseline"), seed=0).eval()
    x = batch()
    with torch.no_grad():
        ref = model(x)
    assert apply_strategy(model, "unified_foldable") is model
    assert model.scfg.placement == "dual" and any("out_scale" in n for n, _ in model.named_parameters())
    with torch.no_grad():
        assert (model(x) - ref).abs().max().item() <= LOGIT_TOL


# ------------------------------------------------------------------------------------------ parity with convert


def _convert_model(tmp_path, hf_model, strategy):
    """scalevec's own model of ``strategy`` built from the HF directory as ``scalevec convert`` builds it."""
    d = tmp_path / "hf"
    hf_model.save_pretrained(d)
    return import_hf(d, ScaleConfig.preset(strategy))[1]


@pytest.mark.parametrize("strategy", cases([(s,) for s in PRESET_NAMES], {("unified",), ("baseline",)}))
def test_parity_with_convert_logits_loss_gradients(tmp_path, strategy):
    """The same HF Llama weights, strategy and batch give the same logits, loss and gradients through
    ``apply_strategy`` as through scalevec's model built by ``convert`` (fp32; LOGIT_TOL, GRAD_TOL)."""
    hf = tiny_hf("llama")
    ours = _convert_model(tmp_path, hf, strategy).train()
    hf = apply(hf, strategy).train()
    x = batch(b=4, t=32)
    with torch.no_grad():
        assert (hf(x).logits - ours(x)).abs().max().item() <= LOGIT_TOL
    l_hf, l_ours = hf_loss(hf, x), sv_loss(ours, x)
    assert abs(l_hf.item() - l_ours.item()) <= LOGIT_TOL
    l_hf.backward()
    l_ours.backward()
    grads = dict(ours.named_parameters())
    seen = 0
    for name, p in hf.named_parameters():
        g, want = p.grad, grads[scalevec_name(name, hf.scalevec_info.cfg)].grad
        assert (g - want).norm().item() <= GRAD_TOL * want.norm().item() + 1e-9, name
        seen += 1
    assert seen == len(grads) >= 16  # every parameter (none: the 16 matrices)


@pytest.mark.slow  # 2 × 20 training steps
@pytest.mark.parametrize("strategy", ["unified", "baseline"])
def test_parity_with_convert_over_20_adamw_steps(tmp_path, strategy):
    """20 AdamW steps in a plain torch loop, each model with its own role groups (``integrations.param_groups``
    against the trainer's ``optim.param_groups``, the same lr, wd, betas, eps): the same loss trajectory
    (TRAJ_TOL nats)."""
    hf = tiny_hf("llama")
    ours = _convert_model(tmp_path, hf, strategy).train()
    hf = apply(hf, strategy).train()
    ocfg = OptimConfig(lr=3e-3, weight_decay=0.1, fused="false")
    opt_ours = build_optimizers(scalevec_groups(ours, ocfg, ours.scfg), ocfg)[0]
    opt_hf = torch.optim.AdamW(param_groups(hf, lr=3e-3, weight_decay=0.1), betas=ocfg.betas, eps=ocfg.eps,
                               foreach=True)
    assert sorted((g["role"], g["lr"], g["weight_decay"]) for g in opt_hf.param_groups) == \
        sorted((g["role"], g["lr"], g["weight_decay"]) for g in opt_ours.param_groups)
    a, b = [], []
    blocks = _shakespeare_blocks(80, 32)
    for step in range(20):
        x = blocks[4 * step:4 * step + 4]
        for model, opt, loss_fn, out in ((hf, opt_hf, hf_loss, a), (ours, opt_ours, sv_loss, b)):
            loss = loss_fn(model, x)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            out.append(loss.item())
    assert max(abs(p - q) for p, q in zip(a, b)) <= TRAJ_TOL
    assert a[-1] < a[0] - 0.3  # it trains


# ------------------------------------------------------------------------------------------ HF features kept


def test_generate_and_gradient_checkpointing_survive(tmp_path):
    """``generate()`` with a KV cache gives the greedy tokens of the uncached forward; gradient checkpointing
    gives the same loss and gradients as the plain backward (unified on a Qwen3-MoE: every kind of module)."""
    model = apply(tiny_hf("qwen3_moe"), "unified")
    x = batch(b=1, t=8)
    out = model.generate(x, max_new_tokens=6, do_sample=False, pad_token_id=0)
    seq = x
    with torch.no_grad():
        for _ in range(6):
            seq = torch.cat([seq, model(seq).logits[:, -1:].argmax(-1)], dim=1)
    assert torch.equal(out, seq)
    model.train()
    x = batch(b=2, t=16)
    loss = hf_loss(model, x)
    loss.backward()
    plain = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x; gradient_checkpointing_enable before
        model.activation_checkpointing_enable({"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    assert getattr(model, "is_activation_checkpointing", None) or model.is_gradient_checkpointing
    loss2 = hf_loss(model, x)
    loss2.backward()
    assert abs(loss.item() - loss2.item()) <= 1e-6
    for n, p in model.named_parameters():
        assert torch.allclose(p.grad, plain[n], rtol=1e-5, atol=1e-7), n


# ------------------------------------------------------------------------------------------ fold and save


@pytest.mark.parametrize("family", ["llama", "qwen3_moe"])
def test_fold_gives_a_plain_checkpoint_transformers_loads(tmp_path, family):
    """A foldable strategy, trained a little (γ ≠ 1, s ≠ 1), folds back to the plain class in place; its
    ``save_pretrained`` loads in plain transformers with no missing key and the same logits (LOGIT_TOL)."""
    model = apply(tiny_hf(family, tie=family == "llama"), "unified_foldable").train()
    opt = torch.optim.AdamW(param_groups(model, lr=1e-2), foreach=True)
    for step in range(3):
        hf_loss(model, batch(seed=step)).backward()
        opt.step()
        opt.zero_grad()
    model.eval()
    x = batch()
    with torch.no_grad():
        before = model(x).logits
    fold(model)
    assert not hasattr(model, "scalevec_info")
    assert type(model.model.layers[0].self_attn.q_proj) is torch.nn.Linear
    with torch.no_grad():
        assert (model(x).logits - before).abs().max().item() <= LOGIT_TOL
    model.save_pretrained(tmp_path / "plain")
    again, loading = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "plain", output_loading_info=True)
    assert not any(loading.values()), loading
    with torch.no_grad():
        assert (again.eval()(x).logits - before).abs().max().item() <= LOGIT_TOL


def test_fold_refuses_dnp_and_save_writes_the_custom_code_export(tmp_path):
    """unified cannot fold (one line naming why and save); ``save`` writes the custom-code export, which
    transformers loads with trust_remote_code and computes the same logits; the model is unchanged."""
    model = apply(tiny_hf("llama"), "unified")
    with pytest.raises(ValueError, match="cannot fold strategy unified: DNP .* scalevec.save"):
        fold(model)
    x = batch()
    with torch.no_grad():
        before = model(x).logits
    save(model, tmp_path / "export")
    conf = json.loads((tmp_path / "export" / "config.json").read_text())
    assert conf["architectures"] == ["ScalevecForCausalLM"] and "auto_map" in conf
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "export", trust_remote_code=True).eval()
    with torch.no_grad():
        assert (loaded(x).logits - before).abs().max().item() <= LOGIT_TOL
        assert (model(x).logits - before).abs().max().item() == 0


# ------------------------------------------------------------------------------------------ param_groups


def test_param_groups_of_a_plain_hf_model_keep_norms_embeddings_biases_out_of_decay():
    """A plain Qwen2 (q/k/v biases) and a plain Llama: matrices and the LM head decayed; norm gains, the embedding
    and biases not; every trainable parameter in exactly one group; a one-line table."""
    torch.manual_seed(0)
    qwen2 = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
        intermediate_size=48, tie_word_embeddings=False))
    groups = param_groups(qwen2, lr=1e-3, weight_decay=0.1)
    wd = {g["role"]: g["weight_decay"] for g in groups}
    assert wd == {"matrix": 0.1, "embedding": 0.0, "lm_head": 0.1, "input_scale": 0.0, "bias": 0.0}
    names = {g["role"]: g["names"] for g in groups}
    assert "model.layers.0.self_attn.q_proj.bias" in names["bias"]
    assert "model.norm.weight" in names["input_scale"] and "lm_head.weight" in names["lm_head"]
    assert sum(len(g["params"]) for g in groups) == len(list(qwen2.parameters()))
    table = groups.table()
    assert "\n" not in table and table.startswith("param groups: matrix")
    qwen3 = tiny_hf("qwen3")
    assert model_roles(qwen3)["model.layers.0.self_attn.q_norm.weight"] == "output_scale"
    with pytest.raises(ValueError, match=r"^lr must be a finite number > 0, like 3e-3; got 0$"):
        param_groups(qwen2, lr=0)


@pytest.mark.parametrize("kwargs, match", [
    ({"embedding_wd": "no"}, r"^embedding_wd must be true or false; got 'no'$"),  # truthy: decayed the embedding
    ({"router_wd": 1}, r"^router_wd must be true or false; got 1$"),
    ({"strategy": 5}, r"^strategy must be a name .* or a ScaleConfig, got int$"),  # an AttributeError before
    ({"scale_weight_decay": math.inf}, r"^scale\.weight_decay=inf must be a finite number >= 0"),  # NaN scales
    ({"scale_weight_decay": True}, r"^scale\.weight_decay=True must be a finite number >= 0"),
])
def test_param_groups_refuse_arguments_of_the_wrong_kind(kwargs, match):
    """A flag given as text or a count, a strategy that is no name, and a scale weight decay that is infinite or a
    bool are one ValueError naming the argument, never groups built from a truthy string or an infinite decay."""
    with pytest.raises(ValueError, match=match):
        param_groups(apply(tiny_hf("llama"), "unified"), lr=1e-3, **kwargs)


def test_param_groups_follow_the_strategy_roles():
    """After apply_strategy: roles are the model's own (the same as scalevec's model of the strategy); IWD decays
    the input scales' magnitude, not the direction α nor the output scales; lr_mult scales the scale roles' lr."""
    model = apply(tiny_hf("mixtral"), "unified", lr_mult=0.5)
    roles = param_roles(model)  # every parameter carries its role (params.new_param's record)
    assert roles == model_roles(model)
    assert roles["model.layers.0.mlp.gate.weight"] == "router"
    groups = {g["role"]: g for g in param_groups(model, lr=1e-3, weight_decay=0.05)}
    assert groups["input_scale"]["weight_decay"] == 0.05 and groups["input_scale"]["lr"] == 5e-4
    assert groups["scale_direction"]["weight_decay"] == 0.0 and groups["output_scale"]["weight_decay"] == 0.0
    assert groups["matrix"]["lr"] == 1e-3 and groups["router"]["weight_decay"] == 0.0
    plain = {g["role"]: g for g in param_groups(model, lr=1e-3, strategy="baseline")}
    assert plain["input_scale"]["weight_decay"] == 0.0


# ------------------------------------------------------------------------------------------ the metrics


def test_scale_metrics_are_right_and_cost_one_transfer(monkeypatch):
    """``scale_metrics`` in a plain loop: grad_norm is the norm of the vector's own parameters' gradient,
    update_norm ‖γ_after − γ_before‖, rms/min/max of γ after the step, per-layer matrix grad norms; all of it in
    one ``tolist`` and no ``item``; steps off the schedule collect nothing."""
    model = apply(tiny_hf("llama"), "unified").train()
    opt = torch.optim.AdamW(param_groups(model, lr=1e-2), foreach=True)
    metrics = scale_metrics(model, opt, every=2)
    vec = model.model.layers[1].self_attn.q_proj.in_scale  # an ORScale
    calls = {"tolist": 0, "item": 0}
    for kind in calls:
        orig = getattr(torch.Tensor, kind)

        def counted(self, *a, _orig=orig, _kind=kind, **k):
            calls[_kind] += 1
            return _orig(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, kind, counted)
    for step in range(3):
        hf_loss(model, batch(seed=step)).backward()
        grad = torch.cat([p.grad.flatten() for p in vec.parameters()]).norm().item()
        before = vec().detach().clone()
        layer0 = torch.cat([model.get_parameter(n).grad.flatten() for n, r in param_roles(model).items()
                            if r == "matrix" and n.startswith("model.layers.0.")]).norm().item()
        calls.update(tolist=0, item=0)
        opt.step()
        assert calls["tolist"] == (1 if step % 2 == 0 else 0)  # (AdamW's foreach step itself calls item())
        opt.zero_grad()
        if step % 2:
            assert metrics.latest is None and metrics.scalars() == {}
            continue
        row = metrics.latest["scales"]["model.layers.1.self_attn.q_proj.in_scale"]
        after = vec().detach()
        assert row["role"] == "input_scale"
        assert row["grad_norm"] == pytest.approx(grad, rel=1e-5)
        assert row["update_norm"] == pytest.approx((after - before).norm().item(), rel=1e-4)
        assert row["rms"] == pytest.approx(after.pow(2).mean().sqrt().item(), rel=1e-6)
        assert (row["min"], row["max"]) == pytest.approx((after.min().item(), after.max().item()))
        assert metrics.latest["grad_norms"]["model.layers.0"] == pytest.approx(layer0, rel=1e-5)
        assert metrics.scalars()["scales.input_scale/update_norm/model.layers.1.self_attn.q_proj.in_scale"] > 0
    hf_loss(model, batch()).backward()
    calls.update(tolist=0, item=0)
    metrics.capture()
    metrics.collect()
    assert calls == {"tolist": 1, "item": 0}


def test_update_norm_of_a_direct_scale_is_the_step_taken():
    """A direct γ is the parameter itself, which the optimizer changes in place: the update is still the step's."""
    model = apply(tiny_hf("llama"), "baseline").train()
    opt = torch.optim.AdamW(param_groups(model, lr=1e-2), foreach=True)
    metrics = scale_metrics(model, opt)
    hf_loss(model, batch()).backward()
    before = model.model.norm.scale.weight.detach().clone()
    opt.step()
    step = (model.model.norm.scale.weight.detach() - before).norm().item()
    assert step > 1e-3
    assert metrics.latest["scales"]["model.norm.scale"]["update_norm"] == pytest.approx(step, rel=1e-5)


def test_scalevec_trainer_telemetry_agrees_with_the_standalone_collector():
    """``ScaleTelemetry.collect`` without a capture is γ's statistics only (what ``scale_stats`` gives)."""
    model = build_model(__import__("scalevec").get_preset("tiny"), ScaleConfig.preset("unified"), seed=0)
    out = ScaleTelemetry(model).collect()
    assert set(out) == {"scales"} and out["scales"]
    assert all(v["rms"] == pytest.approx(1.0) and v["min"] == pytest.approx(1.0) for v in out["scales"].values())


def _shakespeare_blocks(n: int, t: int) -> torch.Tensor:
    text = gzip.decompress(resources.files("scalevec.data.corpora").joinpath("shakespeare.txt.gz").read_bytes())
    data = torch.tensor(list(text[: n * t]), dtype=torch.long)
    return data.view(n, t)


@pytest.mark.slow  # trains 20 steps with transformers.Trainer
def test_hf_trainer_trains_unified_and_logs_every_vector(tmp_path):
    """HF ``Trainer`` trains a tiny local Llama with ``unified`` for 20 steps on CPU (param_groups' AdamW, the
    scale-metrics callback first, TensorBoard reporting): the loss falls and the logged rows carry one series
    per scale vector."""
    model = apply(tiny_hf("llama"), "unified").train()
    blocks = _shakespeare_blocks(160, 64)

    class Data(torch.utils.data.Dataset):
        def __len__(self):
            return len(blocks)

        def __getitem__(self, i):
            return {"input_ids": blocks[i], "labels": blocks[i]}

    args = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=20, per_device_train_batch_size=8,
                                          logging_steps=5, report_to=["tensorboard"], use_cpu=True, save_strategy="no",
                                          lr_scheduler_type="constant",
                                          dataloader_num_workers=0)
    opt = torch.optim.AdamW(param_groups(model, lr=1e-2, weight_decay=0.1), foreach=True)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Data(), optimizers=(opt, None))
    cb = add_scale_metrics(trainer)
    assert isinstance(cb, ScaleMetricsCallback) and trainer.callback_handler.callbacks[0] is cb
    seen, printed = [], []

    class Record(transformers.TrainerCallback):
        def __init__(self, out):
            self.out = out

        def on_log(self, args, state, control, logs=None, **kwargs):
            self.out.append(dict(logs))

    trainer.callback_handler.callbacks.insert(1, Record(seen))  # where the reporters sit
    trainer.add_callback(Record(printed))  # where the console printer sits: the series are out again
    trainer.train()
    assert printed and not any(k.startswith("scales.") for r in printed for k in r)
    losses = [r["loss"] for r in seen if "loss" in r]
    assert len(losses) == 4 and losses[-1] < losses[0] - 0.5, losses
    n_vectors = sum(1 for m in model.modules() if type(m).__name__ in ("ORScale", "DirectScale", "ERScale"))
    for row in (r for r in seen if "loss" in r):
        series = [k for k in row if k.startswith("scales.") and "/rms/" in k]
        assert len(series) == n_vectors > 10
        assert any(k.startswith("grad_norm.layers/model.layers.1") for k in row)


@pytest.mark.slow  # trains
def test_tensorboard_holds_a_series_per_scale_vector(tmp_path):
    """A ``--tracker tensorboard`` run: its event file holds, for every scale vector of metrics.jsonl, its rms, min,
    max, grad_norm and update_norm series under ``scales.<role>/``, and a grad-norm series per layer."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from scalevec.resolve import resolve_config
    from scalevec.training.trainer import train

    items = {"train.steps": 3, "train.batch_size": 2, "train.seq_len": 16, "train.eval_every": 3,
             "train.log_every": 1, "train.eval_batch_size": 8, "data.val_tokens": 512,
             "data.cache_dir": str(tmp_path / "cache"), "train.tracker": "tensorboard"}
    run = tmp_path / "run"
    train(resolve_config("tiny", "unified", [f"{k}={v}" for k, v in items.items()]), run, quiet=True)
    rows = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in rows if r["kind"] == "train"][-1]
    acc = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert len(last["scales"]) > 20
    for name, stats in last["scales"].items():
        for stat in ("rms", "min", "max", "grad_norm", "update_norm"):
            tag = f"scales.{stats['role']}/{stat}/{name}"
            assert tag in tags, tag
            assert [e.step for e in acc.Scalars(tag)] == [0, 1, 2]
            assert acc.Scalars(tag)[-1].value == pytest.approx(stats[stat], rel=1e-6, abs=1e-12)
    for layer in last["grad_norms"]:
        assert f"grad_norm.layers/{layer}" in tags
    assert math.isfinite(last["scales"][next(iter(last["scales"]))]["update_norm"])

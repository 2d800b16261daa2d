"""Roles by module type and position on any ``nn.Module`` and the one ``param_groups`` rule (DESIGN.md §5;
``model/roles.py``, ``training/optim.py``)."""

import pytest
import torch
from torch import nn

from scalevec import ScaleConfig, build_model, get_preset
from scalevec.config import OptimConfig
from scalevec.integrations import param_groups
from scalevec.model import params
from scalevec.model.roles import model_roles, output_head
from scalevec.training import optim

VOCAB, D, BLOCK = 96, 32, 16


class TitanBlock(nn.Module):
    """A torchtitan Llama block's modules and names (``attention.wq``, ``feed_forward.w1``, ``attention_norm``)."""

    def __init__(self):
        super().__init__()
        self.attention = nn.ModuleDict({n: nn.Linear(D, D, bias=False) for n in ("wq", "wk", "wv", "wo")})
        self.feed_forward = nn.ModuleDict({"w1": nn.Linear(D, 2 * D, bias=False), "w2": nn.Linear(2 * D, D, bias=False),
                                           "w3": nn.Linear(D, 2 * D, bias=False)})
        self.attention_norm = nn.RMSNorm(D)
        self.ffn_norm = nn.RMSNorm(D)


class TitanStyle(nn.Module):
    """torchtitan's Llama3 ``Transformer`` names: ``tok_embeddings``, ``layers``, ``norm``, an untied ``output``."""

    def __init__(self):
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, D)
        self.layers = nn.ModuleDict({"0": TitanBlock(), "1": TitanBlock()})
        self.norm = nn.RMSNorm(D)
        self.output = nn.Linear(D, VOCAB, bias=False)


class LayerNorm(nn.Module):
    """nanoGPT's own LayerNorm class (a weight and an optional bias, ``F.layer_norm``)."""

    def __init__(self, d: int, bias: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d)) if bias else None


class GPTBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.ln_2 = LayerNorm(D, True), LayerNorm(D, True)
        self.attn = nn.ModuleDict({"c_attn": nn.Linear(D, 3 * D), "c_proj": nn.Linear(D, D)})
        self.mlp = nn.ModuleDict({"c_fc": nn.Linear(D, 4 * D), "c_proj": nn.Linear(4 * D, D)})


class NanoGPT(nn.Module):
    """nanoGPT's ``GPT``: ``transformer.wte``/``wpe``, blocks ``h``, ``ln_f``, an ``lm_head`` tied to ``wte``."""

    def __init__(self):
        super().__init__()
        self.transformer = nn.ModuleDict({"wte": nn.Embedding(VOCAB, D), "wpe": nn.Embedding(BLOCK, D),
                                          "h": nn.ModuleList([GPTBlock(), GPTBlock()]), "ln_f": LayerNorm(D, True)})
        self.lm_head = nn.Linear(D, VOCAB, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # nanoGPT's weight tying


def _by_role(groups) -> dict[str, set[str]]:
    return {g["role"]: set(g["names"]) for g in groups}


def _exactly_once(model: nn.Module, groups) -> None:
    tensors = [id(p) for g in groups for p in g["params"]]
    assert len(tensors) == len(set(tensors)) and set(tensors) == {id(p) for p in model.parameters()}


def test_torchtitan_names_put_embedding_and_untied_head_in_their_groups():
    """torchtitan-style ``tok_embeddings`` is ``embedding`` (no decay), ``output`` is ``lm_head``, norms are
    scales, only the block projections are decayed matrices; every tensor is in exactly one group."""
    model = TitanStyle()
    groups = param_groups(model, lr=1e-3, weight_decay=0.1)
    by_role = _by_role(groups)
    assert by_role["embedding"] == {"tok_embeddings.weight"} and by_role["lm_head"] == {"output.weight"}
    assert by_role["input_scale"] == {"norm.weight"} | {f"layers.{i}.{n}.weight" for i in "01"
                                                       for n in ("attention_norm", "ffn_norm")}
    assert by_role["matrix"] == {n for n, p in model.named_parameters() if p.dim() == 2} - {"tok_embeddings.weight",
                                                                                            "output.weight"}
    wd = {g["role"]: g["weight_decay"] for g in groups}
    assert wd == {"matrix": 0.1, "embedding": 0.0, "lm_head": 0.1, "input_scale": 0.0}
    _exactly_once(model, groups)


def test_nanogpt_names_put_tied_wte_and_wpe_in_the_embedding_group():
    """nanoGPT-style ``wte`` (tied to ``lm_head``) and ``wpe`` are ``embedding``, the tied head is found as the
    output head, LayerNorm weights are scales and biases ``bias``; none of them is decayed."""
    model = NanoGPT()
    assert output_head(model) is model.lm_head
    groups = param_groups(model, lr=1e-3, weight_decay=0.1)
    by_role = _by_role(groups)
    assert by_role["embedding"] == {"transformer.wte.weight", "transformer.wpe.weight"}
    assert "lm_head" not in by_role  # the tied head's tensor is the embedding's, counted once
    assert by_role["input_scale"] == {n for n in dict(model.named_parameters()) if n.endswith("weight") and ".ln_" in n}
    assert by_role["bias"] == {n for n in dict(model.named_parameters()) if n.endswith("bias")}
    decayed = {n for g in groups if g["weight_decay"] > 0 for n in g["names"]}
    assert decayed == by_role["matrix"] and all(".c_" in n for n in decayed)
    _exactly_once(model, groups)


def test_embedding_decay_is_the_users_choice():
    """``embedding_wd=True`` decays ``tok_embeddings`` at the matrices' weight decay; the default leaves it out."""
    model = TitanStyle()
    on = {g["role"]: g["weight_decay"] for g in param_groups(model, lr=1e-3, weight_decay=0.05, embedding_wd=True)}
    off = {g["role"]: g["weight_decay"] for g in param_groups(model, lr=1e-3, weight_decay=0.05)}
    assert on["embedding"] == 0.05 and off["embedding"] == 0.0


def test_untied_head_is_found_by_vocabulary_not_by_name():
    """A head named ``proj_out`` (vocabulary-wide ``out_features``) is ``lm_head``; a position embedding with as many
    rows as a hidden layer's width does not make that layer a head (the vocabulary is the largest embedding)."""
    model = TitanStyle()
    model.proj_out = model.output
    del model.output
    model.pos = nn.Embedding(2 * D, D)  # 64 rows, as many as feed_forward.w1's out_features
    roles = model_roles(model)
    assert roles["proj_out.weight"] == "lm_head" and roles["pos.weight"] == "embedding"
    assert roles["layers.0.feed_forward.w1.weight"] == "matrix"


def test_frozen_parameters_are_in_no_group():
    """A frozen tensor is in no group; every trainable one in exactly one."""
    model = TitanStyle()
    model.tok_embeddings.weight.requires_grad_(False)
    groups = param_groups(model, lr=1e-3)
    assert "tok_embeddings.weight" not in {n for g in groups for n in g["names"]}
    assert sum(len(g["params"]) for g in groups) == sum(p.requires_grad for p in model.parameters())


@pytest.mark.parametrize("strategy", ["baseline", "or", "unified"])
def test_scalevec_model_roles_are_its_recorded_ones(strategy):
    """On scalevec's own model ``model_roles`` is ``params.param_roles`` (every parameter recorded), so the trainer's
    groups are the groups of the recorded roles."""
    model = build_model(get_preset("tiny"), ScaleConfig.preset(strategy), device="meta")
    assert model_roles(model) == params.param_roles(model)
    ocfg = OptimConfig(weight_decay=0.1)
    a = optim.param_groups(model, ocfg, model.scfg)
    b = optim.param_groups(model, ocfg, model.scfg, params.param_roles(model))
    assert [(g.role, g.lr, g.weight_decay, g.names) for g in a] == [(g.role, g.lr, g.weight_decay, g.names) for g in b]


def test_drop_in_groups_are_the_trainers():
    """``integrations.param_groups`` on scalevec's model gives the trainer's groups (role, lr, wd, tensors)."""
    model = build_model(get_preset("tiny"), ScaleConfig.preset("unified"), device="meta")
    ours = optim.param_groups(model, OptimConfig(lr=2e-3, weight_decay=0.1), model.scfg)
    drop_in = param_groups(model, lr=2e-3, weight_decay=0.1)
    assert [(g.role, g.lr, g.weight_decay, g.names) for g in ours] == \
        [(g["role"], g["lr"], g["weight_decay"], g["names"]) for g in drop_in]


def test_metrics_rows_log_each_groups_actual_lr(tmp_path):
    """Every train row carries ``lr.<role>`` = that optimizer group's lr at the step: Muon's own lr for the
    matrices, ``lr × scale.lr_mult`` for the scales, each × the schedule's multiplier (warmup here)."""
    import json

    from scalevec.resolve import resolve_config
    from scalevec.training.schedule import lr_multiplier
    from scalevec.training.trainer import train

    items = {"train.steps": 3, "train.batch_size": 2, "train.seq_len": 16, "train.eval_every": 3, "train.log_every": 1,
             "train.eval_batch_size": 2, "data.val_tokens": 256, "schedule.warmup": 2, "optim.name": "muon",
             "optim.lr": 1e-3, "optim.muon_lr": 0.02, "scale.lr_mult": 4, "data.cache_dir": str(tmp_path / "cache")}
    cfg = resolve_config("tiny", "unified", [f"{k}={v}" for k, v in items.items()])
    train(cfg, tmp_path / "run", quiet=True)
    rows = [r for r in map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text().splitlines())
            if r["kind"] == "train"]
    assert [r["step"] for r in rows] == [0, 1, 2]
    for r in rows:
        m = lr_multiplier(r["step"], 3, cfg.schedule)
        assert r["lr.matrix"] == pytest.approx(0.02 * m) and r["lr.embedding"] == pytest.approx(1e-3 * m)
        assert r["lr.input_scale"] == pytest.approx(4e-3 * m) and r["lr"] == pytest.approx(1e-3 * m)

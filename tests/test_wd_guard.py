"""The weight-decay guard (``integrations/wd_guard.py``) survives a ``copy.deepcopy`` of the model it guards, alone or
with its optimizer: the copy carries the strategy, so an optimizer stepping it is checked against that strategy too
(DESIGN.md §5), and the original's opt-out is copied with it.

The model is a tiny random transformers Llama (built locally, no hub) carrying strategy ``baseline``, which never
decays a scale vector: ``torch.optim.AdamW(params, weight_decay=0.01)`` decays every tensor, so the guard must refuse
its step.
"""

from __future__ import annotations

import copy

import pytest
import torch
import transformers  # a dev dependency: missing it fails these tests, never skips

from scalevec.integrations import allow_any_weight_decay, apply_strategy, param_groups
from scalevec.integrations.wd_guard import WeightDecayMismatch


def guarded():
    """A 1-layer Llama (vocab 64, d_model 32) carrying strategy baseline (its scale vectors: never decayed)."""
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=48))
    return apply_strategy(model, "baseline")


def step(model, optimizer) -> None:
    """One optimizer step on a next-token loss (the guard runs before it)."""
    x = torch.randint(0, 64, (1, 8), generator=torch.Generator().manual_seed(1))
    model(input_ids=x, labels=x).loss.backward()
    optimizer.step()


def test_a_deepcopy_of_a_guarded_model_is_guarded():
    """An optimizer that decays every tensor of a deep copy is refused at its first step, naming the copy's scale
    vector, and leaves the copy's weights unchanged; the strategy's own groups step the copy."""
    twin = copy.deepcopy(guarded())
    before = {n: p.detach().clone() for n, p in twin.named_parameters()}
    with pytest.raises(WeightDecayMismatch, match=r"^model\.layers\.0\.input_layernorm\.scale\.weight .* strategy "
                                                  r"baseline never decays"):
        step(twin, torch.optim.AdamW(twin.parameters(), lr=1e-2, weight_decay=0.01))
    assert all(torch.equal(p, before[n]) for n, p in twin.named_parameters())
    step(twin, torch.optim.AdamW(param_groups(twin, lr=1e-2, weight_decay=0.01)))
    assert not torch.equal(twin.lm_head.weight, before["lm_head.weight"])


def test_a_deepcopy_of_a_model_with_its_optimizer_is_guarded():
    """``copy.deepcopy((model, optimizer))``: the copied optimizer steps the copied model's parameters and is
    checked against its strategy like the original's."""
    model = guarded()
    twin, twin_opt = copy.deepcopy((model, torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)))
    assert twin_opt.param_groups[0]["params"][0] is next(twin.parameters())
    with pytest.raises(WeightDecayMismatch, match="strategy baseline never decays"):
        step(twin, twin_opt)


def test_a_deepcopy_keeps_the_opt_out():
    """A copy of a model opted out with ``allow_any_weight_decay`` is opted out too (its optimizer steps), and
    opting the copy back in guards it again without touching the original's opt-out."""
    model = allow_any_weight_decay(guarded())
    twin = copy.deepcopy(model)
    step(twin, torch.optim.AdamW(twin.parameters(), lr=1e-2, weight_decay=0.01))
    allow_any_weight_decay(twin, False)
    with pytest.raises(WeightDecayMismatch):
        step(twin, torch.optim.AdamW(twin.parameters(), lr=1e-2, weight_decay=0.01))
    step(model, torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01))  # the original: still opted out


@pytest.mark.parametrize("edit", ["decay_turned_on", "tensor_moved"])
def test_groups_changed_after_a_passing_step_are_checked_again(edit):
    """An optimizer that passed its first step is checked again when a group's weight decay is turned on
    afterwards, or a scale vector is moved into a decayed group (before, a passing optimizer was only checked again
    when its group count changed): the next step is refused and changes no weight."""
    model = guarded()
    opt = torch.optim.AdamW(param_groups(model, lr=1e-2, weight_decay=0.01))
    step(model, opt)
    scales = next(g for g in opt.param_groups if g["role"] == "input_scale")
    if edit == "decay_turned_on":
        scales["weight_decay"] = 0.01
    else:
        next(g for g in opt.param_groups if g["weight_decay"] > 0)["params"].append(scales["params"].pop())
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt.zero_grad()
    with pytest.raises(WeightDecayMismatch, match="strategy baseline never decays input_scale"):
        step(model, opt)
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())

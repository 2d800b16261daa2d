"""Initial matrices are drawn on the CPU generator whatever the device (DESIGN.md §2):
``build_model(seed=k, device=...)`` is the same model on CPU and GPU, and the CUDA RNG plays no part."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from scalevec import MoEConfig, ScaleConfig, build_model
from scalevec.model import params as params_module
from scalevec.model.params import draw, normal_init
from scalevec.model.transformer import Transformer

MOE = MoEConfig(n_experts=4, top_k=2, d_expert=16, n_shared_experts=1)


class OnAGPU:
    """A stand-in for a parameter on a CUDA device, no GPU needed: ``draw`` sees its device type and hands it the
    numbers through ``copy_``, which keeps them."""

    device = torch.device("cuda")  # a device object only: nothing is allocated there

    def __init__(self, shape: tuple[int, ...]):
        self.shape, self.dtype, self.received = torch.Size(shape), torch.float32, None

    def copy_(self, src: torch.Tensor) -> None:
        self.received = src


def test_draw_for_another_device_uses_the_cpu_generator():
    """A parameter off the CPU gets the numbers the CPU generator draws for a CPU tensor of its shape, through a
    CPU buffer: the same numbers a CPU build gets (a draw on a CUDA generator would fail here, with no GPU)."""
    torch.manual_seed(5)
    ref = torch.empty(7, 3)
    normal_init(0.02)(ref)
    torch.manual_seed(5)
    p = OnAGPU((7, 3))
    draw(p, normal_init(0.02))
    assert p.received.device.type == "cpu" and torch.equal(p.received, ref)


def test_init_params_draws_every_parameter_through_draw(monkeypatch, make_cfg):
    """``init_params`` (so every build and ``init_weights``) sends every parameter through ``draw``, in order."""
    seen = []
    real = params_module.draw
    monkeypatch.setattr(params_module, "draw", lambda t, init: (seen.append(t), real(t, init)))
    model = build_model(make_cfg(moe=MOE), ScaleConfig.preset("unified"), seed=0)
    assert [id(p) for p in seen] == [id(p) for p in model.parameters()]


def test_meta_build_draws_nothing(monkeypatch, make_cfg):
    """``device='meta'`` (parameter counts, instant at 2B) draws no number (the inits run on meta tensors, which hold
    none) and leaves the RNG where it was."""
    calls = []
    monkeypatch.setattr(nn.init, "normal_", lambda t, *a, **k: calls.append(t))
    state = torch.get_rng_state()
    model = build_model(make_cfg(moe=MOE), ScaleConfig.preset("baseline"), device="meta")
    assert {p.device.type for p in model.parameters()} == {"meta"} and {t.device.type for t in calls} == {"meta"}
    assert torch.equal(torch.get_rng_state(), state)


@pytest.mark.parametrize("moe", [None, MOE], ids=["dense", "moe"])
def test_build_anywhere_then_init_is_the_seeded_model(make_cfg, moe):
    """Built on meta, materialized on the CPU and initialized under seed k: the model ``build_model(seed=k)`` gives,
    bitwise (the draws follow the parameters, not the device they were built on)."""
    cfg, scfg = make_cfg(moe=moe), ScaleConfig.preset("unified_foldable")
    ref = build_model(cfg, scfg, seed=3)
    with torch.device("meta"):
        model = Transformer(cfg, scfg)
    model.to_empty(device="cpu")
    with torch.random.fork_rng():
        torch.manual_seed(3)
        model.init_weights()
    for (name, p), q in zip(model.state_dict().items(), ref.state_dict().values()):
        assert torch.equal(p, q), name


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("moe", [None, MOE], ids=["dense", "moe"])
def test_cuda_build_is_the_cpu_model(make_cfg, moe):
    """``build_model(seed=k, device='cuda')`` equals the CPU build bitwise, whatever the CUDA RNG's state, and
    leaves that state untouched; so does ``Transformer`` built under a CUDA default device after manual_seed."""
    cfg, scfg = make_cfg(moe=moe), dataclasses.replace(ScaleConfig.preset("unified"))
    ref = build_model(cfg, scfg, seed=3).state_dict()
    for cuda_seed in (0, 1234):
        torch.cuda.manual_seed(cuda_seed)
        state = torch.cuda.get_rng_state()
        model = build_model(cfg, scfg, seed=3, device="cuda")
        assert torch.equal(torch.cuda.get_rng_state(), state)
        for name, p in model.state_dict().items():
            assert p.device.type == "cuda" and torch.equal(p.cpu(), ref[name]), name
    with torch.random.fork_rng(devices=[torch.cuda.current_device()]), torch.device("cuda"):
        torch.manual_seed(3)
        torch.cuda.manual_seed(99)
        direct = Transformer(cfg, scfg)
    for name, p in direct.state_dict().items():
        assert torch.equal(p.cpu(), ref[name]), name

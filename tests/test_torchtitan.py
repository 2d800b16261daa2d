"""scalevec in torchtitan 0.3.0 (``integrations/torchtitan.py``): its model converter and optimizer builder on its own
Llama3 ``debugmodel``, built on the meta device and initialized as torchtitan's trainer does (DESIGN.md §3, §5).

CPU only reaches the forward pass (torchtitan's flex attention has no CPU backward): gradients and optimizer steps of
a converted model are the GPU check's."""

import copy
import warnings

import pytest
import torch
from torchtitan.models import llama3

from scalevec.integrations.torchtitan import ScalevecConverter, ScalevecOptimizers, scalevec_job

T = 32


def build(spec_model_config, seed: int = 0):
    """torchtitan's trainer's way: build on meta, ``to_empty`` on the CPU, ``init_states`` under ``seed``."""
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DNP's "the function changes" (tested in test_integrations)
        model = spec_model_config.build()
    model.to_empty(device="cpu")
    torch.manual_seed(seed)
    model.init_states(buffer_device=None)
    return model.eval()


def logits(model, tokens):
    positions = torch.arange(tokens.shape[1]).expand_as(tokens)
    with torch.no_grad():
        return model(tokens, positions=positions, attention_masks=model.get_attention_masks(positions=positions))


@pytest.fixture(scope="module")
def plain():
    return build(llama3.model_registry("debugmodel").model)


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(0, 2048, (2, T), generator=torch.Generator().manual_seed(3))


def test_optimizer_builder_groups_torchtitans_llama_by_role(plain):
    """``ScalevecOptimizers`` on torchtitan's Llama3: ``tok_embeddings`` undecayed embedding, ``lm_head`` the decayed
    output head, the RMSNorm gains undecayed scales, the block matrices decayed; every tensor once, named."""
    opts = ScalevecOptimizers.Config(lr=1e-3, weight_decay=0.1, implementation="for-loop").build(model_parts=[plain])
    (opt,) = opts.optimizers
    names = dict(plain.named_parameters())
    by_wd = {}
    for g in opt.param_groups:
        assert [names[n] is p for n, p in zip(g["param_names"], g["params"])] == [True] * len(g["params"])
        by_wd.setdefault(g["weight_decay"], set()).update(g["param_names"])
    assert by_wd[0.0] == {n for n in names if n == "tok_embeddings.weight" or n.endswith("norm.weight")}
    assert by_wd[0.1] == set(names) - by_wd[0.0] and "lm_head.weight" in by_wd[0.1]
    assert sum(len(g["params"]) for g in opt.param_groups) == len(names)


def test_converter_is_a_torchtitan_model_converter():
    """``ScalevecConverter.Config`` goes where torchtitan's own converters go (``model_registry(converters=...)``),
    refuses an unknown strategy, and ``scalevec_job`` plugs converter and optimizer into a ``Trainer.Config``."""
    spec = llama3.model_registry("debugmodel", converters=[ScalevecConverter.Config(strategy="unified_foldable")])
    assert isinstance(spec.model, llama3.Llama3Model.Config) and type(spec.model) is not llama3.Llama3Model.Config
    with pytest.raises(ValueError, match="unknown strategy"):
        ScalevecConverter.Config(strategy="nope").build()
    from torchtitan.models.llama3.config_registry import llama3_debugmodel

    job = scalevec_job(llama3_debugmodel(), "unified")
    assert isinstance(job.optimizer, ScalevecOptimizers.Config) and job.optimizer.lr == 8e-4
    assert type(job.model_spec.model).__qualname__ == "ScalevecLlama3Model.Config"


def test_scalevec_imports_without_the_frameworks():
    """``import scalevec.integrations`` imports neither torchtitan nor OLMo-core (nor the HF Trainer module): they
    are needed only by their own adapters."""
    import subprocess
    import sys

    code = ("import sys, scalevec, scalevec.integrations; "
            "print(sorted(m for m in ('torchtitan', 'olmo_core', 'scalevec.integrations.hf_trainer') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"

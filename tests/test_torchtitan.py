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
from scalevec.model.scales import ScaleVector

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


@pytest.mark.slow  # a fresh interpreter imports scalevec and transformers (~20 s on the shared 2 cores)
def test_scalevec_imports_without_the_frameworks():
    """``import scalevec.integrations`` imports neither torchtitan nor OLMo-core (nor the HF Trainer module): they
    are needed only by their own adapters."""
    import subprocess
    import sys

    frameworks = ("torchtitan", "olmo_core", "scalevec.integrations.hf_trainer")
    code = f"import sys, scalevec, scalevec.integrations; print(sorted(m for m in {frameworks} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
@pytest.mark.slow  # the first forward compiles torchtitan's flex attention on the CPU (~40 s)
@pytest.mark.parametrize("strategy", ["baseline", "iwd", "unified_foldable"])
def test_converted_debugmodel_computes_the_plain_models_logits_at_init(plain, tokens, strategy):
    """The converter's model (built on meta, ``init_states`` under the same seed; the protocol check passes) holds the
    unconverted model's matrices bitwise and every γ = 1, and a foldable strategy computes its logits (fp32
    re-association: measured 1.4e-6 on logits of size ~4; atol 1e-5)."""
    spec = llama3.model_registry("debugmodel", converters=[ScalevecConverter.Config(strategy=strategy)])
    conv = build(spec.model, seed=0)
    conv.verify_module_protocol()
    ours, theirs = dict(conv.named_parameters()), dict(plain.named_parameters())
    kept = [n for n in theirs if n in ours]
    assert len(kept) >= 2 + 6 * 4 and all(torch.equal(ours[n], theirs[n]) for n in kept)  # embedding, head, wo, w1-3
    gammas = [m.gamma() for m in conv.modules() if isinstance(m, ScaleVector)]
    assert gammas and all(torch.allclose(g, torch.ones_like(g), rtol=0, atol=1e-6) for g in gammas)  # OR: β·α/rms(α)
    torch.testing.assert_close(logits(conv, tokens), logits(plain, tokens), atol=1e-5, rtol=0)


def test_converted_model_groups_follow_the_strategy(tokens):
    """``ScalevecOptimizers`` on a model converted to ``unified_foldable``: its input scales decayed (IWD), the
    embedding not, every tensor in exactly one group."""
    spec = llama3.model_registry("debugmodel", converters=[ScalevecConverter.Config(strategy="unified_foldable")])
    conv = build(spec.model)
    (opt,) = ScalevecOptimizers.Config(weight_decay=0.1, implementation="for-loop").build(model_parts=[conv]).optimizers
    wd = {n: g["weight_decay"] for g in opt.param_groups for n in g["param_names"]}
    assert wd["tok_embeddings.weight"] == 0.0 and wd["lm_head.weight"] == 0.1
    assert len(wd) == len(dict(conv.named_parameters()))


@pytest.mark.slow  # compiles flex attention on the CPU once (shared with the parity test), builds an HF Llama
def test_folded_torchtitan_checkpoint_exports_to_a_plain_hf_llama(plain, tokens, tmp_path):
    """A converted debugmodel whose scale vectors moved away from 1 (as after training), saved as a torchtitan
    model-only checkpoint (DCP), restored into a fresh converted model, folded and written through torchtitan's own
    HF converter, loads as a plain transformers ``LlamaForCausalLM`` (no missing or unexpected
    tensor) that computes the converted model's logits (fp32; measured 1.4e-6 on logits of size ~4.6, while moving the
    γ moved them by 1.5; atol 1e-5); ``unified`` (DNP) is refused."""
    import transformers

    from scalevec.integrations.torchtitan import convert_model, export_hf

    model = copy.deepcopy(plain)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        convert_model(model, "unified_foldable")
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, ScaleVector):
                m.assign(1 + 0.3 * torch.randn(m.gamma().shape, generator=g))
    want = logits(model, tokens)
    # through a checkpoint as torchtitan's checkpointer writes a model-only one: DCP of get_model_state_dict's FQNs,
    # restored into a model its converter builds
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    dcp.save(get_model_state_dict(model), checkpoint_id=str(tmp_path / "step-10"))
    spec = llama3.model_registry("debugmodel", converters=[ScalevecConverter.Config(strategy="unified_foldable")])
    model = build(spec.model, seed=1)
    state = get_model_state_dict(model)
    dcp.load(state, checkpoint_id=str(tmp_path / "step-10"))
    set_model_state_dict(model, state)
    export_hf(model, tmp_path / "hf")
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert type(hf).__name__ == "LlamaForCausalLM"
    with torch.no_grad():
        got = hf(tokens).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    unified = copy.deepcopy(plain)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        convert_model(unified, "unified")
    with pytest.raises(ValueError, match="cannot fold"):
        export_hf(unified, tmp_path / "never")


def test_weight_decay_guard_judges_the_optimizers_inside_torchtitans_container():
    """``ScalevecOptimizers`` steps a model converted to ``unified`` (its container's own flat group, which carries no
    weight decay, is not judged), while a wrong decay in the optimizer inside it is still refused at its step."""
    from scalevec.integrations import WeightDecayMismatch

    spec = llama3.model_registry("debugmodel", converters=[ScalevecConverter.Config(strategy="unified")])
    conv = build(spec.model)
    opts = ScalevecOptimizers.Config(weight_decay=0.1, implementation="for-loop").build(model_parts=[conv])
    opts.step()  # no gradients yet: a step that changes nothing, after the guard's check
    wrong = ScalevecOptimizers.Config(weight_decay=0.1, implementation="for-loop").build(model_parts=[conv])
    (opt,) = wrong.optimizers
    next(g for g in opt.param_groups if any("in_scale.magnitude" in n for n in g["param_names"]))["weight_decay"] = 0.0
    with pytest.raises(WeightDecayMismatch, match="in_scale.magnitude"):
        wrong.step()

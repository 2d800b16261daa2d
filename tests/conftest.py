"""Shared tiny fixtures for the scalevec tests (CPU, fp32, one thread).

The tiny model has GQA (4 query heads, 2 key/value heads), head_dim 8, two layers and a 64-token
vocabulary, so every test builds and runs it in milliseconds.
"""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from scalevec import ModelConfig
from scalevec.model.params import SCALE_ROLES

torch.set_num_threads(1)

# Without a GPU, Triton's kernels (tests/test_triton_dnp.py) run under its interpreter (numpy on CPU tensors). It
# must be on before anything imports triton: triton binds its own helpers (tl.sum, ...) to compiler or interpreter then.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


TINY = ModelConfig(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=48, vocab_size=64, max_seq_len=16)


@pytest.fixture
def make_cfg():
    """Factory: the tiny GQA ``ModelConfig`` with field overrides, e.g. ``make_cfg(qk_norm=True)``."""
    return lambda **overrides: dataclasses.replace(TINY, **overrides)


@pytest.fixture
def tokens():
    """A fixed batch of token ids, shape (2, 12), in the tiny vocabulary."""
    g = torch.Generator().manual_seed(1234)
    return torch.randint(0, TINY.vocab_size, (2, 12), generator=g)


def _perturb(model: torch.nn.Module, seed: int = 0, spread: float = 0.5) -> None:
    """Move every scale parameter (γ, s, β, b, α) away from its init, reproducibly, so that it matters.

    Direct γ and magnitudes β become ``1 + spread·N(0,1)``-ish values, ER's ``b`` becomes ``spread·N``,
    directions α become ``1 + spread·N``; none is near zero, so rms(α) stays well conditioned.
    """
    g = torch.Generator().manual_seed(seed)
    roles = model.param_roles()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if roles[name] not in SCALE_ROLES:
                continue
            noise = spread * torch.randn(p.shape, generator=g).clamp(-1.5, 1.5)
            if name.endswith("log_magnitude"):
                p.copy_(noise)
            else:
                p.copy_(1.0 + noise)


@pytest.fixture
def perturb_scales():
    """``perturb_scales(model, seed=0)``: set every scale parameter to a reproducible non-trivial value."""
    return _perturb


@pytest.fixture(scope="module")
def hf_llama(tmp_path_factory):
    """``(directory, model)``: a random Hugging Face Llama written by ``save_pretrained`` (byte vocabulary, GQA,
    explicit head_dim 16, 2 layers), norm weights 1 ± 0.5 so that a conversion that drops a norm shows."""
    import transformers  # a dev dependency: missing it fails the tests that use this, never skips

    path = tmp_path_factory.mktemp("hf_llama") / "hf"
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                   max_position_embeddings=64, initializer_range=0.1)
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.5 * torch.randn_like(p))
    model.save_pretrained(path)
    return path, model

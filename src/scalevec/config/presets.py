"""Model presets: CPU sizes for tests and the main job, and the paper's Llama family (DESIGN.md §11).

The paper family keeps head_dim 64, ``d_ff = floor(8/3 · d_model)`` (SwiGLU), vocab 50304 untied, full
multi-head attention; ``llama-1b`` is exactly the paper's Llama-1B (1,028,065,024 parameters with the
``baseline`` strategy, 80,640 of them scale vectors). The others are sized so that the total parameter
count matches the name. CPU presets use the bytes vocabulary (256) and head_dim 32. MoE presets
(``moe-*``) keep the dense attention and replace every MLP by fine-grained experts (DESIGN.md §6).

| preset       | d_model | n_layers | n_heads | d_ff | vocab | notes |
|--------------|--------:|---------:|--------:|-----:|------:|-------|
| tiny         |      64 |        4 |       2 |  170 |   256 | ~0.2M non-embedding |
| small        |     128 |        5 |       4 |  341 |   256 | ~1M non-embedding |
| medium       |     256 |        6 |       8 |  682 |   256 | ~4.7M non-embedding |
| llama-0.12b  |     640 |       12 |      10 | 1706 | 50304 | 0.123B |
| llama-0.25b  |     896 |       16 |      14 | 2389 | 50304 | 0.244B |
| llama-0.5b   |    1280 |       18 |      20 | 3413 | 50304 | 0.483B |
| llama-1b     |    1792 |       22 |      28 | 4778 | 50304 | 1.028B (the paper's) |
| llama-2b     |    2304 |       28 |      36 | 6144 | 50304 | 2.016B |

The CPU ladder of the reproduction study (docs/reproduction.md) names each rung by its non-embedding
parameters (bytes vocabulary, head_dim 10, 16 or 32, ``d_ff = floor(8/3 · d_model)``); a budget of 20 tokens
per parameter is 0.8M tokens at ``cpu-25k`` and 21M at ``cpu-1m``. Every rung (and the ``moe-cpu-*`` presets)
initializes in the 0.12B model's regime, ``model.init_width = 640``: std = 0.02·√(640/d_model), 0.113 at
d_model 20 and 0.063 at 64 (``model.init_width=null`` restores 0.02 at every width, the study's first protocol):

| preset       | d_model | n_layers | n_heads | d_ff | total params | non-embedding | notes |
|--------------|--------:|---------:|--------:|-----:|-------------:|--------------:|-------|
| cpu-10k      |      20 |        2 |       2 |   53 |       19,900 |         9,660 | head_dim 10 |
| cpu-25k      |      32 |        2 |       2 |   85 |       41,056 |        24,672 | |
| cpu-80k      |      48 |        3 |       3 |  128 |      107,856 |        83,280 | |
| cpu-200k     |      64 |        4 |       2 |  170 |      229,440 |       196,672 | = tiny |
| cpu-550k     |      96 |        5 |       3 |  256 |      603,168 |       554,016 | |
| cpu-1m       |     128 |        5 |       4 |  341 |    1,049,344 |       983,808 | = small |
| gpu-3m       |     192 |        6 |       6 |  512 |    2,755,008 |     2,656,704 | the GPU ladder |
| gpu-6m       |     256 |        8 |       8 |  682 |    6,422,784 |     6,291,712 | |
| gpu-14m      |     384 |        8 |       6 | 1024 |   14,358,912 |    14,162,304 | head_dim 64 |
| gpu-30m      |     512 |       10 |       8 | 1365 |   31,725,056 |    31,462,912 | head_dim 64 |
| moe-cpu-60k  |      32 |        2 |       2 | 8×32, top-2 | 74,400 |   58,016 | 37,536 active |
| moe-cpu-200k |      48 |        3 |       3 | 8×48, top-2 | 219,600 | 195,024 | 95,184 active |

MoE presets (DESIGN.md §6): every block's MLP is an MoE of E SwiGLU experts of width d_expert, top-k
routing, no shared expert; attention as in the dense family (full MHA). Counts with ``baseline``
(``unified`` adds 1.2 % at moe-tiny, under 0.1 % at paper scale); "active" counts the parameters one
token uses (everything but the routed experts, plus the router and k of E experts).
The paper-scale ones keep the Llama family rule (head_dim 64, vocab 50304); ``moe-2b`` is the
``llama-0.5b`` backbone with 32 experts of width 768 (4 active: 3072 ≈ its dense d_ff 3413).

| preset    | d_model | n_layers | n_heads | E  | top_k | d_expert | vocab | total         | active      |
|-----------|--------:|---------:|--------:|---:|------:|---------:|------:|--------------:|------------:|
| moe-tiny  |      64 |        4 |       2 |  8 |     2 |       64 |   256 |       494,144 |     199,232 |
| moe-small |     128 |        5 |       4 |  8 |     2 |      128 |   256 |     2,365,824 |     891,264 |
| moe-0.5b  |     768 |       12 |      12 | 32 |     4 |      448 | 50304 |   502,254,336 | 155,437,824 |
| moe-2b    |    1280 |       18 |      20 | 32 |     4 |      768 | 50304 | 1,946,220,800 | 459,864,320 |
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from scalevec.config import ModelConfig, MoEConfig

# The 0.12B model's d_model: the CPU ladder's init_std of 0.02 holds at this width and scales as 1/√d_model, so
# every rung starts where the paper's smallest model does, std·√d_model = 0.02·√640 ≈ 0.506 (DESIGN.md §2).
LADDER_INIT_WIDTH = 640


def _llama(d_model: int, n_layers: int, vocab: int = 50304, head_dim: int = 64, max_seq_len: int = 2048,
           init_width: int | None = None) -> ModelConfig:
    n_heads = d_model // head_dim
    return ModelConfig(d_model=d_model, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_heads,
                       d_ff=8 * d_model // 3, vocab_size=vocab, max_seq_len=max_seq_len, init_width=init_width)


def _rung(d_model: int, n_layers: int, head_dim: int) -> ModelConfig:
    """A rung of the CPU ladder: bytes vocabulary, 256 positions, the 0.12B model's init regime."""
    return _llama(d_model, n_layers, vocab=256, head_dim=head_dim, max_seq_len=256, init_width=LADDER_INIT_WIDTH)


def _moe(base: ModelConfig, n_experts: int, top_k: int, d_expert: int) -> ModelConfig:
    """``base`` with every MLP replaced by an MoE of ``n_experts`` experts of width ``d_expert`` (§6)."""
    return dataclasses.replace(base, moe=MoEConfig(n_experts=n_experts, top_k=top_k, d_expert=d_expert))


PRESETS: dict[str, ModelConfig] = {
    "tiny": _llama(64, 4, vocab=256, head_dim=32, max_seq_len=256),
    "small": _llama(128, 5, vocab=256, head_dim=32, max_seq_len=512),
    "medium": _llama(256, 6, vocab=256, head_dim=32, max_seq_len=512),
    "llama-0.12b": _llama(640, 12),
    "llama-0.25b": _llama(896, 16),
    "llama-0.5b": _llama(1280, 18),
    "llama-1b": _llama(1792, 22),
    "llama-2b": _llama(2304, 28),
    # the CPU model ladder of the reproduction study (docs/reproduction.md): one knob per rung, ~×2.5-4 apart
    "cpu-10k": _rung(20, 2, head_dim=10),
    "cpu-25k": _rung(32, 2, head_dim=16),
    "cpu-80k": _rung(48, 3, head_dim=16),
    "cpu-200k": _rung(64, 4, head_dim=32),
    "cpu-550k": _rung(96, 5, head_dim=32),
    "cpu-1m": _rung(128, 5, head_dim=32),
    # the ladder continued on a GPU (scripts/gpu_ladder.sh): the same init regime, bytes vocabulary
    "gpu-3m": _rung(192, 6, head_dim=32),
    "gpu-6m": _rung(256, 8, head_dim=32),
    "gpu-14m": _rung(384, 8, head_dim=64),
    "gpu-30m": _rung(512, 10, head_dim=64),
    "moe-cpu-60k": _moe(_rung(32, 2, head_dim=16), 8, 2, 32),
    "moe-cpu-200k": _moe(_rung(48, 3, head_dim=16), 8, 2, 48),
    "moe-tiny": _moe(_llama(64, 4, vocab=256, head_dim=32, max_seq_len=256), 8, 2, 64),
    "moe-small": _moe(_llama(128, 5, vocab=256, head_dim=32, max_seq_len=512), 8, 2, 128),
    "moe-0.5b": _moe(_llama(768, 12), 32, 4, 448),
    "moe-2b": _moe(_llama(1280, 18), 32, 4, 768),
}


LABEL_PREFIX = "hf-"  # init_from.preset_label: a run from a Hugging Face model records preset hf-<family>
LABEL_BASE = "small"  # the preset a label's model section is laid over (the section holds the whole shape)




def model_base(name: str, model_section: Any = None) -> str:
    """The preset whose model a config with ``preset: name`` starts from: ``name`` itself, or ``LABEL_BASE``
    for a label (``hf-<family>``, written by a run initialized from a Hugging Face model) whose model section
    gives every field (as every stored config does: nothing is filled in from another preset's shape), so that
    a run's ``--print-config`` output is a valid ``--config``; a model section that is not a mapping passes on
    to the section check, which names it. Raises ``ValueError`` naming the known presets for any other unknown
    name, and the missing fields for a label without the whole model."""
    if name in PRESETS:
        return name
    if name.startswith(LABEL_PREFIX) and len(name) > len(LABEL_PREFIX):
        if model_section is not None and not isinstance(model_section, Mapping):
            return LABEL_BASE
        missing = [f.name for f in dataclasses.fields(ModelConfig) if f.name not in (model_section or {})]
        if not missing:
            return LABEL_BASE
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise ValueError(f"preset {name!r} is a label (a run from a Hugging Face model records it), not a preset: "
                         f"its config must give the whole model section, as the run's config.yaml does (missing: "
                         f"{shown}); or choose a preset: {', '.join(PRESETS)}")
    get_preset(name)  # raises, naming the presets
    return name


def get_preset(name: str) -> ModelConfig:
    """A fresh copy of preset ``name``. Raises ``ValueError`` naming the known presets."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of: {', '.join(PRESETS)}")
    return dataclasses.replace(PRESETS[name], moe=dataclasses.replace(PRESETS[name].moe) if PRESETS[name].moe else None)


__all__ = ["PRESETS", "get_preset", "model_base", "MoEConfig"]

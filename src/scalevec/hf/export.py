"""Export a trained model as a Hugging Face checkpoint: fold, rename, write, verify (DESIGN.md §10).

A model trained with a foldable strategy is, after ``fold_scales`` (§1, §4), an ordinary Llama: no scale
vector is left except QK-norm's, which Qwen3 holds as ``q_norm``/``k_norm``. Export is therefore a fold
plus a rename (explicit name maps, as litgpt does), written as:

    OUT/config.json                       LlamaConfig / Qwen3Config / MixtralConfig / Qwen3MoeConfig
    OUT/generation_config.json            bos/eos/pad ids
    OUT/model.safetensors                 or model-0000i-of-0000n.safetensors + model.safetensors.index.json
    OUT/tokenizer.json, tokenizer_config.json   the run's tokenizer, with bos/eos/pad declared (when given)

Formats: dense ``pre`` → ``llama``; with QK-norm → ``qwen3``; MoE → ``mixtral``; MoE with QK-norm →
``qwen3_moe``. Every input-norm weight written (input_layernorm, post_attention_layernorm, norm) is
exactly 1.0: their γ now lives in the linear weights.

Strategies that cannot fold (DNP and ``unified``, the ``peri`` layout; also MoE shapes no plain family
holds) export as the custom architecture ``scalevec`` (format ``scalevec``): ``configuration_scalevec.py``
and ``modeling_scalevec.py`` (``scalevec/hf/remote``, torch + transformers only) are copied into OUT and
named in config.json's ``auto_map``, so ``AutoModelForCausalLM.from_pretrained(OUT, trust_remote_code=True)``
loads it. Everything that folds is folded (``diag(s) W diag(γ)``, DNP's s on W_up into W_down); only
DNP's normalization and its gate scale, the peri output norms and QK-norm keep a scale
(``remote_state_dict``).

The tokenizer is written so that tools that know nothing of scalevec (lm-evaluation-harness) find a BOS,
a pad and a loglikelihood prefix token: a tokenizer with no special tokens at all (``bytes``) gets the
newline byte as BOS and pad (``BYTES_PREFIX``; in training every document follows a newline), added
by its post-processor as a BOS would be; a missing pad is the EOS. ``verify`` loads the result with
plain transformers and compares logits, loss and greedy ids with ours. Sampling text lives in ``generate.py``.

This module needs the optional dependency ``transformers`` (``pip install 'scalevec[hf]'``).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from scalevec.config import ModelConfig
from scalevec.data.tokenizer import BYTES_PREFIX
from scalevec.hf.names import FORMATS, ONES_NAMES, name_map
from scalevec.model.fold import fold_scales, unfoldable_scales
from scalevec.model.scales import scale_plan
from scalevec.model.transformer import Transformer

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
VERIFY_ATOL = 1e-4  # fp32 logits: ours vs transformers (issue 7)
# the custom architecture: fp32 logits within 1e-5 (issue 15; measured ~1e-7 on the tiny test models, ~1e-6 at small)
VERIFY_ATOL_REMOTE = 1e-5
REMOTE_FORMAT = "scalevec"  # the custom architecture (auto_map + trust_remote_code)
REMOTE_FILES = ("configuration_scalevec.py", "modeling_scalevec.py")
REMOTE_AUTO_MAP = {"AutoConfig": "configuration_scalevec.ScalevecConfig",
                   "AutoModelForCausalLM": "modeling_scalevec.ScalevecForCausalLM"}

class VerifyError(RuntimeError):
    """The exported checkpoint does not reproduce our model (a bug, not a user error)."""


# --------------------------------------------------------------------------------------------- format


def choose_format(cfg: ModelConfig, fmt: str = "auto") -> str:
    """The Hugging Face family that holds ``cfg`` exactly (DESIGN.md §10).

    ``auto`` picks llama / qwen3 (QK-norm) / mixtral (MoE) / qwen3_moe (MoE + QK-norm). An explicit
    ``fmt`` must be that same family. Raises ``ValueError`` for an unknown format, a format that cannot
    hold the model, or an MoE feature no target has (shared experts; dense layers under Mixtral).
    """
    if fmt != "auto" and fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r}; use auto or one of: {', '.join(FORMATS)}")
    if cfg.moe is None:
        wanted = "qwen3" if cfg.qk_norm else "llama"
    else:
        wanted = "qwen3_moe" if cfg.qk_norm else "mixtral"
        if cfg.moe.n_shared_experts:
            raise ValueError(f"moe.n_shared_experts={cfg.moe.n_shared_experts}: neither Mixtral nor Qwen3-MoE has "
                             f"shared experts; only models with moe.n_shared_experts=0 export")
        if cfg.moe.first_dense and wanted == "mixtral":
            raise ValueError(f"moe.first_dense={cfg.moe.first_dense}: Mixtral has no dense layers; only MoE models "
                             f"with moe.first_dense=0 (or with QK-norm, as Qwen3-MoE) export")
    if fmt not in ("auto", wanted):
        why = "QK-norm" if cfg.qk_norm else "no QK-norm"
        kind = "an MoE" if cfg.moe is not None else "a dense"
        raise ValueError(f"--format {fmt} cannot hold {kind} model with {why}; use --format {wanted} (or auto)")
    return wanted


def rope_parameters(cfg: ModelConfig) -> dict:
    """``rope_parameters`` of a transformers config: ``default``, or ``llama3`` with ``cfg.rope_scaling``."""
    params = {"rope_type": "default", "rope_theta": float(cfg.rope_theta)}
    if cfg.rope_scaling is not None:
        r = cfg.rope_scaling
        params.update(rope_type="llama3", factor=float(r.factor), low_freq_factor=float(r.low_freq_factor),
                      high_freq_factor=float(r.high_freq_factor),
                      original_max_position_embeddings=int(r.original_max_position_embeddings))
    return params


def hf_config(cfg: ModelConfig, fmt: str, dtype: str = "float32", bos_id: int | None = None,
              eos_id: int | None = None):
    """The transformers config of family ``fmt`` for model shape ``cfg`` (DESIGN.md §2, §6, §10).

    Carries every field the forward pass reads: sizes, GQA heads, head_dim, rope_theta, rms_norm_eps,
    max positions, untied embeddings, no biases, no sliding window, MoE routing (softmax over all
    experts, top-k, renormalized). Raises ``ImportError`` without transformers.
    """
    import transformers

    common = dict(
        vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_kv_heads, head_dim=int(cfg.head_dim),
        hidden_act="silu", max_position_embeddings=cfg.max_seq_len, rms_norm_eps=cfg.norm_eps,
        rope_parameters=rope_parameters(cfg),
        initializer_range=cfg.weight_std, tie_word_embeddings=False, bos_token_id=bos_id, eos_token_id=eos_id,
        architectures=[FORMATS[fmt]], dtype=dtype,
    )
    if fmt == "llama":
        return transformers.LlamaConfig(intermediate_size=cfg.d_ff, attention_bias=False, mlp_bias=False, **common)
    if fmt == "qwen3":
        return transformers.Qwen3Config(intermediate_size=cfg.d_ff, attention_bias=False, use_sliding_window=False,
                                        **common)
    moe = cfg.moe
    if fmt == "mixtral":
        return transformers.MixtralConfig(intermediate_size=moe.d_expert, num_local_experts=moe.n_experts,
                                          num_experts_per_tok=moe.top_k, router_aux_loss_coef=moe.lb_coef,
                                          sliding_window=None, **common)
    return transformers.Qwen3MoeConfig(
        intermediate_size=cfg.d_ff, moe_intermediate_size=moe.d_expert, num_experts=moe.n_experts,
        num_experts_per_tok=moe.top_k, norm_topk_prob=True, router_aux_loss_coef=moe.lb_coef,
        decoder_sparse_step=1, mlp_only_layers=list(range(moe.first_dense)), attention_bias=False,
        use_sliding_window=False, **common)


# --------------------------------------------------------------------------------------------- weights


def hf_state_dict(folded: Transformer, fmt: str, dtype: torch.dtype = torch.float32) -> dict[str, Tensor]:
    """The checkpoint tensors of a folded model under Hugging Face names, cast to ``dtype``.

    ``folded`` comes from ``fold_scales`` (no Input-Norm scales left). Expert banks ``(E, d_out, d_in)``
    are split per expert. Input-norm weights are written as exactly 1.0 (their γ lives in the weights).
    Raises ``ValueError`` if a parameter has no Hugging Face name (an unsupported model).
    """
    names = name_map(fmt)
    out: dict[str, Tensor] = {}
    for key, t in folded.state_dict().items():
        m = re.match(r"layers\.(\d+)\.(.*)", key)
        i, template = (int(m.group(1)), f"layers.{{i}}.{m.group(2)}") if m else (None, key)
        if template not in names:
            raise ValueError(f"parameter {key} has no {FORMATS[fmt]} counterpart; this model cannot export as {fmt}")
        target = names[template]
        t = t.detach().to(device="cpu", dtype=dtype)
        if "{j}" in target:
            for j in range(t.shape[0]):
                out[target.format(i=i, j=j)] = t[j].clone()
        else:
            out[target.format(i=i)] = t.contiguous()
    d = folded.cfg.d_model
    for i in range(folded.cfg.n_layers):
        for template in ONES_NAMES:
            out[template.format(i=i)] = torch.ones(d, dtype=dtype)
    out["model.norm.weight"] = torch.ones(d, dtype=dtype)
    return out


def write_safetensors(state: dict[str, Tensor], out_dir: Path, max_shard_size: int | str = "5GB") -> list[str]:
    """Write ``state`` as ``model.safetensors``, or as shards plus ``model.safetensors.index.json`` when it
    exceeds ``max_shard_size`` (the Hugging Face layout, split by huggingface_hub). Returns the file names.
    A failed write (a full disk) is an ``OSError`` naming the file, also when safetensors reports it (its
    ``SafetensorError`` is no ``OSError``: ``checkpoint.write_error``), so ``scalevec export`` says it in one line."""
    from huggingface_hub import split_torch_state_dict_into_shards
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    from scalevec.training.checkpoint import write_error

    split = split_torch_state_dict_into_shards(state, max_shard_size=max_shard_size)
    for filename, keys in split.filename_to_tensors.items():
        path = out_dir / filename
        try:
            save_file({k: state[k] for k in keys}, str(path), metadata={"format": "pt"})
        except SafetensorError as e:
            raise write_error(e, path) from None
    files = list(split.filename_to_tensors)
    if split.is_sharded:
        index = {"metadata": split.metadata, "weight_map": split.tensor_to_filename}
        (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
        files.append("model.safetensors.index.json")
    return files


# --------------------------------------------------------------------------------------------- custom code


def remote_config(cfg: ModelConfig, scfg, dtype: str = "float32", bos_id: int | None = None,
                  eos_id: int | None = None, pad_id: int | None = None):
    """The ``ScalevecConfig`` (``hf/remote/configuration_scalevec.py``) of a model shape and strategy, with
    ``auto_map`` naming the shipped files (DESIGN.md §10). ``mlp_norm_sites`` are the gate/up projections
    whose outputs DNP normalizes. Raises ``ImportError`` without transformers."""
    from scalevec.hf.remote.configuration_scalevec import ScalevecConfig

    mlp = scale_plan(scfg, cfg).mlp  # the dense MLP and the experts normalize the same sites (scale_plan)
    norm_sites = [s for s in ("gate", "up") if mlp.branches[s].normalized]
    r = getattr(cfg, "rope_scaling", None)
    moe = cfg.moe
    config = ScalevecConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.d_ff,
        num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_kv_heads,
        head_dim=int(cfg.head_dim), max_position_embeddings=cfg.max_seq_len, rope_theta=float(cfg.rope_theta),
        rope_llama3=None if r is None else dict(
            factor=float(r.factor), low_freq_factor=float(r.low_freq_factor),
            high_freq_factor=float(r.high_freq_factor),
            original_max_position_embeddings=int(r.original_max_position_embeddings)),
        rms_norm_eps=cfg.norm_eps, layout=cfg.layout, qk_norm=cfg.qk_norm, mlp_norm_sites=norm_sites,
        num_experts=moe.n_experts if moe else 0, num_experts_per_tok=moe.top_k if moe else 2,
        moe_intermediate_size=moe.d_expert if moe else 128, n_shared_experts=moe.n_shared_experts if moe else 0,
        first_dense=moe.first_dense if moe else 0, initializer_range=cfg.weight_std, tie_word_embeddings=False,
        bos_token_id=bos_id, eos_token_id=eos_id, pad_token_id=pad_id,
    )
    config.architectures = ["ScalevecForCausalLM"]
    config.auto_map = dict(REMOTE_AUTO_MAP)
    config.dtype = dtype
    return config


def _output_gamma(norm, d: int) -> Tensor:
    """The γ of a ``scales.OutputNorm`` (QK-norm, peri), or ones where the strategy has none (scale=none)."""
    return norm.scale() if norm.scale is not None else torch.ones(d)


def _swiglu_weights(gate, up, down: Tensor, shared: Tensor | None) -> dict[str, Tensor]:
    """Folded ``gate_proj, up_proj, down_proj`` (and DNP's ``gate_norm``) of one SwiGLU, dense or an expert
    bank: ``diag(s) W diag(γ_shared γ)`` where s folds; DNP's s on ``up`` (it multiplies the SiLU product,
    which W_down reads) folds into W_down's columns; DNP's s on ``gate`` feeds SiLU and is kept."""
    out = {"gate_proj": gate.folded_weight(shared), "up_proj": up.folded_weight(shared), "down_proj": down}
    if up.out_norm:
        s = up.out_scale()  # (d_ff,) or (E, d_expert)
        out["down_proj"] = down * s.unsqueeze(-2).to(down.dtype)
    if gate.out_norm:
        out["gate_norm"] = gate.out_scale()
    return out


def remote_state_dict(model: Transformer, dtype: torch.dtype = torch.float32) -> dict[str, Tensor]:
    """The tensors of ``modeling_scalevec.ScalevecForCausalLM`` for ``model``, every foldable scale folded
    (DESIGN.md §1, §4): the shared and branch γ of every Input-Norm and the foldable output scales s go
    into the linear weights; kept are DNP's output normalization (no tensor, a config switch) with its
    gate scale, the peri output norms' γ and QK-norm's γ. Tied embeddings are untied. Cast to ``dtype``."""
    cfg = model.cfg
    out: dict[str, Tensor] = {"model.embed_tokens.weight": model.embed.weight}
    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}."
        attn = layer.attn
        for name, w in attn.proj.folded_state().items():  # branches.{q,k,v}.weight: no DNP on attention
            out[p + f"self_attn.{name.split('.')[1]}_proj.weight"] = w
        out[p + "self_attn.o_proj.weight"] = attn.o.weight
        if cfg.qk_norm:
            out[p + "self_attn.q_norm.weight"] = _output_gamma(attn.q_norm, cfg.head_dim)
            out[p + "self_attn.k_norm.weight"] = _output_gamma(attn.k_norm, cfg.head_dim)
        if cfg.layout == "peri":
            out[p + "attn_out_norm.weight"] = _output_gamma(layer.attn_out, cfg.d_model)
            out[p + "mlp_out_norm.weight"] = _output_gamma(layer.mlp_out, cfg.d_model)
        mlp = layer.mlp
        if hasattr(mlp, "experts"):  # moe.MoE: its own Input-Norm γ
            shared = mlp.scale() if mlp.scale is not None else None
            out[p + "mlp.router.weight"] = mlp.router.folded_weight(shared)
            e = mlp.experts
            for k, w in _swiglu_weights(e.gate, e.up, e.down.weight, shared).items():
                out[p + f"mlp.experts.{k}"] = w
            if mlp.shared_experts is not None:
                se = mlp.shared_experts
                for k, w in _swiglu_weights(se.gate, se.up, se.down.weight, shared).items():
                    out[p + f"mlp.shared_experts.{k}" + ("" if k == "gate_norm" else ".weight")] = w
        else:
            br = mlp.proj.branches
            shared = mlp.proj.scale() if mlp.proj.scale is not None else None
            for k, w in _swiglu_weights(br["gate"], br["up"], mlp.down.weight, shared).items():
                out[p + f"mlp.{k}" + ("" if k == "gate_norm" else ".weight")] = w
    out["lm_head.weight"] = model.head.folded_state()["branches.lm_head.weight"]
    # clone: an untouched weight may share memory with another (tied embeddings), which safetensors refuses
    return {k: t.detach().to(device="cpu", dtype=dtype).clone() for k, t in out.items()}


def copy_remote_code(out_dir: Path) -> None:
    """Copy ``configuration_scalevec.py`` and ``modeling_scalevec.py`` (package data) into ``out_dir``,
    byte for byte: ``generate``/``eval`` trust an export's code only when its sha256 is the shipped
    file's (``generate.check_hf_dir``), and a text copy may rewrite line endings."""
    from importlib import resources

    src = resources.files("scalevec.hf.remote")
    for name in REMOTE_FILES:
        (out_dir / name).write_bytes(src.joinpath(name).read_bytes())


# --------------------------------------------------------------------------------------------- export


@dataclass
class Specials:
    """The special tokens an export declares (DESIGN.md §8, §10): ``bos``/``eos``/``pad`` as
    ``(token, id)`` or None; ``add_bos``: the exported tokenizer's post-processor must prepend BOS
    (the source tokenizer had none: a ``bytes`` tokenizer, whose BOS is ``BYTES_PREFIX``)."""

    bos: tuple[str, int] | None
    eos: tuple[str, int] | None
    pad: tuple[str, int] | None
    add_bos: bool
    n_tokens: int


def tokenizer_specials(tokenizer_dir: str | Path) -> Specials:
    """The ``Specials`` of a tokenizer directory, read with ``PreTrainedTokenizerFast``: its own BOS/EOS;
    with neither, the token of ``BYTES_PREFIX`` as BOS (prepended on encoding); pad: its own, else EOS,
    else BOS. lm-evaluation-harness needs a BOS or EOS as loglikelihood prefix and a pad token.
    Raises ``FileNotFoundError`` when ``tokenizer.json`` is missing."""
    from transformers import PreTrainedTokenizerFast

    tokenizer_dir = Path(tokenizer_dir)
    if not (tokenizer_dir / "tokenizer.json").is_file():
        raise FileNotFoundError(f"{tokenizer_dir / 'tokenizer.json'} does not exist; pass the run's tokenizer/ "
                                f"directory (it holds tokenizer.json and tokenizer_config.json)")
    tok = PreTrainedTokenizerFast.from_pretrained(str(tokenizer_dir))

    def pair(token):
        return (str(token), tok.convert_tokens_to_ids(str(token))) if token is not None else None

    bos, eos, pad, add_bos = pair(tok.bos_token), pair(tok.eos_token), pair(tok.pad_token), False
    if bos is None and eos is None:
        ids = tok.encode(BYTES_PREFIX, add_special_tokens=False)
        if len(ids) == 1:
            bos, add_bos = (tok.convert_ids_to_tokens(ids[0]), ids[0]), True
    return Specials(bos, eos, pad or eos or bos, add_bos, len(tok))


def tokenizer_ids(tokenizer_dir: str | Path) -> tuple[int | None, int | None, int]:
    """``(bos_id, eos_id, vocab size)`` of an exported tokenizer (``tokenizer_specials``).
    Raises ``FileNotFoundError`` when ``tokenizer.json`` is missing."""
    sp = tokenizer_specials(tokenizer_dir)
    return (sp.bos[1] if sp.bos else None), (sp.eos[1] if sp.eos else None), sp.n_tokens


def write_tokenizer(tokenizer_dir: Path, out: Path, sp: Specials, max_len: int) -> None:
    """Write the tokenizer of ``tokenizer_dir`` into ``out`` with ``sp`` declared: tokenizer.json (a BOS
    post-processor added when ``sp.add_bos``) and tokenizer_config.json (bos/eos/pad tokens, class
    ``PreTrainedTokenizerFast`` that every transformers version has, ``model_max_length = max_len``)."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import processors

    hf = HFTokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    if sp.add_bos:
        hf.post_processor = processors.TemplateProcessing(single=f"{sp.bos[0]} $A", pair=f"{sp.bos[0]} $A $B:1",
                                                          special_tokens=[sp.bos])
    hf.save(str(out / "tokenizer.json"))
    src = tokenizer_dir / "tokenizer_config.json"
    config = json.loads(src.read_text(encoding="utf-8")) if src.is_file() else {}
    config.update(tokenizer_class="PreTrainedTokenizerFast", model_max_length=max_len)
    for key, value in (("bos_token", sp.bos), ("eos_token", sp.eos), ("pad_token", sp.pad)):
        if value is not None:
            config[key] = value[0]
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n",
                                               encoding="utf-8")
    special_map = tokenizer_dir / "special_tokens_map.json"
    if special_map.is_file():
        smap = json.loads(special_map.read_text(encoding="utf-8"))
        smap.update({k: config[k] for k in ("bos_token", "eos_token", "pad_token") if k in config})
        (out / "special_tokens_map.json").write_text(json.dumps(smap, indent=2, ensure_ascii=False) + "\n",
                                                     encoding="utf-8")


def check_out_dir(out_dir: str | Path) -> Path:
    """``out_dir`` as a Path, if writing there overwrites nothing. Raises ``FileExistsError`` otherwise."""
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"--out {out} already exists and is not empty; choose a new directory or remove it")
    return out


def export_model(model: Transformer, out_dir: str | Path, tokenizer_dir: str | Path | None = None,
                 format: str = "auto", dtype: str = "float32", max_shard_size: int | str = "5GB",
                 verify_tokens: Tensor | None = None) -> Path:
    """Fold ``model`` and write it to ``out_dir`` as a Hugging Face checkpoint (DESIGN.md §10).

    Writes config.json, generation_config.json, model.safetensors (sharded above ``max_shard_size``) and
    the tokenizer files of ``tokenizer_dir``. ``dtype``: ``float32`` or ``bfloat16`` (weights and config).
    Everything is written into a temporary sibling directory, checked with ``verify`` on
    ``verify_tokens (B, T)`` when given, and renamed to ``out_dir`` last: a failure leaves nothing.
    Returns ``out_dir``. Raises ``ValueError`` for a model that cannot fold (naming its scales), a bad
    format or dtype, a tokenizer larger than the model's vocabulary; ``FileExistsError`` if ``out_dir``
    is not empty; ``FileNotFoundError`` without tokenizer.json; ``VerifyError`` on a verify mismatch.
    """
    plan = plan_export(model, out_dir, tokenizer_dir, format, dtype)
    return write_export(plan, max_shard_size, model, verify_tokens)


@dataclass
class ExportPlan:
    """Everything ``write_export`` writes, computed (and validated) before anything touches the disk."""

    out: Path
    fmt: str
    config: object  # a transformers PretrainedConfig
    state: dict[str, Tensor]  # Hugging Face name -> tensor
    tokenizer_dir: Path | None
    specials: Specials | None = None  # what the exported tokenizer declares (with tokenizer_dir)


def plan_export(model: Transformer, out_dir: str | Path, tokenizer_dir: str | Path | None = None,
                format: str = "auto", dtype: str = "float32") -> ExportPlan:
    """Validate and fold: the ``ExportPlan`` of ``export_model``; writes nothing. Raises as ``export_model``."""
    if dtype not in DTYPES:
        raise ValueError(f"unknown --dtype {dtype!r}; use float32 or bfloat16")
    if format not in ("auto", REMOTE_FORMAT, *FORMATS):
        raise ValueError(f"unknown export format {format!r}; use auto, {REMOTE_FORMAT} or one of: {', '.join(FORMATS)}")
    out = check_out_dir(out_dir)
    fmt = format
    if format == "auto":  # a plain family when one holds the model, else the custom architecture
        try:
            fmt = REMOTE_FORMAT if unfoldable_scales(model) else choose_format(model.cfg)
        except ValueError:
            fmt = REMOTE_FORMAT
    folded = None
    if fmt != REMOTE_FORMAT:
        choose_format(model.cfg, fmt)  # ValueError when this family cannot hold the model
        try:
            folded = fold_scales(model)  # ValueError naming the unfoldable scales
        except ValueError as e:
            raise ValueError(f"{e}. Export it with --format auto or {REMOTE_FORMAT}: the custom architecture "
                             f"that transformers loads with trust_remote_code=True") from None
    specials = None
    if tokenizer_dir is not None:
        specials = tokenizer_specials(tokenizer_dir)
        if specials.n_tokens > model.cfg.vocab_size:
            raise ValueError(f"the tokenizer in {tokenizer_dir} has {specials.n_tokens} tokens but the model only "
                             f"{model.cfg.vocab_size}; pass the tokenizer the model was trained with")
    ids = [(t[1] if t else None) for t in (specials.bos, specials.eos, specials.pad)] if specials else [None] * 3
    if folded is None:
        config = remote_config(model.cfg, model.scfg, dtype, *ids)
        state = remote_state_dict(model, DTYPES[dtype])
    else:
        config = hf_config(folded.cfg, fmt, dtype, ids[0], ids[1])
        config.pad_token_id = ids[2]
        state = hf_state_dict(folded, fmt, DTYPES[dtype])
    return ExportPlan(out, fmt, config, state, Path(tokenizer_dir) if tokenizer_dir is not None else None, specials)


def write_export(plan: ExportPlan, max_shard_size: int | str = "5GB", model: Transformer | None = None,
                 verify_tokens: Tensor | None = None) -> Path:
    """Write ``plan`` into a temporary sibling of ``plan.out``, ``verify`` it against ``model`` on
    ``verify_tokens`` when given, then rename it to ``plan.out``; on any failure nothing is left. A folder
    that cannot be written (read-only, no permission, a full disk) is ``rundir.RunDirError``, one line."""
    from scalevec.training.rundir import RunDirError

    out = plan.out
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    except OSError as e:  # the errno text alone names neither the folder nor the fix
        raise RunDirError(f"cannot write {out.parent}, the folder of --out {out}: {e.strerror or e}; choose a writable "
                          f"--out") from None
    try:
        _write_all(tmp, plan.config, plan.state, plan.tokenizer_dir, max_shard_size, plan.specials)
        if plan.fmt == REMOTE_FORMAT:
            copy_remote_code(tmp)
            _make_ordinary(tmp)
        if verify_tokens is not None:
            verify(tmp, model, verify_tokens)
        check_out_dir(out)
        if out.exists():
            out.rmdir()  # empty (checked): rename needs the name free
        os.rename(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return out


def _write_all(out: Path, config, state: dict[str, Tensor], tokenizer_dir: str | Path | None,
               max_shard_size: int | str, specials: Specials | None = None) -> None:
    from transformers import GenerationConfig

    config.save_pretrained(out)
    GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
                     pad_token_id=config.pad_token_id).save_pretrained(out)
    write_safetensors(state, out, max_shard_size)
    if tokenizer_dir is not None:
        write_tokenizer(Path(tokenizer_dir), out, specials or tokenizer_specials(tokenizer_dir),
                        config.max_position_embeddings)
    _make_ordinary(out)


def _make_ordinary(out: Path) -> None:
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(out, 0o777 & ~umask)  # mkdtemp made it private; the export is an ordinary directory
    for f in out.iterdir():
        os.chmod(f, 0o666 & ~umask)


# --------------------------------------------------------------------------------------------- verify


def shifted_targets(tokens: Tensor) -> Tensor:
    """Next-token targets ``(B, T)`` for ``tokens (B, T)``: ``tokens[:, 1:]``, and -100 at the last position."""
    targets = torch.full_like(tokens, -100)
    targets[:, :-1] = tokens[:, 1:]
    return targets


def verify(out_dir: str | Path, model: Transformer, tokens: Tensor, atol: float | None = None) -> dict:
    """Load ``out_dir`` with ``transformers.AutoModelForCausalLM`` (fp32) and compare it with ``model``.

    ``tokens``: ``(B, T)`` token ids, ``T <= max_seq_len``. Checks that loading reports no missing,
    unexpected or mismatched keys, that the logits ``(B, T, V)`` agree within ``atol`` (max abs diff;
    default ``VERIFY_ATOL``, ``VERIFY_ATOL_REMOTE`` for the custom architecture, which is loaded with
    ``trust_remote_code=True``), that the mean next-token loss agrees within ``atol`` nats (transformers
    with ``labels=tokens``, which it shifts; ours from ``forward(tokens, targets)``), and that greedy
    decoding from the first tokens of ``tokens[0]`` gives the same ids (transformers' ``generate`` with
    its KV cache vs our uncached argmax). A bfloat16 export of a plain family is compared with our
    folded model rounded to bfloat16 (the weights it holds), computed in fp32; a bfloat16 custom export
    (whose folded weights have no scalevec counterpart) only with a loss tolerance of 0.05 nats. Prints
    the figures and returns ``{"max_abs_logit_diff", "loss_ours", "loss_hf", "greedy_equal",
    "loading_info"}``. Raises ``VerifyError`` on a mismatch.
    """
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from scalevec.hf.sampling import sample

    hf_logging.disable_progress_bar()
    out_dir = Path(out_dir)
    config = json.loads((out_dir / "config.json").read_text())
    remote = "auto_map" in config
    atol = atol if atol is not None else (VERIFY_ATOL_REMOTE if remote else VERIFY_ATOL)
    hf, info = AutoModelForCausalLM.from_pretrained(str(out_dir), dtype=torch.float32, output_loading_info=True,
                                                    trust_remote_code=remote)
    hf.eval()
    p0 = next(model.parameters())
    ref = model if (p0.dtype, p0.device.type) == (torch.float32, "cpu") else copy.deepcopy(model).float().cpu()
    exported_dtype = config.get("dtype", "float32")
    logit_atol = atol
    if exported_dtype != "float32" and remote:
        atol, logit_atol = 0.05, float("inf")
    elif exported_dtype != "float32":
        ref = fold_scales(ref)
        with torch.no_grad():
            for p in ref.parameters():
                p.copy_(p.to(DTYPES[exported_dtype]).float())
    ref.eval()
    tokens = tokens.long().cpu()
    with torch.no_grad():
        ours = ref(tokens)
        ce, n, _ = ref(tokens, shifted_targets(tokens))
        result = hf(input_ids=tokens, labels=tokens)
        prompt = tokens[:1, :min(4, tokens.shape[1])]
        n_new = min(16, model.cfg.max_seq_len - prompt.shape[1])
        eos = config.get("eos_token_id")
        greedy_ours = sample(ref, prompt[0].tolist(), n_new, temperature=0.0, eos_id=eos)
        greedy_hf = hf.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=n_new,
                                do_sample=False, eos_token_id=eos, pad_token_id=config.get("pad_token_id", eos))
        greedy_hf = greedy_hf[0, prompt.shape[1]:].tolist()
    diff = (ours - result.logits).abs().max().item()
    loss_ours, loss_hf = (ce / n).item(), result.loss.item()
    greedy_equal = greedy_ours == greedy_hf
    bad_keys = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
    how = " (custom code, trust_remote_code=True)" if remote else ""
    print(f"verify: {type(hf).__name__} loaded by transformers{how}, {tokens.shape[0]}x{tokens.shape[1]} tokens")
    print(f"  loading: missing/unexpected/mismatched keys: {bad_keys or 'none'}")
    print(f"  logits: max |ours - transformers| = {diff:.3e} (tolerance {logit_atol:g})")
    print(f"  loss:   ours {loss_ours:.6f}  transformers {loss_hf:.6f} nats/token (|diff| "
          f"{abs(loss_ours - loss_hf):.3e})")
    print(f"  greedy: {len(greedy_ours)} ids from a {prompt.shape[1]}-token prompt "
          f"{'equal' if greedy_equal else 'DIFFER'} (transformers generate() with its KV cache)")
    problems = []
    if bad_keys:
        problems.append(f"loading reported {bad_keys}")
    if not diff <= logit_atol:
        problems.append(f"logits differ by {diff:.3e} > {logit_atol:g}")
    if not abs(loss_ours - loss_hf) <= atol:
        problems.append(f"losses differ: ours {loss_ours:.6f}, transformers {loss_hf:.6f}")
    if not greedy_equal and exported_dtype == "float32":
        problems.append(f"greedy ids differ: ours {greedy_ours}, transformers {greedy_hf}")
    if problems:
        raise VerifyError("verify failed: " + "; ".join(problems))
    print("  verify: OK")
    return {"max_abs_logit_diff": diff, "loss_ours": loss_ours, "loss_hf": loss_hf, "greedy_equal": greedy_equal,
            "loading_info": info}


# --------------------------------------------------------------------------------------------- command


def verify_tokens(cfg, n_seq: int = 4) -> tuple[Tensor, str]:
    """``(tokens (n_seq, T), where they come from)`` for ``verify``: the first held-out sequences of the
    run's validation split (DESIGN.md §8), or, when its data cannot be prepared here, seeded random ids."""
    seq_len = min(cfg.train.seq_len, cfg.model.max_seq_len)
    try:
        from scalevec.data.corpus import prepare_data
        from scalevec.data.sampler import val_batches

        batches, _ = val_batches(prepare_data(cfg.data), seq_len, cfg.data.val_tokens, n_seq)
        x = batches[0][0].long()
        if int(x.max()) >= cfg.model.vocab_size:
            raise ValueError(f"its token ids exceed the model's vocabulary of {cfg.model.vocab_size}")
        return x, f"{x.shape[0]}x{x.shape[1]} validation tokens of {cfg.data.source}"
    except (ImportError, OSError, ValueError) as e:
        g = torch.Generator().manual_seed(0)
        x = torch.randint(0, cfg.model.vocab_size, (n_seq, seq_len), generator=g)
        return x, f"{n_seq}x{seq_len} random tokens (the run's validation data is not available here: {e})"


def export_run(run_dir: str | Path, out_dir: str | Path, format: str = "auto", dtype: str = "float32",
               check: bool = False, max_shard_size: int | str = "5GB") -> Path:
    """Export the final checkpoint of run ``run_dir`` (``rundir.load_model``: verified against its
    manifest, dead models refused) with its tokenizer; with ``check``, verify on held-out tokens before the
    result appears at ``out_dir``. Raises as ``export_model``, and ``rundir.RunDirError`` (one line, exit 2)
    when ``run_dir`` is not a run or has no intact, healthy checkpoint."""
    from scalevec.training.rundir import load_model

    check_out_dir(out_dir)
    cfg, model, _ = load_model(run_dir)
    run_dir = Path(run_dir)
    tok_dir = run_dir / "tokenizer"
    plan = plan_export(model, out_dir, tok_dir if tok_dir.is_dir() else None, format, dtype)
    if not (run_dir / "DONE").exists():
        print(f"note: {run_dir} has no DONE marker; exporting its latest checkpoint")
    if plan.tokenizer_dir is None:
        print(f"note: {run_dir} has no tokenizer/ directory; the export holds no tokenizer")
    tokens = None
    if check:
        tokens, source = verify_tokens(cfg)
        print(f"verify tokens: {source}")
    out = write_export(plan, max_shard_size, model, tokens)
    if plan.fmt == REMOTE_FORMAT:
        kept = ", ".join(unfoldable_scales(model)[:4]) or "none"
        print(f"exported {run_dir} (strategy {cfg.strategy}, foldable scales folded; kept: {kept}...) as the custom "
              f"architecture ScalevecForCausalLM ({dtype}) to {out}; load it with trust_remote_code=True")
    else:
        print(f"exported {run_dir} (strategy {cfg.strategy}, scales folded) as {FORMATS[plan.fmt]} ({dtype}) to {out}")
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", metavar="RUN_DIR", help="a scalevec run directory (its final checkpoint is exported)")
    p.add_argument("--out", required=True, help="the new Hugging Face directory (must not exist or be empty)")
    p.add_argument("--format", default="auto", choices=["auto", *FORMATS, REMOTE_FORMAT],
                   help="auto: llama, qwen3 (QK-norm), mixtral (MoE), qwen3_moe (MoE + QK-norm), or for what cannot "
                        "fold (DNP, unified, peri) scalevec: custom code loaded with trust_remote_code=True")
    p.add_argument("--dtype", default="float32", choices=list(DTYPES), help="weight dtype (default float32)")
    p.add_argument("--max-shard-size", default="5GB", help="shard model.safetensors above this size (default 5GB)")
    p.add_argument("--verify", action="store_true",
                   help="load the result with transformers and compare logits, loss and greedy ids with ours "
                        "before finishing")


def run(args: argparse.Namespace) -> int:
    try:
        export_run(args.run_dir, args.out, args.format, args.dtype, args.verify, args.max_shard_size)
    except VerifyError as e:
        print(f"scalevec export: {e}; nothing was written", file=sys.stderr)
        return 1
    return 0

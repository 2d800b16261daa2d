"""``scalevec export``: a run as a Hugging Face checkpoint: choose the format, fold, rename, write (DESIGN.md §10).

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
(``remote_tensors``).

Every format's names come from the one name map, ``hf_format/names.py`` (``rename``). Two jobs live
elsewhere: the tokenizer files with their declared special tokens (``tokenizer_files.py``) and
``--verify``, which loads the result with plain transformers and compares logits, loss and greedy ids
with ours (``verify.py``). Sampling text lives in ``generate.py``.

This module needs the optional dependency ``transformers`` (``pip install 'scalevec[hf]'``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from scalevec.config import ModelConfig
from scalevec.hf.tokenizer_files import Specials, tokenizer_specials, write_tokenizer
from scalevec.hf.verify import VerifyError, verify, verify_tokens
from scalevec.hf_format.names import (
    DATA_SOURCE,
    FORMATS,
    ONES_NAMES,
    REMOTE_FORMAT,
    TRAIN_SEQ_LEN,
    name_map,
    template_of,
)
from scalevec.model.fold import fold_scales, unfoldable_scales
from scalevec.model.scales import gamma_of, scale_plan
from scalevec.model.transformer import Transformer
from scalevec.outpath import temporary_folder

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
REMOTE_FILES = ("configuration_scalevec.py", "modeling_scalevec.py")
REMOTE_AUTO_MAP = {"AutoConfig": "configuration_scalevec.ScalevecConfig",
                   "AutoModelForCausalLM": "modeling_scalevec.ScalevecForCausalLM"}

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


def rename(tensors: dict[str, Tensor], fmt: str) -> dict[str, Tensor]:
    """``tensors`` (under our names) under the names of format ``fmt`` (``names.name_map``, the one name map); an
    expert bank ``(E, d_out, d_in)`` is split into E tensors where the family holds one per expert (``"{j}"``).
    Raises ``ValueError`` naming a tensor that has no name in ``fmt`` (a model this format cannot hold)."""
    names = name_map(fmt)
    arch = FORMATS.get(fmt, "ScalevecForCausalLM")
    out: dict[str, Tensor] = {}
    for key, t in tensors.items():
        template, i = template_of(key)
        if template not in names:
            raise ValueError(f"parameter {key} has no {arch} counterpart; this model cannot export as {fmt}")
        target = names[template]
        if "{j}" in target:
            for j in range(t.shape[0]):
                out[target.format(i=i, j=j)] = t[j].clone()  # its own storage: safetensors refuses shared memory
        else:
            out[target.format(i=i)] = t
    return out


def hf_state_dict(folded: Transformer, fmt: str, dtype: torch.dtype = torch.float32) -> dict[str, Tensor]:
    """The checkpoint tensors of a folded model under Hugging Face names, cast to ``dtype``.

    ``folded`` comes from ``fold_scales`` (no Input-Norm scales left). Expert banks ``(E, d_out, d_in)``
    are split per expert. Input-norm weights are written as exactly 1.0 (their γ lives in the weights).
    Raises ``ValueError`` if a parameter has no Hugging Face name (an unsupported model).
    """
    ours = {key: t.detach().to(device="cpu", dtype=dtype) for key, t in folded.state_dict().items()}
    out = {key: t.contiguous() for key, t in rename(ours, fmt).items()}
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
    ``SafetensorError`` is no ``OSError``: ``save_load.write_error``), so ``scalevec export`` says it in one line."""
    from huggingface_hub import split_torch_state_dict_into_shards
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    from scalevec.training.checkpoint.save_load import write_error

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


def _swiglu_tensors(name: dict, gate, up, down, shared: Tensor | None) -> dict[str, Tensor]:
    """Folded gate, up and down weights (and DNP's gate scale) of one SwiGLU, dense or an expert bank, under our
    names (``name``: module -> its name in the model): ``diag(s) W diag(γ_shared γ)`` where s folds; DNP's s on
    ``up`` (it multiplies the SiLU product, which W_down reads) folds into W_down's columns, beside W_down's own
    vectors; DNP's s on ``gate`` feeds SiLU and is kept, as ``<gate>.out_scale.weight``."""
    s_up = up.out_scale() if up.out_norm else None  # (d_ff,) or (E, d_expert)
    out = {f"{name[gate]}.weight": gate.folded_weight(shared), f"{name[up]}.weight": up.folded_weight(shared),
           f"{name[down]}.weight": down.folded_weight(s_up)}
    if gate.out_norm:
        out[f"{name[gate]}.out_scale.weight"] = gate.out_scale()
    return out


def remote_tensors(model: Transformer) -> dict[str, Tensor]:
    """The tensors of ``modeling_scalevec.ScalevecForCausalLM`` for ``model`` under our names (the keys of
    ``names.REMOTE_NAMES``), every foldable scale folded (DESIGN.md §1, §4): the shared and branch γ of every
    Input-Norm and the foldable output scales s go into the linear weights; kept are DNP's output normalization
    (no tensor, a config switch) with its gate scale, the peri output norms' γ and QK-norm's γ, each as
    ``<its module>.weight``. Our names come from ``model.named_modules()``, so a module renamed in the model
    shows here as a name ``REMOTE_NAMES`` lacks. Not detached: autograd reaches every parameter from them."""
    cfg = model.cfg
    name = {m: n for n, m in model.named_modules()}
    out: dict[str, Tensor] = {f"{name[model.embed]}.weight": model.embed.weight}
    for layer in model.layers:
        attn = layer.attn
        # q, k, v: no DNP on attention, so the Input-Norm folds whole (the fold protocol of fold.py)
        out.update({f"{name[attn.proj]}.{k}": w for k, w in attn.proj.folded_state().items()})
        out[f"{name[attn.o]}.weight"] = attn.o.folded_weight()
        if cfg.qk_norm:
            for norm in (attn.q_norm, attn.k_norm):
                out[f"{name[norm]}.scale.weight"] = _output_gamma(norm, cfg.head_dim)
        if cfg.layout == "peri":
            for norm in (layer.attn_out, layer.mlp_out):
                out[f"{name[norm]}.scale.weight"] = _output_gamma(norm, cfg.d_model)
        mlp = layer.mlp
        if hasattr(mlp, "experts"):  # moe.MoE: its own Input-Norm γ
            shared = gamma_of(mlp.scale)
            out[f"{name[mlp.router]}.weight"] = mlp.router.folded_weight(shared)
            for ex in (mlp.experts, mlp.shared_experts):
                if ex is not None:
                    out.update(_swiglu_tensors(name, ex.gate, ex.up, ex.down, shared))
        else:
            br = mlp.proj.branches
            out.update(_swiglu_tensors(name, br["gate"], br["up"], mlp.down, gamma_of(mlp.proj.scale)))
    out.update({f"{name[model.head]}.{k}": w for k, w in model.head.folded_state().items()})
    return out


def remote_state_dict(model: Transformer, dtype: torch.dtype = torch.float32) -> dict[str, Tensor]:
    """The checkpoint tensors of ``modeling_scalevec.ScalevecForCausalLM`` for ``model``: ``remote_tensors``
    renamed with ``names.REMOTE_NAMES`` (the one name map), detached, on the CPU, cast to ``dtype``. Tied
    embeddings are untied. Raises ``ValueError`` naming a tensor the name map lacks (a bug)."""
    # clone: an untouched weight may share memory with another (tied embeddings), which safetensors refuses
    return {k: t.detach().to(device="cpu", dtype=dtype).clone()
            for k, t in rename(remote_tensors(model), REMOTE_FORMAT).items()}


def copy_remote_code(out_dir: Path) -> None:
    """Copy ``configuration_scalevec.py`` and ``modeling_scalevec.py`` (package data) into ``out_dir``,
    byte for byte: ``generate``/``eval`` trust an export's code only when its sha256 is the shipped
    file's (``generate.check_hf_dir``), and a text copy may rewrite line endings."""
    from importlib import resources

    src = resources.files("scalevec.hf.remote")
    for name in REMOTE_FILES:
        (out_dir / name).write_bytes(src.joinpath(name).read_bytes())


# --------------------------------------------------------------------------------------------- export


def refuse_link(out: Path) -> None:
    """Refuse an export's ``--out`` that is a symbolic link, whatever it points to: the export is renamed into
    place, which cannot go through a link (a raw errno otherwise). ``FileExistsError`` naming the link, where it
    leads (``outpath.link_words``) and the fix; ``export`` and ``convert --format hf`` check it before any work."""
    from scalevec.outpath import link_words

    if out.is_symlink():
        raise FileExistsError(f"--out {out} is {link_words(out)}; an export is never written through a link: pass "
                              f"the real directory it points to, or a new --out")


def check_out_dir(out_dir: str | Path) -> Path:
    """``out_dir`` as a Path, if writing there overwrites nothing. Raises ``FileNotFoundError`` for a symbolic link
    that leads nowhere or loops, as ``out_dir`` or a folder above it, ``NotADirectoryError`` for one under a file
    (``outpath.check_out_path``), ``FileExistsError`` for any other link as ``out_dir`` (``refuse_link``) and for an
    existing file or non-empty directory."""
    from scalevec.outpath import check_out_path

    out = Path(out_dir)
    check_out_path(out)
    refuse_link(out)
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
    stack = ExitStack()
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        # .NAME.tmp-PID-HEX: removed on SIGTERM or Ctrl-C, or by the next export once its process is gone
        tmp = stack.enter_context(temporary_folder(out, "export"))
    except OSError as e:  # the errno text alone names neither the folder nor the fix
        raise RunDirError(f"cannot write {out.parent}, the folder of --out {out}: {e.strerror or e}; choose a writable "
                          f"--out") from None
    with stack:
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


# --------------------------------------------------------------------------------------------- command


def check_shard_size(max_shard_size: int | str) -> None:
    """Refuse a ``--max-shard-size`` that huggingface_hub cannot read (it would fail after the model loaded,
    naming a unit, not the flag) or that is not positive. ``ValueError`` naming the flag and the fix."""
    from huggingface_hub import split_torch_state_dict_into_shards

    text = str(max_shard_size).strip()
    ok = text.strip("0") != "" and not text.startswith("-")  # huggingface_hub takes 0 and -5GB
    try:
        split_torch_state_dict_into_shards({}, max_shard_size=int(text) if text.isdigit() else text)
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"--max-shard-size {max_shard_size!r} is not a size; use bytes or a number with KB, MB, "
                         f"GB or TB, like 5GB or 500MB")


def record_run(config, run_cfg) -> None:
    """Record in the export's config.json what it keeps of its run (``names.TRAIN_SEQ_LEN``, ``names.DATA_SOURCE``;
    transformers keeps unknown fields as they are): ``train.seq_len``, so that ``eval --text`` scores a run and its
    export on the same windows by default (``evaluation.default_seq_len``), and ``data.source``, so that
    ``convert`` can say when its run trains on another corpus (``init_from.corpus_note``)."""
    setattr(config, TRAIN_SEQ_LEN, int(run_cfg.train.seq_len))
    setattr(config, DATA_SOURCE, str(run_cfg.data.source))


def export_run(run_dir: str | Path, out_dir: str | Path, format: str = "auto", dtype: str = "float32",
               check: bool = False, max_shard_size: int | str = "5GB") -> Path:
    """Export the final checkpoint of run ``run_dir`` (``run_model.load_model``: verified against its
    manifest, dead models refused) with its tokenizer; with ``check``, verify on held-out tokens before the
    result appears at ``out_dir``. Raises as ``export_model``, and ``rundir.RunDirError`` (one line, exit 2)
    when ``run_dir`` is not a run or has no intact, healthy checkpoint."""
    from scalevec.training import rundir
    from scalevec.training.checkpoint.run_model import load_model

    check_shard_size(max_shard_size)
    check_out_dir(out_dir)
    cfg, model, _ = load_model(run_dir)
    run_dir = Path(run_dir)
    tok_dir = rundir.tokenizer_dir(run_dir)
    plan = plan_export(model, out_dir, tok_dir if tok_dir.is_dir() else None, format, dtype)
    record_run(plan.config, cfg)
    if not rundir.is_done(run_dir):
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
                   help="load the result with transformers and compare with ours before finishing: every logit "
                        "(within 1e-4, custom code 1e-5, times the largest |logit|), the loss and greedy ids; a "
                        "mismatch writes nothing and exits 1")


def run(args: argparse.Namespace) -> int:
    try:
        export_run(args.run_dir, args.out, args.format, args.dtype, args.verify, args.max_shard_size)
    except VerifyError as e:
        print(f"scalevec export: {e}; nothing was written", file=sys.stderr)
        return 1
    return 0

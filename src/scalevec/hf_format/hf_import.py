"""Start from existing weights: Hugging Face checkpoints and scalevec runs, into any strategy (DESIGN.md §1, §3, §10).

Every conversion goes through one strategy-independent *plain* form (``PlainWeights``): the linear
maps under our parameter names (which do not depend on the strategy) and one γ per normalization
site, as a Llama holds it::

    Hugging Face dir ──read_hf──┐                         ┌──load_plain──> model of any strategy
                                ├──> PlainWeights ────────┤
    scalevec model ──plain_from_model (folds)──┘          (shared γ -> each branch's γ, output scales 1,
                                                           magdir: β = rms(γ), α = γ / rms(γ); ER: b = log rms(γ))

Loading sets every scale so that the effective γ of each Input-Norm is the site's γ: a foldable
strategy then computes the same function as the source (to fp32 rounding; tests/test_hf_import.py).
DNP (``dnp``, ``unified``) normalizes the outputs of W_gate/W_up and so changes the function: the
trainer says so and logs the loss at step 0 before and after. The ``peri`` layout adds Output-Norms
that no plain model has: it is refused. Under strategy ``none`` the site's γ is folded into the
weights (exact up to rounding), except the QK-norm γ, which has no slot there.

Name maps: the matrices use ``names.name_map`` read backwards (one home per map: ``hf_format/names.py``); the
norm sites are ``names.NORM_SITES`` (export writes them as ones). Reading Hugging Face files needs only
``safetensors``; transformers only for a field that a config.json leaves to its family's default.
"""

from __future__ import annotations

import functools
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from scalevec.config import ModelConfig, MoEConfig, RopeScalingConfig
from scalevec.config.files import load_json
from scalevec.config.typed import Fields, short
from scalevec.hf_format.families import FAMILIES, IMPORTS
from scalevec.hf_format.names import FORMATS, HF_CONFIG, NORM_SITES, name_map
from scalevec.model.scales import NormLinear, OutputNorm, ScaleVector
from scalevec.model.transformer import Transformer

MATRIX_ROLES = ("matrix", "embedding", "lm_head", "router")


@dataclass
class PlainWeights:
    """The strategy-independent form of a pre-layout model (module docstring).

    ``matrices``: ``{our parameter name: tensor}`` for every matrix (embedding, q/k/v/o, gate/up/down,
    router, expert banks ``(E, d_out, d_in)``, LM head). ``norms``: ``{site: γ (d,)}`` for the sites of
    ``NORM_SITES`` (a missing site means γ = 1). ``cfg``: the model shape.
    """

    cfg: ModelConfig
    matrices: dict[str, Tensor]
    norms: dict[str, Tensor] = field(default_factory=dict)


# --------------------------------------------------------------------------------------------- Hugging Face


def is_hf_dir(path: str | Path) -> bool:
    """True when ``path`` looks like a Hugging Face model directory (``config.json`` with a ``model_type``; one
    that is no JSON object counts: empty, not UTF-8, too deep, so that ``read_config_json`` names the problem
    instead of "not a model directory")."""
    p = Path(path) / HF_CONFIG
    if not p.is_file():
        return False
    try:
        conf = read_config_json(path)
    except ValueError:
        return True
    except OSError:
        return False
    return "model_type" in conf


MAX_CONFIG_BYTES = 1 << 22  # a config.json is a few kB; 4 MB is far beyond any real one


def read_config_json(hf_dir: str | Path) -> dict:
    """The ``config.json`` of a Hugging Face model directory as a mapping: a regular file (a FIFO never hangs) of at
    most ``MAX_CONFIG_BYTES``, JSON, an object. The one reader of it for ``convert``, ``generate`` and ``eval``
    (``check_hf_config`` validates what it holds). Raises ``ValueError`` naming the file and the fix (a 200k-deep
    nesting is one line, never a ``RecursionError``); ``OSError`` for the rest."""
    p = Path(hf_dir) / HF_CONFIG
    conf = load_json(p, "config.json", FIX, MAX_CONFIG_BYTES)
    if not isinstance(conf, dict):
        raise ValueError(f"{p} is not a JSON object; fix config.json (or re-save the model with save_pretrained)")
    return conf


# config.json fields that every causal LM family here shares, with their rule (integers >= 1, finite numbers > 0)
_SHARED_INTS = ("hidden_size", "num_attention_heads", "num_key_value_heads", "num_hidden_layers", "vocab_size",
                "intermediate_size", "max_position_embeddings", "head_dim")
_SHARED_NUMBERS = ("rms_norm_eps", "initializer_range")


def check_hf_config(conf: dict) -> None:
    """Validate a ``config.json`` mapping (``read_config_json``) before transformers builds anything from it: the
    one validator for ``convert``, ``generate`` and ``eval``. A family scalevec exports (``FORMATS``) is read
    whole by ``model_config_from_hf`` and its size checked against this machine's memory (``check_size``); any
    other ``model_type`` (scalevec's custom architecture) has its shared sizes checked as integers >= 1,
    ``rms_norm_eps`` and ``initializer_range`` as finite numbers > 0, and its RoPE (``_rope``: a finite
    ``rope_theta`` > 0 and a known rope type). Raises ``ValueError`` naming the field."""
    fmt = _fields(conf).kind("model_type", str, like="llama")
    if fmt in FORMATS:
        check_size(model_config_from_hf(conf)[1])
        return
    fields = _fields(conf)
    for key in _SHARED_INTS:
        fields.int(key, None, least=1)
    for key in _SHARED_NUMBERS:
        fields.number(key, None, above=0)
    _rope(conf)


# the RoPE types scalevec's models compute: plain RoPE and Llama 3's frequency scaling
ROPE_TYPES = ("default", "llama3")


def _rope(conf: dict) -> tuple[float, str, dict]:
    """``(rope_theta, rope_type, the merged rope fields)`` of a config.json (transformers 4 ``rope_scaling`` and 5
    ``rope_parameters``, ``rope_theta`` also at the top). Raises ``ValueError`` for a theta that is not a finite
    number > 0 (NaN included) and for a rope type outside ``ROPE_TYPES``, given as ``rope_type`` or ``type``."""
    fields = _fields(conf)
    rope = dict(fields.kind("rope_scaling", dict, {}))
    rope.update(fields.kind("rope_parameters", dict, {}))
    theta = _fields(rope).number("rope_theta", fields.number("rope_theta", 10000.0, above=0), above=0)
    given = [rope[k] for k in ("rope_type", "type") if rope.get(k) is not None]
    for t in given:  # checked before the set below: a list (`"rope_type": ["default"]`) is unhashable
        if not isinstance(t, str) or t not in ROPE_TYPES:
            raise ValueError(f"config.json has rope type {short(t)}, which scalevec does not compute; supported: "
                             f"{', '.join(ROPE_TYPES)}")
    types = set(given) or {"default"}
    if len(types) > 1:
        raise ValueError(f"config.json names two rope types ({', '.join(sorted(types))}); keep one")
    return theta, types.pop(), rope


FIX = "fix config.json (or re-save the model with save_pretrained)"


def _fields(conf: dict) -> Fields:
    """Typed reads of a config.json mapping (or its rope section): a null is an absent field, as transformers
    writes unset ones; an error names ``config.json: KEY`` and the fix."""
    return Fields(conf, "config.json: ", fix=FIX, null_is_absent=True)


def _check_window(conf: dict, max_pos: int) -> None:
    """Raise ``ValueError`` where config.json's attention sees only a sliding window of the last W tokens that is
    shorter than the context (``max_position_embeddings``): scalevec's model attends to every earlier token. A window
    of at least the context (or none; or Qwen's ``use_sliding_window=false``, which switches it off) changes nothing:
    a query at position t < max_pos attends to key t' where t - t' < W, every earlier one."""
    fields = _fields(conf)
    window = fields.int("sliding_window", None, least=1) if fields.flag("use_sliding_window", True) else None
    if window is None:
        return
    if window < max_pos:
        raise ValueError(f"config.json has sliding_window={window} < max_position_embeddings={max_pos}: attention "
                         f"sees only the last {window} tokens, which scalevec's model (full causal attention) does not "
                         f"compute; use the drop-in scalevec.apply_strategy(model, STRATEGY) on the Hugging Face "
                         f"model instead")


@functools.cache
def _transformers_config(model_type: str, hidden_size: int, num_attention_heads: int):
    """The config transformers builds for ``model_type`` with these sizes and every other field at its default
    (``AutoConfig.for_model``), or None when transformers is not installed. Cached: built once per shape."""
    try:
        from transformers import AutoConfig
    except ImportError:
        return None
    return AutoConfig.for_model(model_type, hidden_size=hidden_size, num_attention_heads=num_attention_heads)


def transformers_default(model_type: str, key: str, hidden_size: int, num_attention_heads: int) -> Any:
    """The value transformers gives ``key`` when a ``config.json`` of ``model_type`` (with these sizes) leaves it
    out: that of the family's own config class, built as ``AutoConfig`` builds it. The defaults differ per family
    (``max_position_embeddings``: LlamaConfig 2048, Qwen3Config 32768, MistralConfig and MixtralConfig 131072;
    ``rms_norm_eps``: MixtralConfig 1e-5, the others 1e-6; ``rope_theta``: MixtralConfig 1e6, the others 1e4;
    ``num_key_value_heads``: MistralConfig 8, LlamaConfig the attention heads; ``head_dim``: Qwen3Config 128,
    the others hidden_size / heads), so one default of ours would build another model than transformers builds
    from the same file. ``rope_theta`` is read from the config's ``rope_parameters``; None where the class has no
    such field (``head_dim`` of Mixtral: d_model / heads). Raises ``ValueError`` naming the key and the fix when
    transformers is not installed (the import reads only safetensors otherwise)."""
    cfg = _transformers_config(model_type, hidden_size, num_attention_heads)
    if cfg is None:
        raise ValueError(f"config.json has no {key}, whose default is that of transformers' {model_type} config "
                         f"class; write {key} in config.json, or install transformers (pip install "
                         f"'scalevec[hf]')")
    if key == "rope_theta":
        return cfg.rope_parameters["rope_theta"]
    return getattr(cfg, key, None)


def _moe_config(conf: dict, fam) -> MoEConfig:
    """The ``MoEConfig`` of an MoE family's config.json, read at the keys of its record (``Family.moe_keys``).
    Raises ``ValueError`` for top-k weights that are not renormalized and for dense layers other than the first k."""
    keys, fields = fam.moe_keys, _fields(conf)
    renormalize = keys.get("renormalize")
    if renormalize is not None and not fields.flag(renormalize, False):
        raise ValueError(f"config.json has {renormalize}=false; scalevec's router renormalizes the top-k weights "
                         f"(Mixtral convention), so only {renormalize}=true models convert exactly")
    dense = []
    if "dense_layers" in keys:
        dense = sorted(fields.ints(keys["dense_layers"], [], least=0, rule="a list of layer indices", like="[0, 1]"))
    step = fields.int(keys["sparse_step"], 1, least=1) if "sparse_step" in keys else 1
    if step != 1 or dense != list(range(len(dense))):
        raise ValueError(f"config.json has {keys['sparse_step']}={step} / {keys['dense_layers']}={dense}; "
                         f"scalevec's dense MoE layers are the first k (moe.first_dense)")
    n_experts = next((k for k in keys["n_experts"].split("|") if k in conf), keys["n_experts"].split("|")[0])
    return MoEConfig(n_experts=fields.int(n_experts, least=1), top_k=fields.int("num_experts_per_tok", least=1),
                     d_expert=fields.int(keys["d_expert"], least=1),
                     lb_coef=fields.number("router_aux_loss_coef", 0.01, least=0), first_dense=len(dense))


def model_config_from_hf(conf: dict) -> tuple[str, ModelConfig]:
    """``(family, ModelConfig)`` of a transformers ``config.json`` dict of a family scalevec's own model imports
    (``families.IMPORTS``: Llama, Mistral, Qwen3, Mixtral, Qwen3-MoE), read through the family's record
    (``families.py``: QK-norm, the MoE routing's config keys).

    Reads sizes, GQA heads, an explicit ``head_dim``, ``rope_theta`` and Llama 3 rope scaling (transformers
    4 ``rope_scaling`` or 5 ``rope_parameters``), ``rms_norm_eps``, tied embeddings, QK-norm and the MoE routing.
    Raises ``ValueError`` for a family scalevec does not import (``Family.import_refusal``: what its model lacks,
    the drop-in ``apply_strategy`` instead) and naming a feature our model does not compute (biases, a sliding
    window shorter than the context, another activation or rope type, un-renormalized top-k, interleaved dense
    layers).
    """
    if not isinstance(conf, dict):
        raise ValueError("config.json is not a JSON object; fix config.json (or re-save the model with "
                         "save_pretrained)")
    fmt = conf.get("model_type")
    fam = FAMILIES.get(fmt) if isinstance(fmt, str) else None
    if fam is None:
        raise ValueError(f"model_type {fmt!r} is not supported for --init-from; supported: {', '.join(IMPORTS)}")
    if fam.import_refusal() is not None:
        raise ValueError(fam.import_refusal())
    for key, bad in (("hidden_act", lambda v: v not in (None, "silu")), ("attention_bias", bool), ("mlp_bias", bool)):
        if key in conf and bad(conf[key]):
            raise ValueError(f"config.json has {key}={conf[key]!r}, which scalevec's model does not compute "
                             f"(SwiGLU, no biases, full causal attention)")
    theta, rope_type, rope = _rope(conf)
    if rope.get("partial_rotary_factor", conf.get("partial_rotary_factor", 1.0)) != 1.0:
        raise ValueError("config.json has partial_rotary_factor != 1; scalevec rotates the whole head")
    fields, rope_fields = _fields(conf), _fields(rope)
    d, heads = fields.int("hidden_size", least=1), fields.int("num_attention_heads", least=1)

    def absent(key: str) -> Any:  # a field config.json leaves out: what transformers builds from the same file
        return transformers_default(fmt, key, d, heads)

    max_pos = fields.int("max_position_embeddings", None, least=1) or absent("max_position_embeddings")
    if conf.get("rope_theta") is None and rope.get("rope_theta") is None:
        theta = absent("rope_theta")
    _check_window(conf, max_pos)
    scaling = None
    if rope_type == "llama3":
        scaling = RopeScalingConfig(
            factor=rope_fields.number("factor", above=0),
            low_freq_factor=rope_fields.number("low_freq_factor", above=0),
            high_freq_factor=rope_fields.number("high_freq_factor", above=0),
            original_max_position_embeddings=rope_fields.int("original_max_position_embeddings", max_pos, least=1))
    # a null is what transformers reads as None: heads for the KV heads, hidden_size / heads for head_dim
    kv_heads = fields.int("num_key_value_heads", None, least=1)
    if kv_heads is None:
        kv_heads = (absent("num_key_value_heads") if "num_key_value_heads" not in conf else None) or heads
    head_dim = fields.int("head_dim", None, least=1)
    if head_dim is None and "head_dim" not in conf:
        head_dim = absent("head_dim")
    if head_dim is None and d % heads:
        raise ValueError(f"config.json has hidden_size={d}, which num_attention_heads={heads} does not divide, and "
                         f"no head_dim; fix config.json")
    if heads % kv_heads:
        given = "" if "num_key_value_heads" in conf else f" (transformers' {fmt} default: config.json leaves it out)"
        raise ValueError(f"config.json has num_attention_heads={heads}, not a multiple of num_key_value_heads="
                         f"{kv_heads}{given}; fix config.json")
    d_ff = fields.int("intermediate_size", least=1)
    moe = _moe_config(conf, fam) if fam.router is not None else None
    eps = fields.number("rms_norm_eps", None, above=0) or absent("rms_norm_eps")
    cfg = ModelConfig(
        d_model=d, n_layers=fields.int("num_hidden_layers", least=1), n_heads=heads, n_kv_heads=kv_heads,
        head_dim=None if head_dim in (None, d // heads) and d % heads == 0 else head_dim,
        d_ff=d_ff, vocab_size=fields.int("vocab_size", least=1), max_seq_len=max_pos,
        rope_theta=theta, rope_scaling=scaling, norm_eps=eps,
        tie_embeddings=fields.flag("tie_word_embeddings", False), layout="pre",
        qk_norm=fam.qk_norm is not None, init_std=fields.number("initializer_range", 0.02, above=0), moe=moe)
    cfg.validate()
    return fmt, cfg


MAX_INDEX_BYTES = 1 << 26  # a safetensors index names each tensor once: a few MB for the largest models


def weight_files(hf_dir: str | Path) -> list[Path]:
    """The safetensors files of a Hugging Face directory: the shards named by ``model.safetensors.index.json``,
    else ``model.safetensors``. Only safetensors are ever read: a pickled ``pytorch_model.bin`` would run
    code when unpickled. Raises ``FileNotFoundError`` when the directory holds neither (or a shard is
    missing) and ``ValueError`` for an unreadable index or a shard that lies outside the directory
    (``../x``, an absolute path, or a symlink pointing out: an index must not make scalevec read other files)."""
    d = Path(hf_dir)
    index = d / "model.safetensors.index.json"
    if index.is_file():
        fix = "re-save the model with save_pretrained(..., safe_serialization=True)"
        data = load_json(index, "safetensors index", fix, MAX_INDEX_BYTES)
        try:
            weight_map = data["weight_map"]
        except (KeyError, TypeError) as e:
            raise ValueError(f"{index} is not a safetensors index ({type(e).__name__}: "
                             f"{' '.join(str(e).split())[:200]}); {fix}") from None
        if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
            raise ValueError(f"{index} has no weight_map of tensor name -> shard file; re-save the model with "
                             f"save_pretrained(..., safe_serialization=True)")
        names = sorted(set(weight_map.values()))
    elif (d / "model.safetensors").is_file():
        names = ["model.safetensors"]
    else:
        raise FileNotFoundError(f"{d} has no model.safetensors (nor an index of shards); scalevec reads only "
                                f"safetensors, never a pickled pytorch_model.bin: save the model with "
                                f"save_pretrained(..., safe_serialization=True)")
    root = d.resolve()
    # The Hugging Face hub cache keeps a snapshot's files as symlinks into its repository's blobs/ folder
    # (models--ORG--NAME/snapshots/REV/x -> ../../blobs/HASH): those targets are the snapshot's own files.
    blobs = root.parent.parent / "blobs" if root.parent.name == "snapshots" else None
    files = []
    for name in names:
        f = d / name
        target = f.resolve()
        inside = target.is_relative_to(root) or (blobs is not None and target.parent == blobs
                                                 and os.path.normpath(name) == name and not Path(name).is_absolute()
                                                 and ".." not in Path(name).parts)
        if not inside:
            raise ValueError(f"{index if index.is_file() else d} names weight file {name!r}, which lies outside {d} "
                             f"(symlinks followed); copy the shard into the model directory and name it there")
        if not f.is_file():
            raise FileNotFoundError(f"{d} has no shard {name} (named by its model.safetensors.index.json); "
                                    f"copy the missing shard in or re-save the model")
        files.append(f)
    return files


def _not_safetensors(f: Path, e: Exception) -> str:
    return (f"{f} is not a readable safetensors file ({e}): truncated, or another format (a pickle?); "
            f"download it again or re-save the model with save_pretrained(..., safe_serialization=True)")


def tensor_shapes(files: list[Path]) -> dict[str, tuple[int, ...]]:
    """``{tensor name: shape}`` of safetensors ``files``, from their headers only (nothing is loaded).
    Raises ``ValueError`` for a file that is not safetensors or is truncated (safetensors checks that
    the header's offsets cover the file exactly)."""
    from safetensors import SafetensorError, safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as st:
                shapes.update({k: tuple(st.get_slice(k).get_shape()) for k in st.keys()})
        except SafetensorError as e:
            raise ValueError(_not_safetensors(f, e)) from None
    return shapes


def read_safetensors(hf_dir: str | Path) -> dict[str, Tensor]:
    """Every tensor of ``model.safetensors`` or of the shards named by ``model.safetensors.index.json``,
    as float32 on CPU. Raises as ``weight_files`` and ``ValueError`` for a file that is not safetensors."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    state: dict[str, Tensor] = {}
    for f in weight_files(hf_dir):
        try:
            state.update({k: v.float() for k, v in load_file(str(f)).items()})
        except SafetensorError as e:
            raise ValueError(_not_safetensors(f, e)) from None
    return state


def _is_moe_layer(cfg: ModelConfig, i: int) -> bool:
    return cfg.moe is not None and i >= cfg.moe.first_dense


def _layer_shapes(cfg: ModelConfig, moe: bool) -> dict[str, tuple[tuple[int, ...], int]]:
    """``{our name template or norm site: (shape of its Hugging Face tensor, how many)}`` of one layer;
    an expert bank counts one ``(d_out, d_in)`` tensor per expert, as checkpoints hold it."""
    d, hd = cfg.d_model, cfg.head_dim
    q, kv = cfg.n_heads * hd, cfg.n_kv_heads * hd
    p = "layers.{i}."
    out = {p + "attn.proj.branches.q.weight": ((q, d), 1), p + "attn.proj.branches.k.weight": ((kv, d), 1),
           p + "attn.proj.branches.v.weight": ((kv, d), 1), p + "attn.o.weight": ((d, q), 1),
           p + "attn": ((d,), 1), p + "mlp": ((d,), 1)}
    if cfg.qk_norm:
        out.update({p + "attn.q_norm": ((hd,), 1), p + "attn.k_norm": ((hd,), 1)})
    if moe:
        e, f = cfg.moe.n_experts, cfg.moe.d_expert
        out.update({p + "mlp.router.weight": ((e, d), 1), p + "mlp.experts.gate.weight": ((f, d), e),
                    p + "mlp.experts.up.weight": ((f, d), e), p + "mlp.experts.down.weight": ((d, f), e)})
    else:
        out.update({p + "mlp.proj.branches.gate.weight": ((cfg.d_ff, d), 1),
                    p + "mlp.proj.branches.up.weight": ((cfg.d_ff, d), 1), p + "mlp.down.weight": ((d, cfg.d_ff), 1)})
    return out


def param_count(cfg: ModelConfig) -> int:
    """The parameters of a Hugging Face checkpoint of shape ``cfg``, computed from the sizes alone (Python
    integers: a config.json with absurd sizes gives an absurd number, not an allocation)."""
    def layer(moe: bool) -> int:
        return sum(math.prod(shape) * n for shape, n in _layer_shapes(cfg, moe).values())

    n_moe = 0 if cfg.moe is None else cfg.n_layers - cfg.moe.first_dense
    embeddings = cfg.vocab_size * cfg.d_model * (1 if cfg.tie_embeddings else 2)
    return embeddings + cfg.d_model + (cfg.n_layers - n_moe) * layer(False) + (n_moe and n_moe * layer(True))


def machine_memory() -> int | None:
    """Bytes of physical memory, or None where the OS does not tell (the size check is then skipped)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def _sizes(cfg: ModelConfig) -> str:
    """The sizes of ``cfg`` under config.json's names, for error messages."""
    out = (f"hidden_size={cfg.d_model}, num_hidden_layers={cfg.n_layers}, num_attention_heads={cfg.n_heads}, "
           f"num_key_value_heads={cfg.n_kv_heads}, head_dim={cfg.head_dim}, intermediate_size={cfg.d_ff}, "
           f"vocab_size={cfg.vocab_size}")
    return out + (f", {cfg.moe.n_experts} experts of width {cfg.moe.d_expert}" if cfg.moe is not None else "")


def _approx(x: int) -> str:
    # an absurd config.json size makes an integer too large for a float
    return f"{x:.3g}" if x < 1e300 else f"1e{int(math.log10(x))}"


def check_size(cfg: ModelConfig, memory: int | None = None) -> None:
    """Raise ``ValueError`` when a model of shape ``cfg`` does not fit in ``memory`` bytes (default: this
    machine's) in float32, as ``read_safetensors`` holds it, before anything is read or allocated."""
    memory = machine_memory() if memory is None else memory
    n = param_count(cfg)
    if memory is not None and 4 * n > memory:
        raise ValueError(f"config.json describes {_approx(n)} parameters ({_approx(4 * n // 2**30)} GiB in float32; "
                         f"{_sizes(cfg)}), more than this machine's {memory / 2**30:.3g} GiB of memory; fix "
                         f"config.json or use a machine that can hold the model")


def _expected_tensors(fmt: str, cfg: ModelConfig):
    """``(Hugging Face name, shape, required)`` of every tensor a checkpoint of shape ``cfg`` holds, lazily
    (a config with many layers costs nothing until its tensors are looked up). A missing norm weight
    means γ = 1 and a tied model may omit ``lm_head.weight``: not required."""
    hf = {**name_map(fmt), **NORM_SITES}
    yield hf["embed.weight"], (cfg.vocab_size, cfg.d_model), True
    yield hf["head"], (cfg.d_model,), False
    yield hf["head.branches.lm_head.weight"], (cfg.vocab_size, cfg.d_model), not cfg.tie_embeddings
    for i in range(cfg.n_layers):
        for ours, (shape, count) in _layer_shapes(cfg, _is_moe_layer(cfg, i)).items():
            for j in range(count):
                yield hf[ours].format(i=i, j=j), shape, ours not in NORM_SITES


def check_shapes(fmt: str, cfg: ModelConfig, shapes: dict[str, tuple[int, ...]]) -> None:
    """Raise ``ValueError`` unless the tensors ``shapes`` (``tensor_shapes``) are those of a ``fmt``
    checkpoint of shape ``cfg``: the layer count, every required tensor and its shape, and no tensor of
    the family's names beyond what the sizes account for (unknown names are ``plain_from_hf_state``'s).
    The work is bounded by the number of tensors: the first one missing stops the check."""
    layer = re.compile(re.escape(FAMILIES[fmt].layers) + r"\.(\d+)\.")
    layers = {int(m.group(1)) for k in shapes if (m := layer.match(k))}
    found = max(layers) + 1 if layers else 0
    if found != cfg.n_layers:
        raise ValueError(f"config.json says num_hidden_layers={cfg.n_layers} but the checkpoint's tensors hold "
                         f"{found} layers; config.json does not describe these weights: fix it")
    expected = set()
    for name, shape, required in _expected_tensors(fmt, cfg):
        expected.add(name)
        have = shapes.get(name)
        if have is None and required:
            raise ValueError(f"config.json ({_sizes(cfg)}) needs tensor {name}, which the checkpoint does not hold; "
                             f"config.json does not describe these weights: fix it")
        if have is not None and have != shape:
            raise ValueError(f"the checkpoint's {name} has shape {have} but config.json ({_sizes(cfg)}) gives "
                             f"{shape}; config.json does not describe these weights: fix it")
    rules = [rx for rx, _, _ in _rules(fmt)]
    extra = [k for k in shapes if k not in expected and any(rx.match(k) for rx in rules)]
    if extra:
        more = f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""
        raise ValueError(f"the checkpoint holds {extra[0]}{more}, which config.json ({_sizes(cfg)}) does not account "
                         f"for; config.json does not describe these weights: fix it")


def _template_regex(template: str) -> re.Pattern:
    return re.compile(re.escape(template).replace(r"\{i\}", r"(?P<i>\d+)").replace(r"\{j\}", r"(?P<j>\d+)") + "$")


def _rules(fmt: str) -> list[tuple[re.Pattern, str, bool]]:
    """``(regex on the Hugging Face name, our template, is a norm site)`` of every tensor family ``fmt`` names."""
    rules = []
    for ours, theirs in name_map(fmt).items():
        if ours.endswith("_norm.scale.weight"):
            continue  # QK-norm: a norm site (NORM_SITES)
        rules.append((_template_regex(theirs), ours, False))
    return rules + [(_template_regex(theirs), site, True) for site, theirs in NORM_SITES.items()]


def plain_from_hf_state(fmt: str, cfg: ModelConfig, hf_state: dict[str, Tensor]) -> PlainWeights:
    """The ``PlainWeights`` of a Hugging Face state dict of family ``fmt`` (``names.name_map`` read backwards).

    Per-expert tensors are stacked into our banks ``(E, d_out, d_in)``. A tied model may omit
    ``lm_head.weight``. Raises ``ValueError`` naming unknown or missing tensors.
    """
    rules = _rules(fmt)
    matrices: dict[str, Tensor] = {}
    norms: dict[str, Tensor] = {}
    experts: dict[str, dict[int, Tensor]] = {}
    unknown = []
    for key, t in hf_state.items():
        for rx, ours, is_norm in rules:
            m = rx.match(key)
            if m is None:
                continue
            name = ours.format(i=m.groupdict().get("i"))
            if is_norm:
                norms[name] = t
            elif "j" in m.groupdict():
                experts.setdefault(name, {})[int(m.group("j"))] = t
            else:
                matrices[name] = t
            break
        else:
            if not key.endswith("rotary_emb.inv_freq"):  # a buffer some old checkpoints hold
                unknown.append(key)
    if unknown:
        raise ValueError(f"{len(unknown)} tensor(s) of the checkpoint have no place in scalevec's {fmt} model "
                         f"(e.g. {', '.join(unknown[:3])}); the model has a feature scalevec does not compute")
    for name, bank in experts.items():
        if sorted(bank) != list(range(len(bank))):
            raise ValueError(f"the checkpoint's experts for {name} are incomplete: {sorted(bank)}")
        matrices[name] = torch.stack([bank[j] for j in range(len(bank))])
    if cfg.tie_embeddings:
        head = matrices.pop("head.branches.lm_head.weight", None)
        if head is not None and not torch.equal(head, matrices["embed.weight"]):
            raise ValueError("config.json says tie_word_embeddings=true but lm_head.weight differs from the embedding")
    return PlainWeights(cfg, matrices, norms)


def read_hf_config(hf_dir: str | Path) -> tuple[str, ModelConfig]:
    """``(family, ModelConfig)`` of a Hugging Face model directory, checked without reading a tensor:
    config.json's types and values (``model_config_from_hf``), the model's size against this machine's
    memory (``check_size``), and the config against the tensors' shapes in the safetensors headers
    (``check_shapes``). Raises ``FileNotFoundError`` for a directory that is not a Hugging Face model or
    holds no safetensors, and ``ValueError`` naming what is wrong with the config or the files."""
    d = Path(hf_dir)
    if not is_hf_dir(d):
        raise FileNotFoundError(f"{d} is not a Hugging Face model directory (no config.json with a model_type)")
    fmt, cfg = model_config_from_hf(read_config_json(d))
    check_size(cfg)
    check_shapes(fmt, cfg, tensor_shapes(weight_files(d)))
    return fmt, cfg


def read_hf(hf_dir: str | Path) -> tuple[str, PlainWeights]:
    """``(family, PlainWeights)`` of a Hugging Face model directory (config.json + safetensors), the
    tensors read only once ``read_hf_config`` has checked the directory. Raises as ``read_hf_config``."""
    fmt, cfg = read_hf_config(hf_dir)
    return fmt, plain_from_hf_state(fmt, cfg, read_safetensors(hf_dir))


# --------------------------------------------------------------------------------------------- scalevec models


def plain_from_model(model: Transformer) -> PlainWeights:
    """The ``PlainWeights`` of one of our models: every scale folded into its matrices (``fold.py``'s
    protocol: ``folded_state``), except the final norm's γ, which stays a norm (the LM head stays the
    embedding of a tied model) and QK-norm γ. Raises ``ValueError`` for a model that cannot fold (DNP,
    ``peri``), naming its scales."""
    from scalevec.model.fold import unfoldable_scales

    bad = unfoldable_scales(model)
    if bad:
        raise ValueError(f"cannot convert this model (DNP or peri) to another strategy: "
                         f"{', '.join(bad[:4])} cannot fold. Branch it with the same strategy and model "
                         f"(its weights then load as they are)")
    roles = model.param_roles()
    with torch.no_grad():
        matrices = {n: p.detach().clone() for n, p in model.named_parameters() if roles[n] in MATRIX_ROLES}
        norms = {}
        for name, m in model.named_modules():
            if isinstance(m, OutputNorm):
                if m.scale is not None:
                    norms[name] = m.scale().detach().clone()
            elif name == "head":
                g = _effective_input_scale(m, "lm_head")
                if g is not None:
                    norms["head"] = g
                if m.branches["lm_head"].out_scale is not None:
                    raise ValueError("an output scale on the LM head cannot convert")
            elif hasattr(m, "folded_state"):
                for key, value in m.folded_state().items():
                    matrices[f"{name}.{key}"] = value.detach().clone()
    return PlainWeights(model.cfg, matrices, norms)


def _effective_input_scale(m: NormLinear, branch: str) -> Tensor | None:
    g = m.scale() if m.scale is not None else None
    b = m.branches[branch]
    if b.in_scale is not None:
        g = b.in_scale() if g is None else g * b.in_scale()
    return None if g is None else g.detach().clone()


def set_scale(sv: ScaleVector, gamma: Tensor) -> None:
    """Set ``sv`` so that its effective γ is ``gamma`` (broadcast to its shape, e.g. per expert): direct γ;
    OR β = rms(γ), α = γ / rms(γ); ER b = log rms(γ), α = γ / rms(γ) (``ScaleVector.assign``, rms over the
    last dim). Raises ``ValueError`` for a γ whose rms is 0 (no magnitude-direction form)."""
    sv.assign(gamma)


def _input_side(site_module) -> tuple[list[ScaleVector], list[Tensor], list[ScaleVector]]:
    """``(input scales, weights that read the site, output scales)`` of a NormLinear or an MoE."""
    if isinstance(site_module, NormLinear):
        branches = list(site_module.branches.values())
    else:  # moe.MoE
        branches = [site_module.router, site_module.experts.gate, site_module.experts.up]
        if site_module.shared_experts is not None:
            branches += [site_module.shared_experts.gate, site_module.shared_experts.up]
    ins = [site_module.scale] if site_module.scale is not None else []
    ins += [b.in_scale for b in branches if b.in_scale is not None]
    outs = [b.out_scale for b in branches if b.out_scale is not None]
    return ins, [b.weight for b in branches], outs


def load_plain(model: Transformer, plain: PlainWeights) -> list[str]:
    """Load ``plain`` into ``model`` (any strategy of the same shape, ``pre`` layout), in place.

    Matrices are copied; each Input-Norm site's γ goes to its shared γ or to every branch's γ (HG),
    output scales are set to 1, QK-norm γ to the Output-Norm. Where the strategy has no scale vector
    (``none``) γ is folded into the weights. Returns the sites whose γ could not be represented (QK-norm
    γ ≠ 1 under ``none``: the function changes). Raises ``ValueError`` for the ``peri`` layout, a
    missing tensor or a shape mismatch (naming it).
    """
    if model.cfg.layout != "pre":
        raise ValueError("--init-from needs model.layout=pre: the peri layout adds Output-Norms that the source "
                         "model does not have")
    roles = model.param_roles()
    params = dict(model.named_parameters())
    lost = []
    with torch.no_grad():
        for name, p in params.items():
            if roles[name] not in MATRIX_ROLES:
                continue
            src = plain.matrices.get(name)
            if src is None and name == "head.branches.lm_head.weight" and plain.cfg.tie_embeddings:
                src = plain.matrices.get("embed.weight")  # a tied source into an untied model
            if src is None:
                raise ValueError(f"the source has no tensor for {name}; is it the same model shape?")
            if tuple(src.shape) != tuple(p.shape):
                raise ValueError(f"{name}: the source has shape {tuple(src.shape)}, this model {tuple(p.shape)}; "
                                 f"the model config must match the source's")
            p.copy_(src)
        missing = set(plain.matrices) - set(params)
        if model.cfg.tie_embeddings:
            missing.discard("head.branches.lm_head.weight")
        if missing:
            raise ValueError(f"this model has no slot for {', '.join(sorted(missing)[:3])}; the model config must "
                             f"match the source's")
        for m in model.modules():
            if isinstance(m, ScaleVector):
                set_scale(m, torch.ones(()))  # output scales (and everything not set below) start at 1
        modules = dict(model.named_modules())
        for name, m in modules.items():
            site = name[:-len(".proj")] if name.endswith(".proj") else name
            gamma = plain.norms.get(site)
            if isinstance(m, OutputNorm):
                if gamma is not None and m.scale is not None:
                    set_scale(m.scale, gamma)
                elif gamma is not None and not torch.equal(gamma, torch.ones_like(gamma)):
                    lost.append(name)
                continue
            if not (isinstance(m, NormLinear) or type(m).__name__ == "MoE") or gamma is None:
                continue
            ins, weights, _ = _input_side(m)
            if ins:
                for sv in ins:
                    set_scale(sv, gamma)
            else:  # no scale vector here (strategy none): γ folds into every weight that reads the site
                if name == "head" and model.cfg.tie_embeddings and not torch.equal(gamma, torch.ones_like(gamma)):
                    raise ValueError("strategy none with tied embeddings cannot hold the final norm's γ; "
                                     "choose a strategy with scale vectors or untie (model.tie_embeddings=false)")
                for w in weights:
                    w.mul_(gamma.to(w.dtype))
    return lost


def import_hf(hf_dir: str | Path, scfg, device: str | torch.device = "cpu") -> tuple[str, Transformer]:
    """``(family, model)``: the Hugging Face model in ``hf_dir`` converted into strategy ``scfg``
    (``ScaleConfig``). For a foldable strategy the model computes the same logits as the source in fp32."""
    from scalevec.model.transformer import build_model

    fmt, plain = read_hf(hf_dir)
    model = build_model(plain.cfg, scfg, seed=0, device=device)
    load_plain(model, plain)
    return fmt, model


def function_preserved(scfg) -> bool:
    """True when conversion into ``scfg`` keeps the source's function (every foldable strategy)."""
    return scfg.foldable


__all__ = ["PlainWeights", "is_hf_dir", "model_config_from_hf", "weight_files", "tensor_shapes", "param_count",
           "machine_memory", "check_size", "check_shapes", "read_safetensors", "plain_from_hf_state",
           "read_hf_config", "read_hf", "plain_from_model", "set_scale", "load_plain", "import_hf",
           "function_preserved"]

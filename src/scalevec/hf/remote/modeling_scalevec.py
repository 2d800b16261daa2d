"""A scalevec model as a Hugging Face causal LM (``AutoModelForCausalLM``, ``trust_remote_code=True``).

Written by ``scalevec export`` for the strategies whose scale vectors cannot all be folded into linear
weights (DNP, ``unified``, the ``peri`` layout, and their MoE forms). Needs only torch and transformers.
Every scale that could fold was folded at export (``W' = diag(s) W diag(γ)``), so the input norms here
have no weight. What is left, one block (``configuration_scalevec.py`` names the switches)::

    x ─┬─ n ─ q,k,v ─ [q/k: γ ⊙ n] ─ RoPE ─ attention ─ o ─ [peri: γ ⊙ n] ─(+)─┬─ n ─ MLP ─ [peri: γ ⊙ n] ─(+)─>
       └──────────────────────────────────────────────────────────────────────┘└────────────────────────┘
    MLP:  down( silu([DNP: s ⊙ n] gate(u)) ⊙ [DNP: n] up(u) )      n = RMSNorm over the last dim, no weight

Decoding uses a transformers ``Cache`` (``DynamicCache``); transformers 5 passes it as ``cache``, 4.x as
``past_key_values``: both are accepted and it is returned under the name this version's outputs use.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.cache_utils import Cache, DynamicCache
from transformers.modeling_outputs import CausalLMOutputWithPast

from .configuration_scalevec import ScalevecConfig

CACHE_FIELD = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


def rms_norm(x: torch.Tensor, eps: float, weight: torch.Tensor | None = None) -> torch.Tensor:
    """``x / sqrt(mean(x², -1) + eps)`` computed in float32, cast back, times ``weight`` if given."""
    xf = x.float()
    y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return y * weight.to(y.dtype) if weight is not None else y


class RMSNorm(nn.Module):
    """RMSNorm with a learned scale (the normalizations whose scale cannot fold)."""

    def __init__(self, shape, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(shape))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.eps, self.weight)


def rope_inv_freq(config: ScalevecConfig) -> torch.Tensor:
    """``theta^(-2i/head_dim)``, ``(head_dim/2,)`` float32; with Llama 3 scaling (``rope_llama3``) the long
    wavelengths are divided by ``factor``, the short ones kept, a linear blend in between."""
    hd = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    r = config.rope_llama3
    if not r:
        return inv_freq
    L, factor = r["original_max_position_embeddings"], r["factor"]
    low, high = r["low_freq_factor"], r["high_freq_factor"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > L / low, inv_freq / factor, inv_freq)
    smooth = (L / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < L / high) * ~(wavelen > L / low)
    return torch.where(medium, smoothed, scaled)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    """GQA self-attention with RoPE, optional QK-norm, and an optional KV cache (any Lq ≤ Lk)."""

    def __init__(self, config: ScalevecConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_heads, self.n_kv, self.head_dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        d = config.hidden_size
        self.q_proj = nn.Linear(d, self.n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(d, self.n_kv * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d, self.n_kv * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, d, bias=False)
        if config.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = nn.Identity()

    def forward(self, u, cos, sin, mask, cache: Cache | None):
        B, T, _ = u.shape
        q = self.q_norm(self.q_proj(u).view(B, T, self.n_heads, self.head_dim)).transpose(1, 2)  # (B, H, T, hd)
        k = self.k_norm(self.k_proj(u).view(B, T, self.n_kv, self.head_dim)).transpose(1, 2)  # (B, KV, T, hd)
        v = self.v_proj(u).view(B, T, self.n_kv, self.head_dim).transpose(1, 2)
        q = (q * cos + rotate_half(q) * sin).to(u.dtype)
        k = (k * cos + rotate_half(k) * sin).to(u.dtype)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)  # (B, KV, L, hd): cached keys, then the new ones
        if self.n_kv != self.n_heads:
            k = k.repeat_interleave(self.n_heads // self.n_kv, dim=1)
            v = v.repeat_interleave(self.n_heads // self.n_kv, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # mask (B, 1, T, L), True = attend
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))


def keep(y: torch.Tensor, eps: float, weight: torch.Tensor | None = None) -> torch.Tensor:
    """A gate/up output that DNP does not normalize: as it is (the signature of ``rms_norm``)."""
    return y


def dnp_output(site: str, config: ScalevecConfig):
    """What the SwiGLU does to the output of ``site`` (gate, up), chosen once: ``rms_norm`` where DNP normalizes
    it (``config.mlp_norm_sites``), else ``keep``."""
    return rms_norm if site in config.mlp_norm_sites else keep


class MLP(nn.Module):
    """SwiGLU of width ``width``: ``down(silu(g) ⊙ v)``; under DNP g is ``gate_norm ⊙ n(gate(u))`` and/or v is
    ``n(up(u))`` (the gate keeps its output scale ``gate_norm``)."""

    def __init__(self, config: ScalevecConfig, width: int):
        super().__init__()
        d = config.hidden_size
        self.gate_proj = nn.Linear(d, width, bias=False)
        self.up_proj = nn.Linear(d, width, bias=False)
        self.down_proj = nn.Linear(width, d, bias=False)
        self.eps, self.gate_out, self.up_out = config.rms_norm_eps, dnp_output("gate", config), dnp_output("up", config)
        self.gate_norm = nn.Parameter(torch.ones(width)) if "gate" in config.mlp_norm_sites else None

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        g = self.gate_out(self.gate_proj(u), self.eps, self.gate_norm)
        return self.down_proj(F.silu(g) * self.up_out(self.up_proj(u), self.eps))


class Experts(nn.Module):
    """``num_experts`` SwiGLU experts as banks ``gate_proj, up_proj: (E, width, d)``, ``down_proj: (E, d, width)``."""

    def __init__(self, config: ScalevecConfig):
        super().__init__()
        E, d, w = config.num_experts, config.hidden_size, config.moe_intermediate_size
        self.gate_proj = nn.Parameter(torch.empty(E, w, d))
        self.up_proj = nn.Parameter(torch.empty(E, w, d))
        self.down_proj = nn.Parameter(torch.empty(E, d, w))
        self.eps, self.gate_out, self.up_out = config.rms_norm_eps, dnp_output("gate", config), dnp_output("up", config)
        self.gate_norm = nn.Parameter(torch.ones(E, w)) if "gate" in config.mlp_norm_sites else None

    def forward(self, u: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """``u: (N, d)``, ``idx, weights: (N, k)`` -> ``Σ_j weights[:, j] · expert_{idx[:, j]}(u)``, ``(N, d)``."""
        out = torch.zeros_like(u)
        for e in idx.unique().tolist():
            token, slot = (idx == e).nonzero(as_tuple=True)
            x = u[token]
            gate_scale = self.gate_norm[e] if self.gate_norm is not None else None
            g = self.gate_out(x @ self.gate_proj[e].T, self.eps, gate_scale)
            h = F.silu(g) * self.up_out(x @ self.up_proj[e].T, self.eps)
            out.index_add_(0, token, (h @ self.down_proj[e].T) * weights[token, slot, None].to(u.dtype))
        return out


class MoE(nn.Module):
    """Top-k routed experts (softmax over all experts, top-k, renormalized) plus optional shared experts."""

    def __init__(self, config: ScalevecConfig):
        super().__init__()
        self.top_k = config.num_experts_per_tok
        self.router = nn.Linear(config.hidden_size, config.num_experts, bias=False)
        self.experts = Experts(config)
        width = config.moe_intermediate_size * config.n_shared_experts
        self.shared_experts = MLP(config, width) if config.n_shared_experts else None

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        flat = u.reshape(-1, u.shape[-1])  # (N, d)
        probs = self.router(flat).float().softmax(dim=-1)  # (N, E)
        top, idx = probs.topk(self.top_k, dim=-1)
        y = self.experts(flat, idx, top / top.sum(dim=-1, keepdim=True))
        if self.shared_experts is not None:
            y = y + self.shared_experts(flat)
        return y.view(u.shape)


class Block(nn.Module):
    """``x + [peri: n·γ] attn(n(x))``, then ``x + [peri: n·γ] mlp(n(x))`` (the module docstring's sketch)."""

    def __init__(self, config: ScalevecConfig, layer_idx: int):
        super().__init__()
        self.eps = config.rms_norm_eps
        self.self_attn = Attention(config, layer_idx)
        moe = config.num_experts > 0 and layer_idx >= config.first_dense
        self.mlp = MoE(config) if moe else MLP(config, config.intermediate_size)
        peri = config.layout == "peri"
        self.attn_out_norm = RMSNorm(config.hidden_size, self.eps) if peri else nn.Identity()
        self.mlp_out_norm = RMSNorm(config.hidden_size, self.eps) if peri else nn.Identity()

    def forward(self, x, cos, sin, mask, cache):
        x = x + self.attn_out_norm(self.self_attn(rms_norm(x, self.eps), cos, sin, mask, cache))
        return x + self.mlp_out_norm(self.mlp(rms_norm(x, self.eps)))


class ScalevecPreTrainedModel(PreTrainedModel):
    config_class = ScalevecConfig
    base_model_prefix = "model"
    _no_split_modules = ["Block"]
    _supports_cache_class = True  # transformers 4.x: this model takes a Cache object

    def _init_weights(self, module):
        std = self.config.initializer_range
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, Experts):
            for p in (module.gate_proj, module.up_proj, module.down_proj):
                nn.init.normal_(p, mean=0.0, std=std)
            if module.gate_norm is not None:
                nn.init.ones_(module.gate_norm)
        elif isinstance(module, MLP) and module.gate_norm is not None:
            nn.init.ones_(module.gate_norm)
        elif isinstance(module, RMSNorm):
            nn.init.ones_(module.weight)


class ScalevecModel(ScalevecPreTrainedModel):
    """Embedding and blocks; returns the final hidden state before the (weight-free) final norm."""

    def __init__(self, config: ScalevecConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Block(config, i) for i in range(config.num_hidden_layers))
        self.post_init()

    def get_input_embeddings(self):
        return self.embed_tokens

    def set_input_embeddings(self, value):
        self.embed_tokens = value

    def forward(self, input_ids, attention_mask=None, position_ids=None, cache=None):
        B, T = input_ids.shape
        past = cache.get_seq_length() if cache is not None else 0
        L = past + T
        if position_ids is None:
            position_ids = torch.arange(past, L, device=input_ids.device).unsqueeze(0)
        # computed here, not held as a buffer: transformers 5 builds models on the meta device
        freqs = position_ids[..., None].float() * rope_inv_freq(self.config).to(input_ids.device)  # (B, T, hd/2)
        emb = torch.cat((freqs, freqs), dim=-1)[:, None]  # (B, 1, T, hd)
        cos, sin = emb.cos(), emb.sin()
        # query i sits at position past + i and sees keys 0 .. past + i (top-left is_causal would be wrong
        # when T != L); padded keys (attention_mask 0) are hidden, but every query sees itself, so that a
        # padding row stays finite
        mask = torch.ones(T, L, dtype=torch.bool, device=input_ids.device).tril(diagonal=past)[None, None]
        if attention_mask is not None:
            keep = attention_mask[:, None, None, -L:].bool()  # (B, 1, 1, L)
            own = torch.zeros(T, L, dtype=torch.bool, device=input_ids.device)
            own[torch.arange(T), torch.arange(past, L)] = True
            mask = (mask & keep) | own
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x, cos, sin, mask, cache)
        return rms_norm(x, self.config.rms_norm_eps)


class ScalevecForCausalLM(ScalevecPreTrainedModel, GenerationMixin):
    """Causal LM head on ``ScalevecModel``; ``forward`` returns ``CausalLMOutputWithPast`` (loss when
    ``labels`` are given: mean next-token cross-entropy, labels shifted inside, -100 ignored)."""

    def __init__(self, config: ScalevecConfig):
        super().__init__(config)
        self.model = ScalevecModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def set_input_embeddings(self, value):
        self.model.embed_tokens = value

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, value):
        self.lm_head = value

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None, cache=None,
                use_cache=None, labels=None, logits_to_keep=0, return_dict=None, **kwargs):
        cache = cache if cache is not None else past_key_values
        use_cache = use_cache if use_cache is not None else self.config.use_cache
        if use_cache and cache is None:
            try:
                cache = DynamicCache(config=self.config)
            except TypeError:  # transformers < 4.56
                cache = DynamicCache()
        if not use_cache:
            cache = None
        h = self.model(input_ids, attention_mask, position_ids, cache)
        logits = self.lm_head(h if not logits_to_keep else h[:, -logits_to_keep:])
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].float().flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits, **{CACHE_FIELD: cache})

"""The Llama-style decoder with every scale-vector strategy (DESIGN.md §2, §3).

A handful of small modules: ``Attention`` (GQA, RoPE in Hugging Face's half-rotation layout,
optional QK-norm, SDPA), ``MLP`` (SwiGLU), ``PreBlock`` / ``PeriBlock`` (the two layouts) and
``Transformer``. Where scale vectors sit is decided once, by ``scales.scale_plan``, and the modules of
that plan are built then (``scales.NormLinear``, ``scales.OutputNorm``, ``moe.MoE``), with the plain
formulas (``scales.PLAIN``) or the fast kernels (``kernels.FAST``); nothing in ``forward`` looks at the
strategy. Parameter roles and inits are declared where parameters are made (``params.new_param``); the
parameter count is ``params.count_params``.
MoE MLPs live in ``moe.py``.
"""

from __future__ import annotations

import math
from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from scalevec.config import ModelConfig, RopeScalingConfig, ScaleConfig
from scalevec.model.fused import FusedNormLinear, fused_mlp, mlp_fusable
from scalevec.model.kernels import FAST
from scalevec.model.params import init_params, new_param, normal_init, param_roles
from scalevec.model.scales import (
    PLAIN,
    NormLinear,
    Ops,
    OutputNorm,
    Projection,
    ScalePlan,
    batched_scales,
    scale_plan,
    swiglu_proj,
)


def llama3_inv_freq(inv_freq: Tensor, scaling: RopeScalingConfig) -> Tensor:
    """Llama 3's frequency scaling of ``inv_freq: (head_dim/2,)`` (``config.RopeScalingConfig``): long
    wavelengths divided by ``factor``, short ones kept, a linear blend in between (transformers'
    ``_compute_llama3_parameters``, the same float32 operations)."""
    L = scaling.original_max_position_embeddings
    low_wavelen, high_wavelen = L / scaling.low_freq_factor, L / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (L / wavelen - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def rope_cos_sin(seq_len: int, head_dim: int, theta: float, device: torch.device,
                 scaling: RopeScalingConfig | None = None) -> tuple[Tensor, Tensor]:
    """RoPE tables ``cos, sin: (seq_len, head_dim)`` in float32, Hugging Face Llama's layout:
    ``inv_freq_i = theta^(-2i/head_dim)`` (Llama 3-scaled when ``scaling`` is given), frequencies
    repeated as ``[f, f]`` (half rotation)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim))
    if scaling is not None:
        inv_freq = llama3_inv_freq(inv_freq, scaling)
    freqs = torch.outer(torch.arange(seq_len, device=device).float(), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate ``x: (B, H, T, hd)`` by position: ``x cos + rotate_half(x) sin`` (HF half-rotation)."""
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)
    return (x * cos + rotated * sin).to(x.dtype)


def causal_mask(n_new: int, n_keys: int, device: torch.device) -> Tensor:
    """Boolean ``(n_new, n_keys)`` mask for ``n_new`` queries that come after ``n_keys - n_new`` cached
    tokens: query i (position ``n_keys - n_new + i``) sees keys ``0 .. n_keys - n_new + i``. SDPA's
    ``is_causal`` aligns the mask top-left (query i sees keys ``0 .. i``), which is wrong when
    ``n_new != n_keys``: every new query must see every cached key."""
    return torch.ones(n_new, n_keys, dtype=torch.bool, device=device).tril(diagonal=n_keys - n_new)


class LayerKV:
    """The keys and values ``(B, n_kv_heads, L, head_dim)`` one attention layer has seen (generation only)."""

    def __init__(self):
        self.k: Tensor | None = None
        self.v: Tensor | None = None

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add the new ``k, v: (B, KV, T, hd)`` after the cached ones; return all of them ``(B, KV, L + T, hd)``."""
        self.k = k if self.k is None else torch.cat([self.k, k], dim=2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
        return self.k, self.v


class KVCache:
    """Per-layer ``LayerKV`` for ``Transformer.decode``; ``len(cache)`` is the number of tokens seen."""

    def __init__(self, n_layers: int):
        self.layers = [LayerKV() for _ in range(n_layers)]

    def __len__(self) -> int:
        k = self.layers[0].k
        return 0 if k is None else k.shape[2]


class Attention(nn.Module):
    """Causal GQA self-attention reading an Input-Norm (its γ folds into W_q, W_k, W_v).

    ``norm(x: (B, T, d_model)) -> u``: the Input-Norm (``proj.norm``). ``forward(u, cos, sin, kv=None) ->
    (B, T, d_model)``; with a ``LayerKV`` (generation) the new keys/values are appended to it and the T
    queries attend to every cached key. With ``qk_norm`` each head's q and k are RMS-normalized over
    head_dim with one Output-Norm γ per projection, before RoPE (as in Qwen3).
    """

    def __init__(self, cfg: ModelConfig, plan: ScalePlan, ops: Ops):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        q, kv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim  # q == d_model unless head_dim is set
        norm_linear = FusedNormLinear if plan.fused else NormLinear  # fused: q, k, v in one matmul (opt-in)
        self.proj = norm_linear(cfg.d_model, {"q": q, "k": kv, "v": kv}, plan.attn, cfg.norm_eps, ops,
                                std=cfg.weight_std)
        qk = plan.qk_norm
        self.q_norm = OutputNorm(cfg.head_dim, qk, cfg.norm_eps, ops) if qk is not None else nn.Identity()
        self.k_norm = OutputNorm(cfg.head_dim, qk, cfg.norm_eps, ops) if qk is not None else nn.Identity()
        self.o = Projection(q, cfg.d_model, plan.o, cfg.norm_eps, ops, std=cfg.weight_std / (2 * cfg.n_layers) ** 0.5)

    def norm(self, x: Tensor) -> Tensor:
        return self.proj.norm(x)

    def forward(self, u: Tensor, cos: Tensor, sin: Tensor, kv: LayerKV | None = None) -> Tensor:
        B, T, _ = u.shape
        q, k, v = self.proj(u)
        q = self.q_norm(q.view(B, T, self.n_heads, self.head_dim)).transpose(1, 2)  # (B, H, T, hd)
        k = self.k_norm(k.view(B, T, self.n_kv_heads, self.head_dim)).transpose(1, 2)  # (B, KV, T, hd)
        v = v.view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        gqa = self.n_kv_heads != self.n_heads
        if kv is None:  # training and the uncached forward
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        else:
            k, v = kv.append(k, v)  # (B, KV, L, hd): every cached key, then the T new ones
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(T, k.shape[2], q.device),
                                               enable_gqa=gqa)
        return self.o(y.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    """SwiGLU ``W_down(silu(W_gate u) * (W_up u))`` reading an Input-Norm (``norm(x) -> u``, ``proj.norm``).

    ``forward(u: (B, T, d)) -> ((B, T, d), aux=0)``. Under DNP ``proj`` is a ``scales.DNPSwiGLUProj``.
    """

    def __init__(self, cfg: ModelConfig, plan: ScalePlan, ops: Ops):
        super().__init__()
        self.proj = swiglu_proj(cfg.d_model, cfg.d_ff, plan.mlp, cfg.norm_eps, ops, std=cfg.weight_std)
        self.down = Projection(cfg.d_ff, cfg.d_model, plan.down, cfg.norm_eps, ops,
                               std=cfg.weight_std / (2 * cfg.n_layers) ** 0.5)

    def norm(self, x: Tensor) -> Tensor:
        return self.proj.norm(x)

    def forward(self, u: Tensor) -> tuple[Tensor, Tensor]:
        return self.down(self.proj(u)), u.new_zeros(())  # silu(W_gate u) * (W_up u)


class FusedMLP(MLP):
    """``MLP`` under ``apply='fused'`` (opt-in): W_gate, W_up, DNP's normalizations, the SwiGLU and W_down in one
    autograd node (``fused.fused_mlp``); the same function, equal to ``MLP`` to rounding. Built only where the
    plan has that form (``fused.mlp_fusable``: DNP on both of gate and up or on neither; ``Block``)."""

    def __init__(self, cfg: ModelConfig, plan: ScalePlan, ops: Ops):
        super().__init__(cfg, plan, ops)
        self.dnp = plan.mlp.normalized  # DNP's s acts after the norm: ``dnp_scale``, not ``fold_vectors``

    def forward(self, u: Tensor) -> tuple[Tensor, Tensor]:
        gate, up = self.proj.branches.values()
        (cg, sg), (cu, su) = gate.fold_vectors(), up.fold_vectors()
        if self.dnp:
            sg, su = gate.dnp_scale(), up.dnp_scale()
        y = fused_mlp(u, gate.weight, up.weight, self.down.folded_weight(), cg, cu, sg, su, self.proj.eps, self.dnp)
        return y, u.new_zeros(())


class Block(nn.Module):
    """One decoder block (DESIGN.md §2, §3); ``PreBlock`` and ``PeriBlock`` say in ``forward`` where the norms are.
    Every scale vector a strategy may place, each where ``scales.scale_plan`` puts it::

                   ┌─(γ_q)─ W_q ─(s_q)─ [γ_qk ⊙ n] ─ RoPE ─┐
        x ─ n ─(γ)─┼─(γ_k)─ W_k ─(s_k)─ [γ_qk ⊙ n] ─ RoPE ─┼─ attention ─ W_o ─(s_o)─ [peri: γ_out ⊙ n] ─(+x)─> x
                   └─(γ_v)─ W_v ─(s_v)─────────────────────┘
                   ┌─(γ_gate)─ W_gate ─(s_gate)─ [DNP: s ⊙ n] ─ silu ─┐
        x ─ n ─(γ)─┤                                                  ⊙ ─ W_down ─(s_down)─ [peri: γ_out ⊙ n] ─(+x)─> x
                   └─(γ_up)─── W_up ───(s_up)─── [DNP: s ⊙ n] ────────┘

        n: RMSNorm without affine    γ: the Input-Norm's own scale (scale=shared)    γ_b: one per branch (HG)
        s_b: output side (DP; DNP: after n)    s_o, s_down: on the residual writers (DP, dual_sites o, down: opt-in)
        γ_qk: QK-norm    γ_out: peri's Output-Norms
        MoE MLP (moe.py): the same on the router (γ only), on every expert's W_gate, W_up (γ_b, s per expert) and
        W_down (s_down per expert), and on the shared experts' W_gate, W_up, W_down

    Every γ, γ_b and s folds into the adjacent W (§1, §4) except DNP's s and the Output-Norms' γ.
    ``forward(x: (B, T, d), cos, sin, kv=None) -> (x, aux_loss)``; aux is the MoE auxiliary loss (0 if dense).
    """

    def __init__(self, cfg: ModelConfig, plan: ScalePlan, ops: Ops, layer: int):
        super().__init__()
        self.attn = Attention(cfg, plan, ops)
        if cfg.moe is not None and layer >= cfg.moe.first_dense:
            from scalevec.model.moe import MoE

            self.mlp = MoE(cfg, plan, ops)
        else:
            self.mlp = (FusedMLP if plan.fused and mlp_fusable(plan.mlp) else MLP)(cfg, plan, ops)


class PreBlock(Block):
    """The ``pre`` layout (Llama): ``x + Attn(n(x))``, then ``x + MLP(n(x))``; every Input-Norm belongs to the
    sublayer that reads it (``attn.norm``, ``mlp.norm``), so that its γ can fold into that sublayer's W."""

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, kv: LayerKV | None = None) -> tuple[Tensor, Tensor]:
        with batched_scales(self):  # OR/ER γ of the block in one node per width (scales.py), same numbers
            x = x + self.attn(self.attn.norm(x), cos, sin, kv)
            y, aux = self.mlp(self.mlp.norm(x))
            return x + y, aux


class PeriBlock(Block):
    """The ``peri`` layout (Peri-LN, Gemma's sandwich): ``x + γ_out ⊙ n(Attn(n(x)))``, the same for the MLP;
    ``attn_out`` and ``mlp_out`` are Output-Norms, their γ cannot fold."""

    def __init__(self, cfg: ModelConfig, plan: ScalePlan, ops: Ops, layer: int):
        super().__init__(cfg, plan, ops, layer)
        self.attn_out = OutputNorm(cfg.d_model, plan.peri, cfg.norm_eps, ops)
        self.mlp_out = OutputNorm(cfg.d_model, plan.peri, cfg.norm_eps, ops)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, kv: LayerKV | None = None) -> tuple[Tensor, Tensor]:
        with batched_scales(self):
            x = x + self.attn_out(self.attn(self.attn.norm(x), cos, sin, kv))
            y, aux = self.mlp(self.mlp.norm(x))
            return x + self.mlp_out(y), aux


class Embedding(nn.Module):
    """Token embedding ``(B, T) -> (B, T, d_model)``, role ``embedding``."""

    def __init__(self, vocab_size: int, d_model: int, std: float):
        super().__init__()
        new_param(self, "weight", (vocab_size, d_model), "embedding", normal_init(std))

    def forward(self, tokens: Tensor) -> Tensor:
        return F.embedding(tokens, self.weight)


def _head_cross_entropy(head: NormLinear, x: Tensor, targets: Tensor) -> Tensor:
    return F.cross_entropy(head(head.norm(x))[0].float(), targets, ignore_index=-100, reduction="sum")


def chunked_cross_entropy(head: NormLinear, x: Tensor, targets: Tensor, chunk_tokens: int) -> Tensor:
    """``Σ CE(head(x), targets)`` in nats over targets ``!= -100`` (float32), ``chunk_tokens`` tokens at a time.

    ``x: (B, T, d)`` (the last block's output), ``targets: (B, T)``. Each chunk's logits ``(chunk, V)`` are
    computed, reduced to a scalar and dropped; under autograd each chunk is checkpointed, so the backward
    recomputes its logits instead of keeping all ``B·T·V`` of them (the Liger / torchtune chunked loss idea,
    in plain torch). Equals ``F.cross_entropy(head(x), targets, reduction='sum')`` up to summation order.
    """
    x, targets = x.flatten(0, 1), targets.flatten()
    total = x.new_zeros((), dtype=torch.float32)
    for i in range(0, x.shape[0], chunk_tokens):
        xs, ys = x[i:i + chunk_tokens], targets[i:i + chunk_tokens]
        if torch.is_grad_enabled():
            total = total + checkpoint(_head_cross_entropy, head, xs, ys, use_reentrant=False)
        else:
            total = total + _head_cross_entropy(head, xs, ys)
    return total


class Transformer(nn.Module):
    """The decoder: embedding, ``n_layers`` blocks, final Input-Norm, LM head (DESIGN.md §2).

    ``forward(tokens: LongTensor (B, T)) -> logits (B, T, vocab_size)``.
    ``forward(tokens, targets (B, T)) -> (ce_sum, n_targets, aux)``: cross-entropy in nats summed over
    targets ``!= -100`` (float32), their count, and the coefficient-weighted MoE auxiliary loss.
    Parameters are initialized from the current CPU RNG in creation order, whatever the device
    (``params.init_params``); scale parameters use no randomness, so every strategy gets the same matrices
    from the same seed. ``plan`` is the ``scales.ScalePlan`` the model was built from. Raises ``ValueError`` for
    an invalid config.
    """

    def __init__(self, cfg: ModelConfig, scfg: ScaleConfig):
        super().__init__()
        cfg.validate()
        scfg.validate()
        self.cfg, self.scfg = cfg, scfg
        self.plan = plan = scale_plan(scfg, cfg)  # where every scale vector sits: the strategy, read once
        ops = FAST if plan.fast else PLAIN  # the fast kernels or the plain formulas, same functions
        block = PeriBlock if plan.peri is not None else PreBlock
        self.embed = Embedding(cfg.vocab_size, cfg.d_model, cfg.weight_std)
        self.layers = nn.ModuleList(block(cfg, plan, ops, i) for i in range(cfg.n_layers))
        self.head = NormLinear(cfg.d_model, {"lm_head": cfg.vocab_size}, plan.head, cfg.norm_eps, ops, role="lm_head",
                               std=cfg.weight_std)
        if cfg.tie_embeddings:
            self.head.branches["lm_head"].weight = self.embed.weight
        self.checkpoint_blocks: frozenset[int] = frozenset()  # set_memory_options
        self.loss_chunk_tokens = 0
        self.init_weights()

    def set_memory_options(self, checkpoint_blocks=(), loss_chunk_tokens: int = 0) -> None:
        """Trade compute for memory (``train.activation_checkpointing``, ``train.loss_chunk_tokens``;
        docs/performance.md). ``checkpoint_blocks``: indices of the blocks whose activations are not kept
        but recomputed in the backward (``torch.utils.checkpoint``, non-reentrant, as torchtitan does).
        ``loss_chunk_tokens > 0``: with targets, the final norm, LM head and cross-entropy run on chunks of
        that many tokens, each recomputed in the backward, so the ``(tokens, vocab)`` logits never exist
        whole (``chunked_cross_entropy``). The function is the same; gradients equal the plain path's up
        to fp32 summation order. Off (the default): the plain path, bitwise."""
        self.checkpoint_blocks = frozenset(int(i) for i in checkpoint_blocks)
        self.loss_chunk_tokens = int(loss_chunk_tokens)

    def init_weights(self) -> None:
        """(Re-)initialize every parameter as declared at creation (DESIGN.md §2 init)."""
        init_params(self)

    def param_roles(self) -> dict[str, str]:
        """``{name: role}`` for every parameter (DESIGN.md §5); exhaustive and exclusive."""
        return param_roles(self)

    def forward(self, tokens: Tensor, targets: Tensor | None = None):
        B, T = tokens.shape
        x = self.embed(tokens)  # (B, T, d)
        cos, sin = rope_cos_sin(T, self.cfg.head_dim, self.cfg.rope_theta, tokens.device, self.cfg.rope_scaling)
        aux = x.new_zeros((), dtype=torch.float32)
        # OR/ER γ of the whole model once per step (scales.py), the same numbers; not where blocks or the loss are
        # recomputed in the backward, which must repeat the forward's ops: there each block batches its own
        whole = not self.checkpoint_blocks and not self.loss_chunk_tokens
        with batched_scales(self) if whole else nullcontext():
            for i, layer in enumerate(self.layers):
                if i in self.checkpoint_blocks and torch.is_grad_enabled():  # recomputed in the backward
                    x, a = checkpoint(layer, x, cos, sin, use_reentrant=False)
                else:
                    x, a = layer(x, cos, sin)
                aux = aux + a
            if targets is not None and self.loss_chunk_tokens:
                ce = chunked_cross_entropy(self.head, x, targets, self.loss_chunk_tokens)
                return ce, (targets != -100).sum(), aux
            logits = self.head(self.head.norm(x))[0]  # (B, T, V): the final Input-Norm, then the LM head
        if targets is None:
            return logits
        ce = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=-100, reduction="sum")
        return ce, (targets != -100).sum(), aux

    @torch.no_grad()
    def decode(self, tokens: Tensor, cache: KVCache) -> Tensor:
        """Logits ``(B, T, V)`` of ``tokens (B, T)`` that follow the ``len(cache)`` tokens already in ``cache``
        (generation with a KV cache; ``cache`` is extended in place). ``decode(x, KVCache(n_layers))``
        gives ``forward(x)``'s logits; feeding a sequence in pieces gives the same logits as feeding it
        whole, up to float rounding. Raises ``ValueError`` past ``max_seq_len`` positions."""
        B, T = tokens.shape
        start = len(cache)
        if start + T > self.cfg.max_seq_len:
            raise ValueError(f"{start} cached + {T} new tokens exceed model.max_seq_len={self.cfg.max_seq_len}")
        x = self.embed(tokens)
        cos, sin = rope_cos_sin(start + T, self.cfg.head_dim, self.cfg.rope_theta, tokens.device,
                                self.cfg.rope_scaling)
        cos, sin = cos[start:], sin[start:]  # the new tokens' positions
        with batched_scales(self):
            for layer, kv in zip(self.layers, cache.layers):
                x, _ = layer(x, cos, sin, kv)
            return self.head(self.head.norm(x))[0]


def build_model(cfg: ModelConfig, scfg: ScaleConfig, seed: int | None = None,
                device: str | torch.device | None = None) -> Transformer:
    """Build a ``Transformer``; with ``seed`` its matrices come from ``torch.manual_seed(seed)`` (fork of the
    global RNG, which is left untouched), drawn on the CPU generator whatever ``device`` (``params.draw``), so seed
    k is the same model on CPU and GPU. ``device='meta'`` builds it without memory and draws nothing
    (parameter counts)."""
    with torch.device(device or "cpu"):
        if seed is None:
            return Transformer(cfg, scfg)
        # manual_seed also reseeds CUDA: fork the current CUDA device's RNG too (only that one, so that
        # no other GPU gets a context).
        cuda = [torch.cuda.current_device()] if torch.cuda.is_available() else []
        with torch.random.fork_rng(devices=cuda):
            torch.manual_seed(seed)
            return Transformer(cfg, scfg)

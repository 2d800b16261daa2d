"""Configuration of a scalevec model exported as a Hugging Face custom architecture (``model_type: scalevec``).

Written by ``scalevec export`` next to ``modeling_scalevec.py``; needs only transformers. A Llama-style
decoder (GQA, RoPE with Hugging Face's half-rotation, SwiGLU, RMSNorm without affine on the inputs of
every block; ``rope_llama3``: None or Llama 3's ``{factor, low_freq_factor, high_freq_factor,
original_max_position_embeddings}``) plus the normalizations whose scale vectors cannot be folded into a linear weight:

- ``layout="peri"``: an RMSNorm with a scale on each branch output before the residual add;
- ``qk_norm``: per-head RMSNorm with a scale on queries and keys before RoPE (as Qwen3);
- ``mlp_norm_sites``: DNP's RMSNorm over the outputs of ``gate`` and/or ``up`` (a scale is kept on
  ``gate``, whose output feeds SiLU; the one on ``up`` is folded into ``down``).

MoE models (``num_experts > 0``) route every token to ``num_experts_per_tok`` of ``num_experts``
SwiGLU experts of width ``moe_intermediate_size`` (softmax over all experts, top-k, renormalized),
plus ``n_shared_experts`` always-on experts; the first ``first_dense`` layers keep a dense MLP.
"""

from transformers import PretrainedConfig


class ScalevecConfig(PretrainedConfig):
    model_type = "scalevec"
    keys_to_ignore_at_inference = ["past_key_values", "cache"]

    def __init__(
        self,
        vocab_size=256,
        hidden_size=128,
        intermediate_size=344,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=None,
        max_position_embeddings=256,
        rope_theta=10000.0,
        rope_llama3=None,
        rms_norm_eps=1e-6,
        layout="pre",
        qk_norm=False,
        mlp_norm_sites=(),
        num_experts=0,
        num_experts_per_tok=2,
        moe_intermediate_size=128,
        n_shared_experts=0,
        first_dense=0,
        initializer_range=0.02,
        use_cache=True,
        tie_word_embeddings=False,
        **kwargs,
    ):
        if layout not in ("pre", "peri"):
            raise ValueError(f"layout={layout!r} is unknown; use 'pre' or 'peri'")
        if any(site not in ("gate", "up") for site in mlp_norm_sites):
            raise ValueError(f"mlp_norm_sites={list(mlp_norm_sites)}: allowed sites are 'gate' and 'up'")
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.head_dim = head_dim if head_dim is not None else hidden_size // num_attention_heads
        self.max_position_embeddings = max_position_embeddings
        self.rope_theta = float(rope_theta)
        self.rope_llama3 = dict(rope_llama3) if rope_llama3 else None
        self.rms_norm_eps = rms_norm_eps
        self.layout = layout
        self.qk_norm = bool(qk_norm)
        self.mlp_norm_sites = list(mlp_norm_sites)
        self.num_experts = num_experts
        self.num_experts_per_tok = num_experts_per_tok
        self.moe_intermediate_size = moe_intermediate_size
        self.n_shared_experts = n_shared_experts
        self.first_dense = first_dense
        self.initializer_range = initializer_range
        self.use_cache = use_cache
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)

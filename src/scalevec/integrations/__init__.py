"""The strategies where researchers already train (docs/integrations.md): Hugging Face models and any training loop.

- ``hf_model``: ``apply_strategy`` (a strategy's scale vectors, in place, into a model of a family recorded in
  ``hf_format/families.py``: transformers, torchtitan, OLMo-core), ``fold`` (back to the plain model), ``save``
  (what ``scalevec export`` writes),
  ``to_scalevec`` (the same parameters as scalevec's own model)
- ``groups``: ``param_groups``, torch optimizer groups by §5 role for any such model or a plain HF model
- ``callbacks``: the per-scale-vector metrics as an HF ``TrainerCallback`` and as a function for any loop
- ``wd_guard``: refuses to step any optimizer whose weight decay breaks the strategy a model carries
  (``allow_any_weight_decay`` opts out)
- ``hf_trainer`` (imported on its own; needs transformers): ``ScalevecTrainer``, ``transformers.Trainer`` with
  scalevec's groups, FSDP included
- ``torchtitan``, ``olmo_core`` (imported on their own; need those frameworks): their model converter and
  optimizer-group hooks

docs/integrations.md has the recipes (HF Trainer, accelerate, a torchtitan-style loop) with their output.
"""

from scalevec.integrations.callbacks import ScaleMetricsCallback, add_scale_metrics, scale_metrics
from scalevec.integrations.groups import ParamGroups, model_roles, param_groups
from scalevec.integrations.hf_model import StrategyInfo, apply_strategy, fold, save, to_scalevec
from scalevec.integrations.wd_guard import WeightDecayMismatch, allow_any_weight_decay

__all__ = ["apply_strategy", "fold", "save", "to_scalevec", "StrategyInfo", "param_groups", "ParamGroups",
           "model_roles", "ScaleMetricsCallback", "add_scale_metrics", "scale_metrics", "allow_any_weight_decay",
           "WeightDecayMismatch"]

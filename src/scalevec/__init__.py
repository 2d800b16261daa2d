"""scalevec: LLM pre-training research on the learnable scale vectors of normalization layers.

See DESIGN.md for the math and the layout; the public entry points are re-exported here. The integrations with
other stacks (docs/integrations.md: ``apply_strategy``, ``param_groups``, ``fold``, ``save``,
``scale_metrics``, ``ScaleMetricsCallback``, ``add_scale_metrics``, ``to_scalevec``, ``allow_any_weight_decay``)
are imported on first use, so that ``import scalevec`` does not import transformers.
"""

from scalevec.config import ModelConfig, MoEConfig, RunConfig, ScaleConfig
from scalevec.config.presets import PRESETS, get_preset
from scalevec.model.fold import fold_scales
from scalevec.model.transformer import Transformer, build_model

__version__ = "0.1.0"

_INTEGRATIONS = ("apply_strategy", "param_groups", "fold", "save", "to_scalevec", "scale_metrics",
                 "ScaleMetricsCallback", "add_scale_metrics", "allow_any_weight_decay")


def __getattr__(name: str):
    if name in _INTEGRATIONS:
        import scalevec.integrations

        return getattr(scalevec.integrations, name)
    raise AttributeError(f"module 'scalevec' has no attribute {name!r}")


__all__ = ["ModelConfig", "MoEConfig", "RunConfig", "ScaleConfig", "Transformer", "build_model", "fold_scales",
           "PRESETS", "get_preset", "__version__", *_INTEGRATIONS]

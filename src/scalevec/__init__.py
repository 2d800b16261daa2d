"""scalevec: LLM pre-training research on the learnable scale vectors of normalization layers.

See DESIGN.md for the math and the layout; the public entry points are re-exported here.
"""

from scalevec.config import ModelConfig, MoEConfig, RunConfig, ScaleConfig
from scalevec.model.fold import fold_scales
from scalevec.model.transformer import Transformer, build_model
from scalevec.presets import PRESETS, get_preset

__version__ = "0.1.0"

__all__ = ["ModelConfig", "MoEConfig", "RunConfig", "ScaleConfig", "Transformer", "build_model", "fold_scales",
           "PRESETS", "get_preset", "__version__"]

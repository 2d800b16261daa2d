"""The config layer: what a run is, read from user input and checked (DESIGN.md §2, §3, §12).

One job per module, the lowest first (each imports only those above it in this list and ``scalevec.outpath``;
tests/test_layout.py keeps the model, data and training out):

- ``typed``: the one typed reader of parsed YAML or JSON (counts, numbers, flags, choices) and its one-line
  error form, "where.key must be RULE, like EXAMPLE; got VALUE";
- ``files``: bounded file and YAML reading (size, alias expansion, nesting), ``load_yaml``;
- ``schema``: the dataclasses, one per section, each field with its description and validation;
- ``codec``: dataclass <-> plain data, ``section.field=value`` overrides, diffs, ``save_yaml``;
- ``fieldhelp``: every field with its type, default and description (``scalevec train --help``);
- ``presets``: the model presets; ``run_budget``: steps, tokens, budgets and CPUs of a run.

The resolution of a run's inputs into one ``RunConfig`` is ``scalevec.resolve``. The package re-exports the
schemas, so ``from scalevec.config import RunConfig`` names the class.
"""

from scalevec.config.schema import (
    COMPILE_CHOICES,
    EXECUTION_FIELDS,
    PRESET_NAMES,
    SCALE_CHOICES,
    SEED_LIMIT,
    STRATEGIES,
    VAL_SPLITS,
    VAL_WINDOWS,
    DataConfig,
    Derived,
    ModelConfig,
    MoEConfig,
    OptimConfig,
    RopeScalingConfig,
    RunConfig,
    ScaleConfig,
    ScheduleConfig,
    TrainConfig,
    checkpoint_blocks,
    normalize_compile,
)

__all__ = [
    "MoEConfig", "RopeScalingConfig", "Derived", "ModelConfig", "SCALE_CHOICES", "STRATEGIES", "PRESET_NAMES",
    "ScaleConfig", "OptimConfig", "ScheduleConfig", "DataConfig", "VAL_SPLITS", "VAL_WINDOWS", "COMPILE_CHOICES",
    "normalize_compile", "TrainConfig", "RunConfig", "checkpoint_blocks", "EXECUTION_FIELDS", "SEED_LIMIT",
]

"""The GPU check's ``torchtitan`` stage (DESIGN.md §8): training steps of torchtitan 0.3.0's Llama3 ``debugmodel``
converted to ``unified`` by ``ScalevecConverter``, with ``ScalevecOptimizers``, beside the unconverted model.

    python -m scalevec.bench.gpu_stages torchtitan --work DIR --device cuda|cpu

What runs is torchtitan's *training step*, not its ``Trainer``: the ``Trainer`` builds a tokenizer from
``hf_assets_path`` and a dataloader from a dataset (``c4_test``) that live in torchtitan's source tree, not in its
wheel, and the GPU machine has no network to fetch them. The step is the ``Trainer``'s own, piece by piece: the model
built as its ``ModelSpec`` says (on the meta device, ``to_empty``, ``init_states`` under a seed), the optimizer
container from the job's optimizer config (``ScalevecOptimizers.Config(...).build(model_parts=...)``), its
``CrossEntropyLoss`` (sum) divided by the batch's valid tokens, ``get_attention_masks`` from the positions for
flex attention, gradient clipping at 1.0, ``optimizers.step()``. The batch is one fixed synthetic batch of random
token ids, in memory, repeated every step: a model that trains lowers its loss on it within a few steps.

Attention: on CUDA torchtitan's default, flex attention (block-causal masks from the positions). On CPU (the
rehearsal) flex attention has no backward, so each layer's inner attention is torchtitan's own
``ScaledDotProductAttention`` (causal, maskless: the config its trainer supports without masks); everything else
is the CUDA path's, so the rehearsal trains too.

Figures: both models' losses per step, ``loss_falls`` (the converted model's last loss below its first, every loss
finite), ``groups_equal_param_groups`` (the optimizer's groups are ``scalevec.param_groups`` of the model: the same
tensors in the same order, lr and weight decay), the groups by role, and the median step time of each model after
``WARMUP`` steps (the first compiles flex attention) with their ratio, the two models' steps taken in turn. When
torchtitan does not import here the stage returns ``{"not_run": why}``: the check reports it as "not run", neither
ok nor a failure.
"""

from __future__ import annotations

import math
import statistics
import time

import torch

NOT_INSTALLED = "torchtitan 0.3.0 not installed (pip install torchtitan==0.3.0 --no-deps)"
SIZES = {"cuda": {"batch": 8, "seq": 512, "steps": 10}, "cpu": {"batch": 2, "seq": 32, "steps": 5}}
WARMUP = 2  # steps left out of the step time: the first compiles flex attention, the second warms the allocator
LR = 8e-4  # torchtitan's debugmodel job's lr (llama3_debugmodel: default_adamw(lr=8e-4))
WEIGHT_DECAY = 0.1
STRATEGY = "unified"


def not_run_reason(error: Exception) -> str:
    """Why the stage cannot run: ``NOT_INSTALLED`` when the ``torchtitan`` package is absent, else the import error
    of an installed torchtitan (one that does not import on this torch)."""
    if isinstance(error, ModuleNotFoundError) and (error.name or "").split(".")[0] == "torchtitan":
        return NOT_INSTALLED
    return f"torchtitan does not import here: {type(error).__name__}: {error}"[:300]


def _model_config(llama3, attention_config, converters: list | None):
    """torchtitan's debugmodel config (through ``converters``), each layer's inner attention replaced by
    ``attention_config`` when it is given."""
    cfg = llama3.model_registry("debugmodel", converters=converters).model
    if attention_config is not None:
        for layer in cfg.layers:
            layer.attention.inner_attention = attention_config
    return cfg


def _build(cfg, device: torch.device, seed: int):
    """torchtitan's trainer's way: build on meta, ``to_empty`` on ``device``, ``init_states`` under ``seed``."""
    import warnings

    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # unified's DNP warns that the function changes: it is meant to
        model = cfg.build()
    model.to_empty(device=device)
    torch.manual_seed(seed)
    with torch.no_grad():
        model.init_states(buffer_device=None)
    return model.train()


def groups_equal(optimizer: torch.optim.Optimizer, want: list[dict]) -> bool:
    """Whether ``optimizer``'s param groups are ``want`` (``scalevec.param_groups``' list): the same tensors in the
    same order, the same lr and weight decay, group by group."""
    got = optimizer.param_groups
    return len(got) == len(want) and all(
        [id(p) for p in g["params"]] == [id(p) for p in w["params"]] and g["lr"] == w["lr"]
        and g["weight_decay"] == w["weight_decay"] for g, w in zip(got, want))


def training_step(model, optimizers, loss_fn, tokens: torch.Tensor, masked: bool):
    """torchtitan's training step of ``model`` on the fixed batch ``tokens`` (``[batch, seq + 1]`` ids) as a
    function of no argument returning ``(loss in nats/token, wall seconds)`` (synchronized on CUDA); ``masked``:
    build flex attention's masks from the positions, as torchtitan's trainer does for its masked backends."""
    x, y = tokens[:, :-1], tokens[:, 1:]
    positions = torch.arange(x.shape[1], device=x.device).expand_as(x)
    valid = torch.tensor(y.numel(), device=x.device)
    sync = torch.cuda.synchronize if x.is_cuda else (lambda: None)

    def step() -> tuple[float, float]:
        sync()
        t0 = time.perf_counter()
        optimizers.zero_grad()
        masks = model.get_attention_masks(positions=positions) if masked else None
        pred = model(x, positions=positions, attention_masks=masks)
        loss, _ = loss_fn(pred, y, global_valid_tokens=valid)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizers.step()
        value = float(loss.detach())  # synchronizes
        return value, time.perf_counter() - t0

    return step


def torchtitan_stage(device: str, steps: int | None = None) -> dict:
    """The stage (module docstring) on ``device`` (``steps``: default ``SIZES``'; at least ``WARMUP + 1``): its
    figures and ``ok``, or ``{"not_run": why}`` where torchtitan does not import."""
    try:
        import torchtitan
        from torchtitan.components.loss import CrossEntropyLoss
        from torchtitan.models import llama3
        from torchtitan.models.common.attention import ScaledDotProductAttention

        from scalevec.integrations import torchtitan as titan
    except Exception as e:  # absent, or built for another torch: either way the stage cannot run here
        return {"not_run": not_run_reason(e)}
    from scalevec.integrations.groups import param_groups, strategy_of

    cuda = device == "cuda"
    size = {**SIZES[device], **({"steps": steps} if steps else {})}
    if size["steps"] <= WARMUP:
        raise ValueError(f"torchtitan stage: steps {size['steps']} leaves no step to time after {WARMUP} warm-up steps")
    dev = torch.device(device)
    attention = None if cuda else ScaledDotProductAttention.Config()
    tokens = torch.randint(0, 2048, (size["batch"], size["seq"] + 1), generator=torch.Generator().manual_seed(0))
    tokens = tokens.to(dev)
    loss_fn = CrossEntropyLoss.Config().build()
    out: dict = {"torchtitan": getattr(torchtitan, "__version__", None), "model": "llama3 debugmodel",
                 "attention": "flex" if cuda else "sdpa (causal; CPU has no flex-attention backward)",
                 "strategy": STRATEGY, "batch": [size["batch"], size["seq"]], "steps": size["steps"], "lr": LR,
                 "dtype": "float32"}
    runs = {}
    for name, converters in (("baseline", None), (STRATEGY, [titan.ScalevecConverter.Config(strategy=STRATEGY)])):
        model = _build(_model_config(llama3, attention, converters), dev, seed=0)
        opts = titan.ScalevecOptimizers.Config(lr=LR, weight_decay=WEIGHT_DECAY,
                                               implementation="fused" if cuda else "for-loop").build(
            model_parts=[model])
        (opt,) = opts.optimizers
        want = param_groups(model, lr=LR, weight_decay=WEIGHT_DECAY, strategy=strategy_of(model))
        runs[name] = {"step": training_step(model, opts, loss_fn, tokens, masked=cuda), "losses": [], "step_s": [],
                      "groups_equal": groups_equal(opt, want)}
        if name == STRATEGY:
            out["groups"] = {g["role"]: {"tensors": len(g["params"]), "weight_decay": g["weight_decay"], "lr": g["lr"]}
                             for g in want}
            out["optimizer_groups"] = len(opt.param_groups)
    for _ in range(size["steps"]):  # paired round by round: a load change on the machine hits both alike
        for r in runs.values():
            loss, seconds = r["step"]()
            r["losses"].append(loss)
            r["step_s"].append(seconds)
    for name, r in runs.items():
        out[f"{name}_losses"] = r["losses"]
        out[f"{name}_step_ms"] = statistics.median(r["step_s"][WARMUP:]) * 1e3
    mine = runs[STRATEGY]["losses"]
    out["unified_loss_first"], out["unified_loss_last"] = mine[0], mine[-1]
    out["finite"] = all(math.isfinite(v) for r in runs.values() for v in r["losses"])
    out["loss_falls"] = out["finite"] and mine[-1] < mine[0]
    out["groups_equal_param_groups"] = all(r["groups_equal"] for r in runs.values())
    out["unified_step_ratio"] = out[f"{STRATEGY}_step_ms"] / out["baseline_step_ms"]
    out["ok"] = out["loss_falls"] and out["groups_equal_param_groups"]
    return out

"""A Hugging Face ``Trainer`` cannot silently train a strategy with the wrong weight decay
(``integrations/wd_guard.py``, ``integrations/hf_trainer.py``; DESIGN.md §5)."""

import warnings

import pytest
import torch
import transformers

from scalevec import param_groups
from scalevec.integrations import add_scale_metrics, allow_any_weight_decay, apply_strategy, fold
from scalevec.integrations.hf_trainer import ScalevecTrainer
from scalevec.integrations.wd_guard import WeightDecayMismatch

VOCAB, T = 256, 32


def tiny_llama(strategy: str | None = "unified"):
    """A random 2-layer ``LlamaForCausalLM`` (vocab 256), with ``strategy`` applied."""
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, intermediate_size=96, max_position_embeddings=64)
    model = transformers.LlamaForCausalLM(cfg)
    if strategy is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # unified's "the function changes" (DNP), tested in test_integrations
            apply_strategy(model, strategy)
    return model


class Blocks(torch.utils.data.Dataset):
    """16 sequences of T tokens counting up modulo 8 from a random start (learnable in a few steps), as causal-LM
    examples."""

    def __init__(self):
        start = torch.randint(0, 8, (16, 1), generator=torch.Generator().manual_seed(1))
        self.ids = (start + torch.arange(T)) % 8

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def training_args(tmp_path, steps: int = 3, **kw) -> transformers.TrainingArguments:
    return transformers.TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=steps,
                                          per_device_train_batch_size=4, learning_rate=1e-2, use_cpu=True,
                                          save_strategy="no", report_to=[], logging_steps=1, dataloader_num_workers=0,
                                          **kw)


def _state(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("weight_decay", [0.1, 0.0])
def test_plain_trainer_refuses_to_step_unified(tmp_path, weight_decay):
    """``transformers.Trainer``'s own optimizer on a model carrying ``unified`` raises before the first optimizer step,
    naming the first wrong tensor and the fix: at wd 0.1 it decays Output-Norm scales, at wd 0 the Input-Norm decay
    unified needs is off. No parameter moves."""
    model = tiny_llama()
    before = _state(model)
    trainer = transformers.Trainer(model=model, args=training_args(tmp_path, weight_decay=weight_decay),
                                   train_dataset=Blocks())
    with pytest.raises(WeightDecayMismatch) as err:
        trainer.train()
    msg = str(err.value)
    assert msg.count("\n") == 0 and "strategy unified" in msg and "ScalevecTrainer" in msg
    assert "allow_any_weight_decay" in msg
    name = msg.split(" ")[0]
    assert name in dict(model.named_parameters())
    if weight_decay > 0:
        assert "never decays" in msg and "weight_decay=0.1" in msg
    else:
        assert "(input_scale) has weight_decay=0 " in msg and " decays input_scale" in msg
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())


def test_any_loop_is_checked_and_the_opt_out_lets_it_step():
    """A hand-written loop with ``AdamW(model.parameters())`` (0.01 on every tensor) is refused at ``step``; after
    ``allow_any_weight_decay(model)`` the same optimizer steps."""
    model = tiny_llama()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = Blocks().ids[:2]
    model(input_ids=ids, labels=ids).loss.backward()
    with pytest.raises(WeightDecayMismatch, match="never decays"):
        opt.step()
    allow_any_weight_decay(model)
    opt.step()


def test_scalevec_groups_and_folded_models_pass():
    """An optimizer over ``param_groups`` steps; a folded model (no strategy left) is not checked."""
    model = tiny_llama()
    ids = Blocks().ids[:2]
    opt = torch.optim.AdamW(param_groups(model, lr=1e-3, weight_decay=0.1))
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    folded = fold(tiny_llama("unified_foldable"))
    opt = torch.optim.AdamW(folded.parameters(), lr=1e-3)
    folded(input_ids=ids, labels=ids).loss.backward()
    opt.step()


def test_scalevec_trainer_at_transformers_default_weight_decay_names_the_fix(tmp_path):
    """``ScalevecTrainer`` under ``TrainingArguments``' default weight_decay=0 on ``unified`` (which decays the
    Input-Norm scales): one ValueError naming the argument to set, before any step; before, the guard refused the
    step telling the user to use ScalevecTrainer, which they were. ``scale_weight_decay`` alone fixes it."""
    model = tiny_llama()
    before = _state(model)
    trainer = ScalevecTrainer(model=model, args=training_args(tmp_path), train_dataset=Blocks())
    with pytest.raises(ValueError, match=r"^strategy unified decays input_scale .* weight decay here is 0: pass "
                                         r"weight_decay > 0 \(transformers: TrainingArguments\(weight_decay=0\.1\)"):
        trainer.train()
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
    groups = {g["role"]: g for g in param_groups(model, lr=1e-2, weight_decay=0.0, scale_weight_decay=0.1)}
    assert groups["input_scale"]["weight_decay"] == 0.1 and groups["matrix"]["weight_decay"] == 0.0


def test_scalevec_trainer_trains_unified_with_param_groups(tmp_path):
    """``ScalevecTrainer`` trains ``unified`` (no refusal; the loss falls over 4 steps on counting sequences) and its
    optimizer's groups are ``param_groups(model, lr, weight_decay)``: the same tensors, lr and decay per role; its logs
    carry each group's lr and, with ``add_scale_metrics``, the per-vector series."""
    model = tiny_llama()
    expected = param_groups(model, lr=1e-2, weight_decay=0.1)
    trainer = ScalevecTrainer(model=model, args=training_args(tmp_path, steps=4, weight_decay=0.1,
                                                              lr_scheduler_type="constant"), train_dataset=Blocks())
    logs = []

    class Record(transformers.TrainerCallback):
        def on_log(self, args, state, control, logs_=None, **kwargs):
            logs.append(dict(kwargs.get("logs") or logs_ or {}))

    add_scale_metrics(trainer)  # the docs' line 3: the per-vector metrics, as with Trainer
    trainer.callback_handler.callbacks.insert(1, Record())  # where the reporters sit, before the series are taken out
    trainer.train()
    got = trainer.optimizer.param_groups
    assert [(g["role"], g["lr"], g["weight_decay"], [id(p) for p in g["params"]]) for g in got] == \
        [(g["role"], g["lr"], g["weight_decay"], [id(p) for p in g["params"]]) for g in expected]
    losses = [r["loss"] for r in logs if "loss" in r]
    assert len(losses) == 4 and losses[-1] < losses[0] - 0.5, losses  # measured: 5.57 -> 3.61 nats
    assert {"learning_rate.matrix", "learning_rate.input_scale"} <= set(logs[0])
    assert any(k.startswith("scales.input_scale/rms/") for k in logs[0])


def test_scalevec_trainer_builds_its_optimizer_in_create_optimizer(tmp_path):
    """The groups come from ``create_optimizer``, the method Trainer calls itself (and the only way in under FSDP,
    where it refuses ``optimizers=``): called with a model, it groups that model; Trainer's optim class is kept."""
    model = tiny_llama()
    trainer = ScalevecTrainer(model=model, args=training_args(tmp_path, weight_decay=0.1, optim="adamw_torch"),
                              train_dataset=Blocks(), embedding_wd=True)
    assert type(trainer).create_optimizer is not transformers.Trainer.create_optimizer
    opt = trainer.create_optimizer(model)
    assert isinstance(opt, torch.optim.AdamW) and opt is trainer.create_optimizer()
    by_role = {g["role"]: g["weight_decay"] for g in opt.param_groups}
    assert by_role["embedding"] == 0.1 and by_role["output_scale"] == 0.0 and by_role["input_scale"] == 0.1


def test_scalevec_trainer_refuses_an_optimizer_with_its_own_layout(tmp_path):
    """``args.optim`` that lays out its own parameters (LOMO) cannot carry roles: one clear ``ValueError``."""
    trainer = ScalevecTrainer(model=tiny_llama(), args=training_args(tmp_path, optim="adamw_torch", weight_decay=0.1),
                              train_dataset=Blocks())
    trainer.optimizer_cls_and_kwargs = (torch.optim.AdamW, {"model": trainer.model, "lr": 1e-3})
    with pytest.raises(ValueError, match="builds its own parameter groups"):
        trainer.create_optimizer()


def test_scalevec_trainer_checkpoints_a_strategy_and_resumes_it(tmp_path):
    """A checkpoint of a model carrying unified_foldable (whose save_pretrained is refused) holds its live state; a
    new ScalevecTrainer resumes from it to the very parameters of the uninterrupted run; plain from_pretrained finds
    no plain checkpoint there (it fails loudly instead of loading re-initialized norms)."""
    straight = tiny_llama("unified_foldable")
    ScalevecTrainer(model=straight, args=training_args(tmp_path / "a", steps=4, weight_decay=0.1),
                    train_dataset=Blocks()).train()
    first = tiny_llama("unified_foldable")
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "b" / "out"), max_steps=4, weight_decay=0.1,
                                          per_device_train_batch_size=4, learning_rate=1e-2, use_cpu=True,
                                          save_strategy="steps", save_steps=2, report_to=[], dataloader_num_workers=0)
    ScalevecTrainer(model=first, args=args, train_dataset=Blocks()).train()
    ckpt = tmp_path / "b" / "out" / "checkpoint-2"
    assert (ckpt / "scalevec_strategy_model.safetensors").is_file()
    resumed = tiny_llama("unified_foldable")
    ScalevecTrainer(model=resumed, args=args, train_dataset=Blocks()).train(resume_from_checkpoint=str(ckpt))
    want = _state(straight)
    assert all(torch.equal(p, want[n]) for n, p in _state(resumed).items())
    with pytest.raises(ValueError, match="Unrecognized model"):  # no config.json, no model.safetensors: loud
        transformers.AutoModelForCausalLM.from_pretrained(ckpt)


def test_a_passed_optimizer_is_checked_again_after_a_new_group_or_opting_back_in():
    """An optimizer that passed (or stepped while its model was opted out) is checked again at its next step after
    ``add_param_group`` adds a wrongly decayed scale vector, or after ``allow_any_weight_decay(model, False)``."""
    model = tiny_llama()
    ids = Blocks().ids[:2]
    groups = param_groups(model, lr=1e-3, weight_decay=0.1)
    scales = {id(p) for n, p in model.named_parameters() if "norm" in n}
    no_norm = [{**g, "params": [p for p in g["params"] if id(p) not in scales]} for g in groups]
    opt = torch.optim.AdamW([g for g in no_norm if g["params"]])
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()  # holds no scale vector: passes
    opt.add_param_group({"params": [p for p in model.parameters() if id(p) in scales], "weight_decay": 0.1})
    with pytest.raises(WeightDecayMismatch, match="never decays"):
        opt.step()
    wrong = torch.optim.AdamW(model.parameters(), lr=1e-3)
    allow_any_weight_decay(model)
    wrong.step()
    allow_any_weight_decay(model, False)
    with pytest.raises(WeightDecayMismatch, match="never decays"):
        wrong.step()

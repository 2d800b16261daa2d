"""``scalevec export --verify``: load an export with plain transformers and compare it with our model (DESIGN.md §10).

``verify`` loads the written directory with ``AutoModelForCausalLM`` (the custom architecture with
``trust_remote_code=True``) and compares logits, loss and greedy ids with ours; ``verify_tokens`` picks the
tokens it runs on (the run's held-out sequences). A mismatch is a bug in the export, not a user error:
``VerifyError``. This module writes nothing; ``export.py`` calls it on the temporary directory before the
export appears.

Needs the optional dependency ``transformers`` (``pip install 'scalevec[hf]'``).
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from torch import Tensor

from scalevec.hf_format.hf_import import read_config_json
from scalevec.model.fold import fold_scales
from scalevec.model.transformer import Transformer

VERIFY_ATOL = 1e-4  # fp32 logits: ours vs transformers, per unit of the largest |logit|
# the custom architecture: fp32 logits within 1e-5 per unit of the largest |logit| (measured ~1e-7 on the
# tiny test models at init). float32 rounding grows with the size of the numbers rounded: a trained `unified` model
# (`small`, 600 steps) differed by 1.144e-05 with logits of tens, loss and greedy ids equal, so the logit
# tolerance is atol x max(1, max |logit|), the loss's atol x max(1, |loss|).
VERIFY_ATOL_REMOTE = 1e-5


class VerifyError(RuntimeError):
    """The exported checkpoint does not reproduce our model (a bug, not a user error)."""


def shifted_targets(tokens: Tensor) -> Tensor:
    """Next-token targets ``(B, T)`` for ``tokens (B, T)``: ``tokens[:, 1:]``, and -100 at the last position."""
    targets = torch.full_like(tokens, -100)
    targets[:, :-1] = tokens[:, 1:]
    return targets


def verify(out_dir: str | Path, model: Transformer, tokens: Tensor, atol: float | None = None) -> dict:
    """Load ``out_dir`` with ``transformers.AutoModelForCausalLM`` (fp32) and compare it with ``model``.

    ``tokens``: ``(B, T)`` token ids, ``T <= max_seq_len``. Checks that loading reports no missing,
    unexpected or mismatched keys, that the logits ``(B, T, V)`` agree within ``atol · max(1, max |logit|)``
    (the largest absolute difference over every logit, against a tolerance that scales with the logits' size as
    float32 rounding does; ``atol`` default ``VERIFY_ATOL``, ``VERIFY_ATOL_REMOTE`` for the custom architecture,
    which is loaded with ``trust_remote_code=True``), that the mean next-token loss agrees within
    ``atol · max(1, |loss|)`` nats (transformers with ``labels=tokens``, which it shifts; ours from
    ``forward(tokens, targets)``), and that greedy decoding from the first tokens of ``tokens[0]`` gives the same
    ids (transformers' ``generate`` with its KV cache vs our uncached argmax). A bfloat16 export of a plain family is
    compared with our folded model rounded to bfloat16 (the weights it holds), computed in fp32; a bfloat16 custom
    export (whose folded weights have no scalevec counterpart) only with a loss tolerance of 0.05 nats. Prints
    the figures and returns ``{"max_abs_logit_diff", "loss_ours", "loss_hf", "greedy_equal",
    "loading_info"}``. Raises ``VerifyError`` on a mismatch.
    """
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from scalevec.hf.sampling import sample

    hf_logging.disable_progress_bar()
    out_dir = Path(out_dir)
    config = read_config_json(out_dir)
    remote = "auto_map" in config
    atol = atol if atol is not None else (VERIFY_ATOL_REMOTE if remote else VERIFY_ATOL)
    hf, info = AutoModelForCausalLM.from_pretrained(str(out_dir), dtype=torch.float32, output_loading_info=True,
                                                    trust_remote_code=remote)
    hf.eval()
    p0 = next(model.parameters())
    ref = model if (p0.dtype, p0.device.type) == (torch.float32, "cpu") else copy.deepcopy(model).float().cpu()
    exported_dtype = config.get("dtype", "float32")
    logit_atol = atol
    if exported_dtype != "float32" and remote:
        atol, logit_atol = 0.05, float("inf")
    elif exported_dtype != "float32":
        ref = fold_scales(ref)
        with torch.no_grad():
            for p in ref.parameters():
                p.copy_(p.to(getattr(torch, exported_dtype)).float())  # the weights the export holds
    ref.eval()
    tokens = tokens.long().cpu()
    with torch.no_grad():
        ours = ref(tokens)
        ce, n, _ = ref(tokens, shifted_targets(tokens))
        result = hf(input_ids=tokens, labels=tokens)
        prompt = tokens[:1, :min(4, tokens.shape[1])]
        n_new = min(16, model.cfg.max_seq_len - prompt.shape[1])
        eos = config.get("eos_token_id")
        greedy_ours = sample(ref, prompt[0].tolist(), n_new, temperature=0.0, eos_id=eos)
        greedy_hf = hf.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=n_new,
                                do_sample=False, eos_token_id=eos, pad_token_id=config.get("pad_token_id", eos))
        greedy_hf = greedy_hf[0, prompt.shape[1]:].tolist()
    diff = (ours - result.logits).abs().max().item()
    peak = ours.abs().max().item()  # the size of the logits: float32 rounding is relative to it
    logit_atol = logit_atol * max(1.0, peak)
    loss_ours, loss_hf = (ce / n).item(), result.loss.item()
    greedy_equal = greedy_ours == greedy_hf
    bad_keys = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
    how = " (custom code, trust_remote_code=True)" if remote else ""
    print(f"verify: {type(hf).__name__} loaded by transformers{how}, {tokens.shape[0]}x{tokens.shape[1]} tokens")
    print(f"  loading: missing/unexpected/mismatched keys: {bad_keys or 'none'}")
    tol = ("none: a bfloat16 custom export is checked by its loss" if logit_atol == float("inf")
           else f"{logit_atol:.3g} = {atol:g} x max(1, largest |logit| {peak:.3g})")
    print(f"  logits: max |ours - transformers| over all {ours.numel():,} logits = {diff:.3e} (tolerance {tol})")
    print(f"  loss:   ours {loss_ours:.6f}  transformers {loss_hf:.6f} nats/token (|diff| "
          f"{abs(loss_ours - loss_hf):.3e}, tolerance {atol * max(1.0, abs(loss_ours)):.3g})")
    print(f"  greedy: {len(greedy_ours)} ids from a {prompt.shape[1]}-token prompt "
          f"{'equal' if greedy_equal else 'DIFFER'} (transformers generate() with its KV cache)")
    problems = []
    if bad_keys:
        problems.append(f"loading reported {bad_keys}")
    if not diff <= logit_atol:
        problems.append(f"logits differ by {diff:.3e} > {logit_atol:.3g} (= {atol:g} x max(1, largest |logit| "
                        f"{peak:.3g}))")
    if not abs(loss_ours - loss_hf) <= atol * max(1.0, abs(loss_ours)):
        problems.append(f"losses differ: ours {loss_ours:.6f}, transformers {loss_hf:.6f} (tolerance {atol:g} x "
                        f"max(1, |loss|))")
    if not greedy_equal and exported_dtype == "float32":
        problems.append(f"greedy ids differ: ours {greedy_ours}, transformers {greedy_hf}")
    if problems:
        raise VerifyError("verify failed: " + "; ".join(problems))
    print("  verify: OK")
    return {"max_abs_logit_diff": diff, "loss_ours": loss_ours, "loss_hf": loss_hf, "greedy_equal": greedy_equal,
            "loading_info": info}


def verify_tokens(cfg, n_seq: int = 4) -> tuple[Tensor, str]:
    """``(tokens (n_seq, T), where they come from)`` for ``verify``: the first held-out sequences of the
    run's validation split (DESIGN.md §8), or, when its data cannot be prepared here, seeded random ids."""
    seq_len = min(cfg.train.seq_len, cfg.model.max_seq_len)
    try:
        from scalevec.data.corpus import prepare_data
        from scalevec.data.sampler import val_batches

        batches, _ = val_batches(prepare_data(cfg.data), seq_len, cfg.data.val_tokens, n_seq)
        x = batches[0][0].long()
        if int(x.max()) >= cfg.model.vocab_size:
            raise ValueError(f"its token ids exceed the model's vocabulary of {cfg.model.vocab_size}")
        return x, f"{x.shape[0]}x{x.shape[1]} validation tokens of {cfg.data.source}"
    except (ImportError, OSError, ValueError) as e:
        g = torch.Generator().manual_seed(0)
        x = torch.randint(0, cfg.model.vocab_size, (n_seq, seq_len), generator=g)
        return x, f"{n_seq}x{seq_len} random tokens (the run's validation data is not available here: {e})"

"""``scalevec generate``: sample text from a run directory or an exported Hugging Face directory (§10).

So that a user can look at what a model learned. One sampling loop serves both sources: our
``Transformer`` (a run directory: ``config.yaml``, checkpoints, ``tokenizer/``) and a checkpoint written
by ``scalevec export`` (``config.json``, loaded with transformers). Temperature 0 is greedy decoding;
otherwise softmax sampling at temperature T, optionally restricted to the top k tokens, from a seeded
``torch.Generator`` (the same seed gives the same text). The prompt is preceded by BOS when the
tokenizer has one (documents start with BOS in training, DESIGN.md §8; a ``bytes`` model, which has no
special tokens, starts from a newline, the last byte of the separator before every training document:
``data.tokenizer.BYTES_PREFIX``); generation stops at EOS.

With a KV cache (the default) the prompt is run once and each step feeds only the new token, whose
queries attend to every cached key (``model.Transformer.decode``; a transformers ``Cache`` for an
exported directory): greedy output equals the uncached path, which reruns the whole (cropped) context
every step (``--no-cache``). Once the text outgrows the model's context the cache is dropped and each
step reruns the last ``context`` tokens, exactly as the uncached path does.
"""

from __future__ import annotations

import argparse
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

LogitsFn = Callable[[Tensor], Tensor]  # tokens (1, T) -> logits (1, T, V)
# (new tokens (1, T), cache or None to start) -> (logits (1, T, V), the cache extended by those tokens)
CachedFn = Callable[[Tensor, object], tuple[Tensor, object]]


@dataclass
class TextModel:
    """What sampling needs from a model source: its logits, its tokenizer, its context length."""

    logits: LogitsFn
    encode: Callable[[str], list[int]]
    decode: Callable[[list[int]], str]
    bos_id: int | None
    eos_id: int | None
    context: int  # the longest input the model accepts (max_seq_len / max_position_embeddings)
    cached: CachedFn | None = None  # the same logits with a KV cache


def check_sampling(max_new_tokens: int, temperature: float, top_k: int | None) -> None:
    """Raise ``ValueError`` for ``max_new_tokens < 1``, ``temperature < 0`` (or NaN) or ``top_k < 1``."""
    if max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens={max_new_tokens} must be >= 1 (default 200)")
    if not temperature >= 0:
        raise ValueError(f"--temperature={temperature} must be >= 0 (0 = greedy)")
    if top_k is not None and top_k < 1:
        raise ValueError(f"--top-k={top_k} must be >= 1 (or leave it out for the full distribution)")


def sample(logits_fn: LogitsFn, prompt: list[int], max_new_tokens: int, temperature: float = 1.0,
           top_k: int | None = None, seed: int = 0, context: int | None = None,
           eos_id: int | None = None, cached: CachedFn | None = None) -> list[int]:
    """Autoregressively sample up to ``max_new_tokens`` token ids after ``prompt``; return the new ids.

    ``logits_fn`` maps ``(1, T)`` ids to ``(1, T, V)`` logits; each step feeds the last ``context`` ids.
    With ``cached`` (a ``CachedFn``) the prompt is fed once and then one new id per step, while the text
    fits in ``context``; past it every step reruns the last ``context`` ids through ``logits_fn``.
    ``temperature == 0``: greedy (argmax of the last position's logits). Otherwise the next id is drawn
    from ``softmax(logits / temperature)`` restricted to the ``top_k`` largest logits when given, with a
    ``torch.Generator`` seeded by ``seed``. Stops after emitting ``eos_id``. Raises ``ValueError`` for an
    empty prompt, ``max_new_tokens < 0``, ``temperature < 0`` or ``top_k < 1``.
    """
    check_sampling(max_new_tokens, temperature, top_k)
    if not prompt:
        raise ValueError("the prompt encodes to no tokens and the tokenizer has no BOS; pass a non-empty --prompt")
    gen = torch.Generator().manual_seed(seed)
    ids = list(prompt)
    cache, n_cached = None, 0
    with torch.no_grad():
        for _ in range(max_new_tokens):
            if cached is not None and (not context or len(ids) <= context):
                out, cache = cached(torch.tensor([ids[n_cached:]]), cache)  # only the tokens not yet cached
                n_cached = len(ids)
            else:
                out = logits_fn(torch.tensor([ids[-context:] if context else ids]))
            logits = out[0, -1].float().cpu()  # (V,)
            if temperature == 0:
                nxt = int(logits.argmax())
            else:
                logits = logits / temperature
                if top_k is not None and top_k < logits.numel():
                    kth = torch.topk(logits, top_k).values[-1]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                nxt = int(torch.multinomial(torch.softmax(logits, -1), 1, generator=gen))
            ids.append(nxt)
            if nxt == eos_id:
                break
    return ids[len(prompt):]


def load_text_model(path: str | Path, device: str = "cpu") -> TextModel:
    """A ``TextModel`` for a scalevec run directory (``config.yaml``) or an exported HF directory
    (``config.json``). Raises ``FileNotFoundError`` when ``path`` is neither."""
    path = Path(path)
    if (path / "config.yaml").is_file():
        return _run_text_model(path, device)
    if (path / "config.json").is_file():
        return _hf_text_model(path, device)
    raise FileNotFoundError(f"{path} is neither a scalevec run directory (config.yaml) nor an exported Hugging Face "
                            f"directory (config.json); pass one of those")


def _run_text_model(run_dir: Path, device: str) -> TextModel:
    from scalevec.data.tokenizer import start_token
    from scalevec.model.transformer import KVCache
    from scalevec.training.rundir import load_model, load_tokenizer

    cfg, model, _ = load_model(run_dir, device=device)  # verified against its manifest; a dead model is refused
    model.eval()
    tok = load_tokenizer(run_dir)

    def cached(x: Tensor, cache: KVCache | None) -> tuple[Tensor, KVCache]:
        cache = cache if cache is not None else KVCache(cfg.model.n_layers)
        return model.decode(x.to(device), cache), cache

    return TextModel(logits=lambda x: model(x.to(device)), encode=tok.encode, decode=tok.decode,
                     bos_id=start_token(tok), eos_id=tok.eos_id, context=cfg.model.max_seq_len, cached=cached)


def _hf_text_model(hf_dir: Path, device: str) -> TextModel:
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).to(device).eval()
    if not (hf_dir / "tokenizer.json").is_file():
        raise FileNotFoundError(f"{hf_dir} has no tokenizer.json; export with the run's tokenizer (scalevec export "
                                "RUN_DIR)")
    tok = PreTrainedTokenizerFast.from_pretrained(str(hf_dir))
    # transformers 5 names the cache `cache`, 4.x `past_key_values` (input and output alike)
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def cached(x: Tensor, cache):
        out = model(input_ids=x.to(device), use_cache=True, **({name: cache} if cache is not None else {}))
        return out.logits, next(out[k] for k in ("cache", "past_key_values") if out.get(k) is not None)

    # the new ids hold no BOS and the EOS is cut off by the caller: decode every id (a bytes export's
    # BOS is the newline byte, which skip_special_tokens would drop from the text)
    return TextModel(logits=lambda x: model(input_ids=x.to(device)).logits,
                     encode=lambda text: tok.encode(text, add_special_tokens=False),
                     decode=lambda ids: tok.decode(ids, skip_special_tokens=False),
                     bos_id=tok.bos_token_id, eos_id=tok.eos_token_id,
                     context=model.config.max_position_embeddings, cached=cached)


def generate_ids(path: str | Path, prompt: str, max_new_tokens: int = 200, temperature: float = 0.8,
                 top_k: int | None = None, seed: int = 0, device: str = "cpu",
                 use_cache: bool = True) -> tuple[list[int], TextModel]:
    """``(new token ids, the TextModel)`` sampled after ``[BOS] + encode(prompt)`` from the model at ``path``
    (run or exported HF dir), with a KV cache unless ``use_cache=False``; see ``sample``. Raises
    ``ValueError`` for bad sampling arguments (before loading anything) and ``FileNotFoundError`` for a
    path that holds no model."""
    check_sampling(max_new_tokens, temperature, top_k)
    g = load_text_model(path, device)
    ids = ([g.bos_id] if g.bos_id is not None else []) + g.encode(prompt)
    return sample(g.logits, ids, max_new_tokens, temperature, top_k, seed, g.context, g.eos_id,
                  g.cached if use_cache else None), g


def generate_text(path: str | Path, prompt: str, max_new_tokens: int = 200, temperature: float = 0.8,
                  top_k: int | None = None, seed: int = 0, device: str = "cpu", use_cache: bool = True) -> str:
    """The text sampled after ``prompt`` (prompt and a final EOS excluded); arguments as ``generate_ids``."""
    new, g = generate_ids(path, prompt, max_new_tokens, temperature, top_k, seed, device, use_cache)
    if new and new[-1] == g.eos_id:
        new = new[:-1]
    return g.decode(new)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", metavar="RUN_DIR_OR_HF_DIR", help="a scalevec run directory or a `scalevec export` output")
    p.add_argument("--prompt", required=True, help="the text to continue")
    p.add_argument("--max-new-tokens", type=int, default=200, help="at most this many new tokens (default 200)")
    p.add_argument("--temperature", type=float, default=0.8, help="sampling temperature; 0 = greedy (default 0.8)")
    p.add_argument("--top-k", type=int, default=None, help="sample only among the k most likely tokens")
    p.add_argument("--seed", type=int, default=0, help="sampling seed: the same seed gives the same text")
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    p.add_argument("--no-cache", action="store_true",
                   help="rerun the whole context every step instead of using a KV cache (same greedy text, slower)")


def check_device(device: str) -> None:
    """Raise ``ValueError`` unless ``device`` is ``cpu``, or ``cuda``/``cuda:N`` on a machine that has it."""
    if device != "cpu" and device != "cuda" and not (device.startswith("cuda:") and device[5:].isdigit()):
        raise ValueError(f"--device {device!r} is unknown; use cpu or cuda (cuda:N)")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: this machine (or this torch build) has no CUDA; use --device cpu")


def run(args: argparse.Namespace) -> int:
    check_device(args.device)
    text = generate_text(args.path, args.prompt, args.max_new_tokens, args.temperature, args.top_k, args.seed,
                         args.device, not args.no_cache)
    print(args.prompt + text)
    return 0

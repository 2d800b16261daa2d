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

What is trusted in an exported directory (``check_hf_dir``, the one rule ``generate`` and ``eval`` both
apply before transformers loads anything): its weights only as safetensors (a pickled
``pytorch_model.bin`` runs code when unpickled and is never loaded), and its custom code (an ``auto_map``
in config.json or tokenizer_config.json, which transformers imports and runs) only when every Python
file it names, and every ``.py`` file in the directory, is byte-identical (sha256) to the code this
scalevec ships (``scalevec/hf/remote``): scalevec's own custom-code exports load as they are, anything
else needs ``--trust-remote-code``. A directory without custom code needs no trust.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
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


def shipped_code_hashes() -> dict[str, str]:
    """``{file name: sha256 of its bytes}`` of the custom code this scalevec ships (``scalevec/hf/remote``),
    which ``scalevec export`` copies byte for byte into every custom-code export."""
    from importlib import resources

    from scalevec.hf.export import REMOTE_FILES

    src = resources.files("scalevec.hf.remote")
    return {name: hashlib.sha256(src.joinpath(name).read_bytes()).hexdigest() for name in REMOTE_FILES}


def _auto_map_refs(hf_dir: Path) -> list[tuple[str, str]]:
    """``(file, class reference)`` of every ``auto_map`` entry of config.json and tokenizer_config.json:
    what transformers would import from the directory. Raises ``ValueError`` for a file that is not JSON
    or an ``auto_map`` that is not a mapping of references (not checkable, so not trusted)."""
    refs = []
    for name in ("config.json", "tokenizer_config.json"):
        f = hf_dir / name
        if not f.is_file():
            continue
        try:
            conf = json.loads(f.read_text(encoding="utf-8"))
        except ValueError as e:
            raise ValueError(f"{f} is not valid JSON ({e}); fix it or export the model again") from None
        auto_map = conf.get("auto_map") if isinstance(conf, dict) else None
        if not auto_map:
            continue
        if not isinstance(auto_map, dict):
            raise ValueError(f"{f} has an auto_map that is not a mapping ({auto_map!r}); fix it, or pass "
                             f"--trust-remote-code if you trust the directory's code")
        for value in auto_map.values():
            for ref in value if isinstance(value, list) else [value]:  # a tokenizer maps to [slow, fast]
                if ref is not None and not isinstance(ref, str):
                    raise ValueError(f"{f} has an auto_map entry {ref!r} that is not a class reference; fix it, "
                                     f"or pass --trust-remote-code if you trust the directory's code")
                if ref is not None:
                    refs.append((name, ref))
    return refs


def custom_code_trusted(hf_dir: str | Path, trust_remote_code: bool = False) -> bool:
    """The ``trust_remote_code`` to load ``hf_dir`` with: False without custom code (no ``auto_map``), True
    with ``trust_remote_code`` or when the code is scalevec's own (module docstring). Raises ``ValueError``
    naming the first Python file that differs from the shipped code (or is missing, or lives in another
    repository) and telling the user to pass ``--trust-remote-code`` if they trust it."""
    hf_dir = Path(hf_dir)
    refs = _auto_map_refs(hf_dir)
    if not refs:
        return False
    if trust_remote_code:
        return True
    fix = "pass --trust-remote-code if you trust it (transformers runs it when loading the model)"
    files = set()
    for source, ref in refs:
        if "--" in ref:  # "repo--module.Class": code transformers would fetch from another repository
            raise ValueError(f"{hf_dir / source}'s auto_map takes code from another repository ({ref}), which "
                             f"scalevec cannot check; {fix}")
        files.add(ref.rsplit(".", 1)[0] + ".py")  # module.Class -> module.py, as transformers resolves it
    files |= {str(f.relative_to(hf_dir)) for f in hf_dir.rglob("*.py")}
    shipped = set(shipped_code_hashes().values())
    for name in sorted(files):
        f = hf_dir / name
        if not f.is_file():
            raise ValueError(f"{hf_dir}'s auto_map names {name}, which the directory does not hold; export the "
                             f"model again, or {fix}")
        if hashlib.sha256(f.read_bytes()).hexdigest() not in shipped:
            raise ValueError(f"{f} is not the custom code this scalevec ships (its sha256 differs from "
                             f"scalevec/hf/remote's) and would run on loading; {fix}")
    return True


def check_hf_dir(hf_dir: str | Path, trust_remote_code: bool = False) -> bool:
    """Check an exported Hugging Face directory before transformers loads anything from it; return the
    ``trust_remote_code`` to load it with (``custom_code_trusted``). Its weights must be safetensors
    (``hf_import.weight_files``). Raises ``FileNotFoundError`` without safetensors (a pickled
    ``pytorch_model.bin`` is never loaded) and ``ValueError`` for a shard outside the directory or
    custom code that is not scalevec's and not trusted."""
    from scalevec.hf.hf_import import weight_files

    weight_files(hf_dir)
    return custom_code_trusted(hf_dir, trust_remote_code)


def load_text_model(path: str | Path, device: str = "cpu", trust_remote_code: bool = False) -> TextModel:
    """A ``TextModel`` for a scalevec run directory (``config.yaml``) or an exported HF directory
    (``config.json``, checked by ``check_hf_dir``). Raises ``FileNotFoundError`` when ``path`` is
    neither, and as ``check_hf_dir``."""
    path = Path(path)
    if (path / "config.yaml").is_file():
        return _run_text_model(path, device)
    if (path / "config.json").is_file():
        return _hf_text_model(path, device, trust_remote_code)
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


def _hf_text_model(hf_dir: Path, device: str, trust_remote_code: bool = False) -> TextModel:
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast
    from transformers.utils import logging as hf_logging

    trust = check_hf_dir(hf_dir, trust_remote_code)
    if not (hf_dir / "tokenizer.json").is_file():
        raise FileNotFoundError(f"{hf_dir} has no tokenizer.json; export with the run's tokenizer (scalevec export "
                                "RUN_DIR)")
    hf_logging.disable_progress_bar()
    # use_safetensors: transformers must never fall back to unpickling a pytorch_model.bin
    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32, trust_remote_code=trust,
                                                 use_safetensors=True).to(device).eval()
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
                 use_cache: bool = True, trust_remote_code: bool = False) -> tuple[list[int], TextModel]:
    """``(new token ids, the TextModel)`` sampled after ``[BOS] + encode(prompt)`` from the model at ``path``
    (run or exported HF dir), with a KV cache unless ``use_cache=False``; see ``sample``. Raises
    ``ValueError`` for bad sampling arguments (before loading anything) or custom code that is not
    scalevec's without ``trust_remote_code`` (``check_hf_dir``), and ``FileNotFoundError`` for a path
    that holds no model."""
    check_sampling(max_new_tokens, temperature, top_k)
    g = load_text_model(path, device, trust_remote_code)
    ids = ([g.bos_id] if g.bos_id is not None else []) + g.encode(prompt)
    return sample(g.logits, ids, max_new_tokens, temperature, top_k, seed, g.context, g.eos_id,
                  g.cached if use_cache else None), g


def generate_text(path: str | Path, prompt: str, max_new_tokens: int = 200, temperature: float = 0.8,
                  top_k: int | None = None, seed: int = 0, device: str = "cpu", use_cache: bool = True,
                  trust_remote_code: bool = False) -> str:
    """The text sampled after ``prompt`` (prompt and a final EOS excluded); arguments as ``generate_ids``."""
    new, g = generate_ids(path, prompt, max_new_tokens, temperature, top_k, seed, device, use_cache,
                          trust_remote_code)
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
    add_trust_argument(p)


def add_trust_argument(p: argparse.ArgumentParser) -> None:
    """``--trust-remote-code``, shared by ``generate`` and ``eval`` (``check_hf_dir``)."""
    p.add_argument("--trust-remote-code", action="store_true",
                   help="run an exported directory's custom Python code even when it is not the code this scalevec "
                        "ships (scalevec's own custom-code exports load without it)")


def check_device(device: str) -> None:
    """Raise ``ValueError`` unless ``device`` is ``cpu``, or ``cuda``/``cuda:N`` on a machine that has it."""
    if device != "cpu" and device != "cuda" and not (device.startswith("cuda:") and device[5:].isdigit()):
        raise ValueError(f"--device {device!r} is unknown; use cpu or cuda (cuda:N)")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: this machine (or this torch build) has no CUDA; use --device cpu")


def run(args: argparse.Namespace) -> int:
    check_device(args.device)
    text = generate_text(args.path, args.prompt, args.max_new_tokens, args.temperature, args.top_k, args.seed,
                         args.device, not args.no_cache, args.trust_remote_code)
    print(args.prompt + text)
    return 0

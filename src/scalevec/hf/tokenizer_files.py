"""The tokenizer files of an export, with the special tokens declared that outside tools need (DESIGN.md §8, §10).

``scalevec export`` (and ``scalevec generate`` on a run) write the run's tokenizer so that tools that know
nothing of scalevec (lm-evaluation-harness) find a BOS, a pad and a loglikelihood prefix token: a
tokenizer with no special tokens at all (``bytes``) gets the newline byte as BOS and pad
(``BYTES_PREFIX``; in training every document follows a newline), added by its post-processor as a BOS
would be; a missing pad is the EOS. This module reads a tokenizer directory and writes its files; it does
not choose the format or write the weights (``export.py``).

Needs the optional dependency ``transformers`` (``pip install 'scalevec[hf]'``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from scalevec.config.files import load_json
from scalevec.data.tokenizer import BYTES_PREFIX

# the files of a Hugging Face tokenizer directory that ``write_tokenizer`` writes (the last only when the source has it)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
FIX = "restore the tokenizer folder from a copy of the run, or retrain the run"  # a source file that does not read


@dataclass
class Specials:
    """The special tokens an export declares (DESIGN.md §8, §10): ``bos``/``eos``/``pad`` as
    ``(token, id)`` or None; ``add_bos``: the exported tokenizer's post-processor must prepend BOS
    (the source tokenizer had none: a ``bytes`` tokenizer, whose BOS is ``BYTES_PREFIX``)."""

    bos: tuple[str, int] | None
    eos: tuple[str, int] | None
    pad: tuple[str, int] | None
    add_bos: bool
    n_tokens: int


def tokenizer_specials(tokenizer_dir: str | Path) -> Specials:
    """The ``Specials`` of a tokenizer directory, read with ``PreTrainedTokenizerFast``: its own BOS/EOS;
    with neither, the token of ``BYTES_PREFIX`` as BOS (prepended on encoding); pad: its own, else EOS,
    else BOS. lm-evaluation-harness needs a BOS or EOS as loglikelihood prefix and a pad token.
    Raises ``FileNotFoundError`` when ``tokenizer.json`` is missing."""
    from transformers import PreTrainedTokenizerFast

    tokenizer_dir = Path(tokenizer_dir)
    if not (tokenizer_dir / "tokenizer.json").is_file():
        raise FileNotFoundError(f"{tokenizer_dir / 'tokenizer.json'} does not exist; pass the run's tokenizer/ "
                                f"directory (it holds tokenizer.json and tokenizer_config.json)")
    tok = PreTrainedTokenizerFast.from_pretrained(str(tokenizer_dir))

    def pair(token):
        return (str(token), tok.convert_tokens_to_ids(str(token))) if token is not None else None

    bos, eos, pad, add_bos = pair(tok.bos_token), pair(tok.eos_token), pair(tok.pad_token), False
    if bos is None and eos is None:
        ids = tok.encode(BYTES_PREFIX, add_special_tokens=False)
        if len(ids) == 1:
            bos, add_bos = (tok.convert_ids_to_tokens(ids[0]), ids[0]), True
    return Specials(bos, eos, pad or eos or bos, add_bos, len(tok))


def tokenizer_ids(tokenizer_dir: str | Path) -> tuple[int | None, int | None, int]:
    """``(bos_id, eos_id, vocab size)`` of an exported tokenizer (``tokenizer_specials``).
    Raises ``FileNotFoundError`` when ``tokenizer.json`` is missing."""
    sp = tokenizer_specials(tokenizer_dir)
    return (sp.bos[1] if sp.bos else None), (sp.eos[1] if sp.eos else None), sp.n_tokens


def write_tokenizer(tokenizer_dir: Path, out: Path, sp: Specials, max_len: int) -> None:
    """Write the tokenizer of ``tokenizer_dir`` into ``out`` with ``sp`` declared: tokenizer.json (a BOS
    post-processor added when ``sp.add_bos``) and tokenizer_config.json (bos/eos/pad tokens, class
    ``PreTrainedTokenizerFast`` that every transformers version has, ``model_max_length = max_len``)."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import processors

    hf = HFTokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    if sp.add_bos:
        hf.post_processor = processors.TemplateProcessing(single=f"{sp.bos[0]} $A", pair=f"{sp.bos[0]} $A $B:1",
                                                          special_tokens=[sp.bos])
    hf.save(str(out / "tokenizer.json"))
    src = tokenizer_dir / "tokenizer_config.json"
    config = load_json(src, "tokenizer config", FIX) if src.is_file() else {}
    if not isinstance(config, dict):
        raise ValueError(f"tokenizer config {src} is not a JSON object; {FIX}")
    config.update(tokenizer_class="PreTrainedTokenizerFast", model_max_length=max_len)
    for key, value in (("bos_token", sp.bos), ("eos_token", sp.eos), ("pad_token", sp.pad)):
        if value is not None:
            config[key] = value[0]
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n",
                                               encoding="utf-8")
    special_map = tokenizer_dir / "special_tokens_map.json"
    if special_map.is_file():
        smap = load_json(special_map, "special tokens map", FIX)
        if not isinstance(smap, dict):
            raise ValueError(f"special tokens map {special_map} is not a JSON object; {FIX}")
        smap.update({k: config[k] for k in ("bos_token", "eos_token", "pad_token") if k in config})
        (out / "special_tokens_map.json").write_text(json.dumps(smap, indent=2, ensure_ascii=False) + "\n",
                                                     encoding="utf-8")

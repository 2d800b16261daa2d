"""``scalevec eval``: downstream evaluation through lm-evaluation-harness (DESIGN.md §10).

Any model scalevec trains is scored with the tool the field uses: a run directory is first exported
(``export.export_run``, float32, into a temporary directory: a plain Llama-family checkpoint, or the
custom architecture for what cannot fold) and an exported directory is used as it is; lm-eval's own
Hugging Face backend (``HFLM``) then runs the tasks. So a run and its export are scored by the same
code on the same weights, and what ``scalevec eval`` reports is what ``lm_eval --model hf --model_args
pretrained=DIR,trust_remote_code=True`` reports. An exported directory is checked first
(``generate.check_hf_dir``): safetensors weights only, each whole, and custom code only when it is byte for
byte the code this scalevec ships, or with ``--trust-remote-code``; then loaded once by ``generate.load_hf_dir``,
which refuses a bad tokenizer and weights that config.json does not describe (lm-eval would score the
randomly initialised model), before lm-eval loads it again. The export declares the BOS/pad/prefix
tokens lm-eval needs, also for the ``bytes`` tokenizer (``tokenizer_files.tokenizer_specials``).

Scores are merged into ``eval.json`` in the evaluated directory (one entry per task: every metric and
its standard error, lm-eval's version, few-shot count, limit and the date); ``scalevec report`` adds
them to ``runs.csv`` next to the losses as ``eval.<task>.<metric>`` columns (``eval_results.eval_columns``).

``scalevec_shakespeare`` is a small multiple-choice task built from the bundled corpus (pick the true
next line of a Shakespeare passage among 4 lines), written in lm-eval's YAML task format
(``write_shakespeare_task``): it needs no download, so it runs offline and in the tests. It is a smoke
test of the pipeline, not a benchmark.

Needs the optional dependency ``lm-eval`` (``pip install 'scalevec[eval]'``).

``--text FILE`` needs no lm-eval and no hub: held-out perplexity, nats/token and bits-per-byte of a
local UTF-8 text file, or of the validation split of a ``scalevec prepare-data`` folder, computed by scalevec
(``training.perplexity``: the trainer's validation windows and definitions) with the model's own tokenizer
(``tokenizer/`` of a run, the tokenizer files of an export; both are ``data.tokenizer.Tokenizer``, so a run
and its export see the same ids). The logits come from ``generate.load_text_model`` (our ``Transformer`` for
a run, transformers for an export, through ``load_hf_dir``'s checks). Printed only, nothing written.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import tempfile
import time
from pathlib import Path

from scalevec.training import rundir
from scalevec.training.eval_results import main_metrics, write_eval
from scalevec.training.rundir import EVAL

SHAKESPEARE_TASK = "scalevec_shakespeare"
STANDARD_TASKS = "hellaswag,arc_easy,arc_challenge,lambada_openai,piqa"


def write_shakespeare_task(directory: str | Path, n_items: int = 48, seed: int = 0) -> Path:
    """Write lm-eval task ``scalevec_shakespeare`` (YAML + JSON lines) into ``directory``; return the YAML.

    Each item: a passage of 3 consecutive lines of the bundled Shakespeare (its last works, so mostly the
    validation split of DESIGN.md §8), and 4 candidate next lines, the true one and 3 other lines of the
    corpus drawn with ``seed``; the continuation is scored after a newline (``target_delimiter``), so
    the model sees text laid out as in training. Metrics: ``acc`` and ``acc_norm`` (by byte length).
    """
    from scalevec.data.documents import load_documents

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    lines = [ln.strip() for doc in load_documents("shakespeare")[-3:] for ln in doc.splitlines()]
    verse = sorted({ln for ln in lines if len(ln) >= 20})  # candidates: not speaker names or stage directions
    # passages of 4 consecutive verse lines (3 of context, the 4th to find)
    starts = [i for i in range(len(lines) - 3) if all(len(ln) >= 20 for ln in lines[i:i + 4])]
    rng = random.Random(seed)
    items = []
    for start in rng.sample(starts, n_items):
        context, answer = lines[start:start + 3], lines[start + 3]
        others = rng.sample([ln for ln in verse if ln != answer], 3)
        label = rng.randrange(4)
        choices = others[:label] + [answer] + others[label:]
        items.append({"context": "\n".join(context), "choices": choices, "label": label})
    data = directory / f"{SHAKESPEARE_TASK}.jsonl"
    data.write_text("".join(json.dumps(it) + "\n" for it in items), encoding="utf-8")
    yaml = directory / f"{SHAKESPEARE_TASK}.yaml"
    yaml.write_text(f"""task: {SHAKESPEARE_TASK}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {json.dumps(str(data.resolve()))}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{context}}}}"
target_delimiter: "\\n"
doc_to_choice: choices
doc_to_target: label
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
  - metric: acc_norm
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
""", encoding="utf-8")
    return yaml


def _import_lm_eval():
    try:
        import lm_eval
        from lm_eval.models.huggingface import HFLM
        from lm_eval.tasks import TaskManager
    except ImportError as e:
        raise ValueError(f"scalevec eval needs lm-evaluation-harness ({e}); install it with "
                         f"pip install 'scalevec[eval]'") from None
    return lm_eval, HFLM, TaskManager


def fit_tokenizer_limit(lm) -> None:
    """Let ``lm``'s tokenizer warn only about what lm-eval will cut (not a "257 > 256" for every document).

    A loglikelihood request is encoded whole (context + continuation) and lm-eval feeds its last
    ``max_length + 1`` tokens minus the last one, a target only: ``max_length + 1`` tokens fit without a cut,
    and lm-eval warns itself beyond that. The export's tokenizer declares ``model_max_length =
    max_position_embeddings`` (right for the model's input), so transformers warned "Token indices sequence
    length is longer than ... (257 > 256)" for a request that fits exactly (a 256-byte item of
    ``scalevec_shakespeare`` plus BOS). Raising the limit of lm-eval's in-memory tokenizer by one makes the two
    agree; the export on disk is unchanged. Left alone when lm-eval took its ``max_length`` from the tokenizer
    (no context length in the model's config), which the raise would move."""
    limit = lm.max_length
    lm.tokenizer.model_max_length = limit + 1
    if lm.max_length != limit:
        lm.tokenizer.model_max_length = limit


DTYPES = ("auto", "float32", "bfloat16")


def eval_settings(device: str, dtype: str = "auto", batch_size: int | str = "auto") -> tuple[str, int | str]:
    """``(dtype, batch size)`` lm-eval runs with: ``auto`` dtype is bfloat16 on CUDA (as ``lm_eval --model hf``
    is usually run on a GPU) and float32 on CPU (bfloat16 matmuls are slow there and its rounding would move the
    scores); ``auto`` batch size is lm-eval's own search for the largest batch that fits on CUDA, and 8 on CPU
    (lm-eval's search probes for running out of GPU memory). Raises ``ValueError`` for an unknown dtype or a batch
    size that is not ``auto`` or an integer >= 1."""
    if dtype not in DTYPES:
        raise ValueError(f"--dtype {dtype!r} is unknown; use {', '.join(DTYPES)}")
    cuda = device.startswith("cuda")
    if dtype == "auto":
        dtype = "bfloat16" if cuda else "float32"
    if batch_size == "auto":
        return dtype, "auto" if cuda else 8
    if isinstance(batch_size, str):
        if not batch_size.isdigit():
            raise ValueError(f"--batch-size {batch_size!r} must be auto or an integer >= 1")
        batch_size = int(batch_size)
    if batch_size < 1:
        raise ValueError(f"--batch-size {batch_size} must be auto or an integer >= 1")
    return dtype, batch_size


def evaluate_hf_dir(hf_dir: str | Path, tasks: list[str], num_fewshot: int | None = None,
                    limit: int | float | None = None, batch_size: int | str = "auto", device: str = "cpu",
                    include_path: str | Path | None = None, trust_remote_code: bool = False,
                    dtype: str = "auto") -> dict:
    """Run lm-eval ``tasks`` on an exported Hugging Face directory; return ``{task: {metric: value}}``.

    Metric keys are lm-eval's (``"acc,none"``, ``"acc_stderr,none"``, ...). ``dtype`` and ``batch_size``: as
    ``eval_settings`` (``auto``: bfloat16 and lm-eval's batch search on CUDA, float32 and 8 on CPU).
    ``scalevec_shakespeare`` is written to a temporary directory when asked for; ``include_path`` adds a folder
    of user task YAMLs.
    The directory is checked first (``generate.check_hf_dir``): custom code that is not scalevec's runs
    only with ``trust_remote_code``. Raises ``ValueError`` without lm-eval, for a task name lm-eval does
    not know, for untrusted custom code, a truncated safetensors file, a bad tokenizer or weights that
    config.json does not describe (``generate.load_hf_dir``), and ``FileNotFoundError`` for a directory
    without safetensors.
    """
    from scalevec.hf.generate import check_hf_dir, load_hf_dir

    if include_path is not None and not Path(include_path).is_dir():
        raise FileNotFoundError(f"--include-path {include_path} is not a folder; pass a folder of lm-eval task YAML "
                                f"files")
    dtype, batch_size = eval_settings(device, dtype, batch_size)
    trust = check_hf_dir(hf_dir, trust_remote_code)  # before lm-eval or transformers touch the directory
    lm_eval, HFLM, TaskManager = _import_lm_eval()
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    with tempfile.TemporaryDirectory(prefix="scalevec-tasks-") as tmp:
        paths = [str(include_path)] if include_path else []
        if SHAKESPEARE_TASK in tasks:
            write_shakespeare_task(tmp)
            paths.append(tmp)
        # indexing lm-eval's thousands of built-in task files takes most of a minute on a small CPU: skip it
        # when the local folders hold every task asked for
        manager = TaskManager(include_path=paths, include_defaults=False) if paths else None
        if manager is None or not all(manager.match_tasks([t]) for t in tasks):
            manager = TaskManager(include_path=paths or None)
        unknown = [t for t in tasks if not manager.match_tasks([t])]
        if unknown:
            raise ValueError(f"lm-eval knows no task {', '.join(unknown)}; see `lm_eval ls tasks` (standard: "
                             f"{STANDARD_TASKS}; offline: {SHAKESPEARE_TASK}), or pass --include-path DIR")
        # lm-eval loads the model itself and keeps transformers' loading report to a log: a model_type or size
        # edited in config.json would be scored as a randomly initialised model. Load it once through the
        # checked loader (refused there, one line); the result is dropped, freed before lm-eval loads its copy.
        load_hf_dir(hf_dir, trust)
        # use_safetensors (passed on to from_pretrained): never fall back to unpickling a pytorch_model.bin
        lm = HFLM(pretrained=str(hf_dir), trust_remote_code=trust, dtype=dtype, device=device,
                  batch_size=batch_size, use_safetensors=True)
        fit_tokenizer_limit(lm)
        out = lm_eval.simple_evaluate(model=lm, tasks=tasks, num_fewshot=num_fewshot, limit=limit,
                                      task_manager=manager, log_samples=False, bootstrap_iters=1000)
    return {task: {k: v for k, v in metrics.items() if k != "alias"} for task, metrics in out["results"].items()}


def evaluate(path: str | Path, tasks: list[str], num_fewshot: int | None = None, limit: int | float | None = None,
             batch_size: int | str = "auto", device: str = "cpu", include_path: str | Path | None = None,
             write: bool = True, trust_remote_code: bool = False, dtype: str = "auto") -> dict:
    """Evaluate a run directory (exported to a temporary float32 directory first) or an exported HF
    directory with ``evaluate_hf_dir``; with ``write``, merge the scores into ``path/eval.json``.
    Returns ``{task: {metric: value}}``. Raises ``FileNotFoundError`` for a path that holds no model and
    as ``evaluate_hf_dir`` (``trust_remote_code``: run custom code that is not scalevec's)."""
    path = Path(path)
    if write:
        check_eval_file(path)  # before the evaluation: a file the scores cannot merge into is refused now
    if rundir.model_dir_kind(path) == "run":
        from scalevec.hf.export import export_run

        if not (rundir.tokenizer_dir(path) / "tokenizer.json").is_file():
            raise FileNotFoundError(f"{path} has no tokenizer/tokenizer.json, which lm-eval needs to turn task text "
                                    f"into ids; evaluate a run trained by scalevec train (it saves its tokenizer)")

        with tempfile.TemporaryDirectory(prefix="scalevec-eval-") as tmp:
            hf_dir = export_run(path, Path(tmp) / "hf")
            # our own fresh export: its code is the shipped code, trusted without the flag
            results = evaluate_hf_dir(hf_dir, tasks, num_fewshot, limit, batch_size, device, include_path,
                                      dtype=dtype)
    else:
        results = evaluate_hf_dir(path, tasks, num_fewshot, limit, batch_size, device, include_path,
                                  trust_remote_code, dtype)
    if write:
        write_eval(path, results, num_fewshot, limit)
    return results


def check_eval_file(directory: str | Path) -> None:
    """Refuse, before an evaluation runs, an ``eval.json`` in ``directory`` that the scores could not be merged
    into: not a regular file, larger than ``MAX_EVAL_JSON_BYTES``, not JSON, or not ``{"tasks": {...}}`` as
    ``write_eval`` writes it (checked first: ``[]`` would fail after the whole evaluation, with a traceback). Raises
    ``ValueError`` naming the file and the fix; an absent file passes."""
    from scalevec.config.files import load_json

    file = Path(directory) / EVAL
    if not file.exists() and not file.is_symlink():
        return
    fix = "move it away (the scores are merged into it) or pass --no-write"
    data = load_json(file, "the scores file", fix, MAX_EVAL_JSON_BYTES)
    if not isinstance(data, dict) or not isinstance(data.get("tasks", {}), dict):
        raise ValueError(f"the scores file {file} is not one scalevec eval writes (it holds "
                         f"{type(data).__name__ if not isinstance(data, dict) else 'tasks that are no mapping'}, not "
                         f'{{"tasks": {{...}}}}); {fix}')


MAX_TEXT_BYTES = 64 << 20  # --text FILE: larger held-out sets go through prepare-data (memory-mapped)
MAX_EVAL_JSON_BYTES = 16 << 20


def read_text(path: str | Path) -> str:
    """The text of a held-out file: ``FileNotFoundError`` when missing, ``ValueError`` when it is not a regular
    file (a FIFO would hang, ``/dev/zero`` never ends), larger than ``MAX_TEXT_BYTES``, empty, not UTF-8 (binary
    data) or holding NUL bytes; a UTF-8 byte-order mark is dropped."""
    from scalevec.config.files import read_bounded

    path = Path(path)
    if not path.exists() and not path.is_symlink():
        raise FileNotFoundError(f"--text {path}: no such file (pass a UTF-8 text file or a prepare-data folder)")
    data = read_bounded(path, "--text", MAX_TEXT_BYTES,
                        "pass a UTF-8 text file, or a `scalevec prepare-data` folder for a larger held-out set",
                        devices=True)
    if not data:
        raise ValueError(f"--text {path} is empty (0 bytes); pass a file with text")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ValueError(f"--text {path} is not UTF-8 text (bad byte at offset {e.start}); pass a text file, or "
                         f"convert it first, e.g. iconv -f latin1 -t utf-8 {path} > fixed.txt") from None
    if "\0" in text:
        raise ValueError(f"--text {path} holds NUL bytes (binary data, not text); pass a text file")
    if not text:
        raise ValueError(f"--text {path} holds no text (only a byte-order mark); pass a file with text")
    return text


def text_perplexity(path: str | Path, text: str | Path, seq_len: int | None = None, batch_size: int = 8,
                    device: str = "cpu", trust_remote_code: bool = False, progress: bool = False) -> dict:
    """Held-out perplexity of the model at ``path`` (run or exported HF directory) on ``text``: a UTF-8 file
    (one document, ``perplexity.text_stream``) or a prepare-data folder (its validation split, as tokenized).
    Windows of ``seq_len`` (default ``default_seq_len``: a run's ``train.seq_len``, an export's context); with
    ``progress`` a line on stderr every ``PROGRESS_EVERY`` seconds says how far the scoring is.
    Returns ``training.perplexity.perplexity``'s dict plus ``source``. Raises ``FileNotFoundError`` /
    ``ValueError`` for a path that holds no model, bad text (``read_text``), a prepare-data folder tokenized
    with another tokenizer, a ``seq_len`` outside ``[1, context]``, and as ``check_hf_dir``."""
    import torch.nn.functional as F

    from scalevec.data.prepared import is_prepared, load_prepared
    from scalevec.data.tokenizer import load_tokenizer_dir
    from scalevec.hf.generate import load_text_model
    from scalevec.training.perplexity import perplexity, text_stream

    path, text = Path(path), Path(text)
    prepared = text.is_dir() and is_prepared(text)
    if text.is_dir() and not prepared:
        raise ValueError(f"--text {text} is a folder but not a `scalevec prepare-data` output (no manifest.json); "
                         f"pass a text file or a prepared folder")
    content = None if prepared else read_text(text)  # bad input is refused before a model is loaded
    model = load_text_model(path, device, trust_remote_code)  # check_hf_dir first for an export
    if rundir.has_config(path):
        tok = rundir.load_tokenizer(path)
    elif (path / "tokenizer.json").is_file():
        tok = load_tokenizer_dir(path)
    else:
        raise FileNotFoundError(f"{path} has no tokenizer.json; export with the run's tokenizer (scalevec export "
                                f"RUN_DIR)")
    if prepared:
        data = load_prepared(text)  # with the manifest's tokenizer, compared next
        if data.tokenizer.identity() != tok.identity():
            raise ValueError(f"--text {text} was tokenized with {data.meta['tokenizer']!r}, not the model's tokenizer "
                             f"({tok.spec}); prepare the data with the model's tokenizer")
        stream = data.val
    else:
        stream = text_stream(content, tok)
    where = "--seq-len"
    if seq_len is None:  # a run: its training windows (the validation loss it logged); an export: its context
        seq_len, where = default_seq_len(path, model.context)
    if not 1 <= seq_len <= model.context:
        raise ValueError(f"{where} {seq_len} must be in [1, {model.context}] (the model's context)")
    n_targets, done, last = len(stream) - 1, [0], [time.monotonic()]

    def nll(x, y):
        logits = model.logits(x)
        loss = F.cross_entropy(logits.float().flatten(0, 1), y.to(logits.device).flatten(), reduction="sum")
        done[0] += y.numel()
        if progress and time.monotonic() - last[0] >= PROGRESS_EVERY and done[0] < n_targets:
            last[0] = time.monotonic()
            print(f"eval --text: {done[0]:,} of {n_targets:,} tokens scored ({100 * done[0] / n_targets:.0f} %)",
                  file=sys.stderr, flush=True)
        return loss

    n_bytes = None if prepared else len(content.encode("utf-8"))  # a text's own bytes (DESIGN.md §8's bits per byte)
    out = perplexity(nll, stream, seq_len, tok.token_bytes(), batch_size, n_bytes)
    if not all(math.isfinite(out[k]) for k in ("nats_per_token", "perplexity", "bits_per_byte")):
        raise ValueError(f"{path} scores {text} with a non-finite loss (nats/token {out['nats_per_token']}, "
                         f"perplexity {out['perplexity']}): its logits overflow on this text; no score is printed, "
                         f"evaluate a healthy checkpoint")
    out["source"] = f"{text} (validation split)" if prepared else str(text)
    out["seq_len_from"] = where
    return out


PROGRESS_EVERY = 10.0  # seconds between eval --text's progress lines (stderr)


def default_seq_len(path: Path, context: int) -> tuple[int, str]:
    """``(window length, where it comes from)`` for ``eval --text`` without ``--seq-len``: a run's
    ``train.seq_len`` (the windows its logged validation loss was computed on), capped at the model's context; an
    export's the same, recorded in its config.json by ``scalevec export`` (``names.TRAIN_SEQ_LEN``), so that a
    run and its export score the same; else (an export from elsewhere, or older) the model's context
    (``max_position_embeddings``)."""
    from scalevec.config.typed import is_int
    from scalevec.hf_format.hf_import import read_config_json
    from scalevec.hf_format.names import TRAIN_SEQ_LEN

    if rundir.has_config(path):
        n = rundir.load_config(path).train.seq_len
        return min(n, context), "the run's train.seq_len"
    n = read_config_json(path).get(TRAIN_SEQ_LEN)
    if is_int(n, least=1):
        return min(n, context), f"the run's train.seq_len, recorded in {path / 'config.json'}"
    return context, "the model's context"


def print_perplexity(r: dict) -> None:
    how = f" ({r['seq_len_from']})" if r.get("seq_len_from", "--seq-len") != "--seq-len" else ""
    print(f"text {r['source']}: {r['tokens']:,} tokens, {r['bytes']:,} bytes, windows of {r['seq_len']}{how}")
    print(f"perplexity {r['perplexity']:.4f}  nats/token {r['nats_per_token']:.4f}  bits/byte {r['bits_per_byte']:.4f}")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from scalevec.hf.generate import add_trust_argument

    p.add_argument("path", metavar="RUN_DIR_OR_HF_DIR", help="a scalevec run directory or a `scalevec export` output")
    p.add_argument("--tasks", default=None,
                   help=f"comma-separated lm-eval tasks, e.g. {STANDARD_TASKS} (need a network once), or "
                        f"{SHAKESPEARE_TASK} (bundled, offline)")
    p.add_argument("--text", default=None, metavar="FILE_OR_DIR",
                   help="held-out perplexity and bits/byte on a UTF-8 text file, or on the validation split of a "
                        "`scalevec prepare-data` folder (no lm-eval needed; printed, not written)")
    p.add_argument("--seq-len", type=int, default=None,
                   help="--text window length (default: a run's train.seq_len, the windows of its validation "
                        "loss; an export's context)")
    p.add_argument("--num-fewshot", type=int, default=None, help="few-shot examples (default: the task's own)")
    p.add_argument("--limit", type=float, default=None, help="evaluate only the first N documents of each task")
    p.add_argument("--batch-size", default="auto",
                   help="lm-eval batch size, also windows per forward for --text; auto (default): lm-eval's search "
                        "for the largest that fits on CUDA, 8 on CPU (and for --text)")
    p.add_argument("--dtype", default="auto", choices=list(DTYPES),
                   help="the lm-eval tasks' weights: auto (default) = bfloat16 on CUDA, as lm-eval is usually run, "
                        "float32 on CPU; --text always scores in float32")
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    p.add_argument("--include-path", default=None, help="a folder of extra lm-eval task YAML files")
    p.add_argument("--no-write", action="store_true", help=f"print the scores only (no {EVAL})")
    add_trust_argument(p)


def task_limit(args: argparse.Namespace) -> int | float | None:
    """``--limit`` as lm-eval takes it (a count of documents, or a share below 1), checked with ``--tasks``,
    ``--num-fewshot`` and the flags' pairing. Raises ``ValueError``: ``--limit`` or ``--num-fewshot`` without
    ``--tasks`` (``--text`` ignored them), an empty ``--tasks``, a limit that is not a finite number > 0 (inf raised
    OverflowError), a negative few-shot count."""
    if args.tasks is None:
        given = [f for f, v in (("--limit", args.limit), ("--num-fewshot", args.num_fewshot)) if v is not None]
        if given:
            raise ValueError(f"{' and '.join(given)} only apply to --tasks (lm-eval), and none is given; add --tasks "
                             f"(e.g. hellaswag) or drop {' and '.join(given)}")
        return None
    if not any(t.strip() for t in args.tasks.split(",")):
        raise ValueError("--tasks is empty; pass e.g. --tasks hellaswag,arc_easy")
    if args.num_fewshot is not None and args.num_fewshot < 0:
        raise ValueError(f"--num-fewshot={args.num_fewshot} must be >= 0 (0: zero-shot)")
    if args.limit is None:
        return None
    if not (args.limit > 0 and math.isfinite(args.limit)):
        raise ValueError(f"--limit={args.limit} must be a finite number > 0 (documents per task, e.g. 100)")
    return int(args.limit) if args.limit >= 1 else args.limit


def run(args: argparse.Namespace) -> int:
    from scalevec.hf.generate import check_device

    check_device(args.device)
    if args.tasks is None and args.text is None:
        raise ValueError("pass --tasks (lm-eval tasks) or --text FILE (held-out perplexity), or both")
    if args.tasks is not None and not args.no_write:
        check_eval_file(args.path)  # before --text's scoring and the tasks: one line, nothing evaluated
    dtype, batch_size = eval_settings(args.device, args.dtype, args.batch_size)  # bad values: one line, at once
    limit = task_limit(args)  # and the tasks' own settings too, before --text scores anything
    if args.text is not None:
        text_batch = batch_size if isinstance(batch_size, int) else 8  # --text's windows per forward
        print_perplexity(text_perplexity(args.path, args.text, args.seq_len, text_batch, args.device,
                                         args.trust_remote_code, progress=True))
        if args.tasks is None:
            return 0
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    results = evaluate(args.path, tasks, args.num_fewshot, limit, batch_size, args.device, args.include_path,
                       write=not args.no_write, trust_remote_code=args.trust_remote_code, dtype=dtype)
    print(f"{'task':<24} {'metric':<14} {'value':>8} {'stderr':>8}")
    for task, metrics in results.items():
        for name, value, stderr in main_metrics(metrics):
            print(f"{task:<24} {name:<14} {value:8.4f} {'' if stderr is None else f'{stderr:8.4f}':>8}")
    if not args.no_write:
        print(f"scores written to {Path(args.path) / EVAL}")
    return 0

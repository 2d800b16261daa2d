"""The package layout is layered: no import circle, no import from a lower layer to a higher one (DESIGN.md §12).

Every module's imports are read with ``ast`` (imports inside functions included, relative ones resolved),
so a lazy import cannot hide an upward dependency. ``LAYERS`` below is the one declaration of the order;
a new module must be placed in it, or ``test_every_module_has_a_layer`` fails.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

# Bottom to top. A module may import modules of its own layer (without a circle) and of the layers below.
# The longest matching prefix decides a module's layer. `hf_format` (the Hugging Face checkpoint format: the
# name map and its reader, safetensors only) sits below training because `train --init-from` reads Hugging
# Face checkpoints; `hf` (export, generate, eval: transformers, lm-eval) reads finished runs, on top.
LAYERS = [
    # output paths (outpath): the standard library only, the one check every command's --out goes through; the
    # config package (typed input, bounded files, the schemas, their codec, field help, presets, run arithmetic):
    # every reader of user input calls it, so it sits at the bottom with outpath, below everything it checks
    ("files and config", ["scalevec.outpath", "scalevec.config"]),
    # the one resolution of a run's inputs (preset, strategy, file, overrides) into a RunConfig
    ("resolve", ["scalevec.resolve"]),
    ("model", ["scalevec.model"]),
    ("data", ["scalevec.data"]),
    ("hf format", ["scalevec.hf_format"]),
    ("training", ["scalevec.training"]),
    ("experiments", ["scalevec.experiments"]),
    ("hf", ["scalevec.hf"]),
    # integrations: strategies in transformers models and other loops; reuses hf export, training telemetry
    ("integrations", ["scalevec.integrations"]),
    # bench/ (the `scalevec bench` package) sits on top with the CLI: a measuring tool no lower layer may import
    ("cli", ["scalevec.cli", "scalevec.__main__", "scalevec.info", "scalevec.bench"]),
]
# The package itself re-exports the public entry points (README); other modules may take only its version.
FACADE = "scalevec"
FACADE_NAMES = {"__version__"}


def module_name(path: Path) -> tuple[str, bool]:
    """``(dotted name, is a package __init__)`` of a file under SRC."""
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    is_pkg = parts[-1] == "__init__"
    return ".".join(parts[:-1] if is_pkg else parts), is_pkg


MODULES = {module_name(p)[0]: p for p in sorted((SRC / "scalevec").rglob("*.py"))}


def layer_of(module: str) -> int | None:
    """Index in ``LAYERS`` of the longest prefix that matches ``module``; None if none does."""
    best, best_len = None, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for pre in prefixes:
            if (module == pre or module.startswith(pre + ".")) and len(pre) > best_len:
                best, best_len = i, len(pre)
    return best


@functools.cache
def _nodes(path: Path) -> list[ast.AST]:
    """Every node of a file's syntax tree, parsed once per test session (each test walks every module)."""
    return list(ast.walk(ast.parse(path.read_text(), str(path))))


def imports_of(module: str) -> list[tuple[str, list[str], int]]:
    """``[(imported scalevec module, names taken from it, line)]``, every import in the file, nested ones too.

    ``from pkg import sub`` counts as an import of ``pkg.sub`` when ``sub`` is a module."""
    path = MODULES[module]
    is_pkg = path.name == "__init__.py"
    out = []
    for node in _nodes(path):
        if isinstance(node, ast.Import):
            out += [(a.name, [], node.lineno) for a in node.names if a.name.split(".")[0] == "scalevec"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_pkg else module.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "scalevec":
                continue
            subs = [a.name for a in node.names if f"{target}.{a.name}" in MODULES]
            names = [a.name for a in node.names if f"{target}.{a.name}" not in MODULES]
            out += [(f"{target}.{s}", [], node.lineno) for s in subs]
            if names:
                out.append((target, names, node.lineno))
    return out


def graph() -> dict[str, set[str]]:
    """Module -> the scalevec modules it imports (the facade's version excepted)."""
    g = {}
    for m in MODULES:
        g[m] = {t for t, names, _ in imports_of(m) if not (t == FACADE and set(names) <= FACADE_NAMES)}
    return g


def test_every_module_has_a_layer():
    """Each module of src/scalevec is placed in LAYERS (the facade ``scalevec/__init__.py`` excepted)."""
    missing = [m for m in MODULES if m != FACADE and layer_of(m) is None]
    assert not missing, f"place these modules in tests/test_layout.py LAYERS: {missing}"


def test_no_upward_import():
    """No module imports a module of a higher layer, not even inside a function."""
    bad = []
    for m in MODULES:
        if m == FACADE:
            continue
        for target, names, line in imports_of(m):
            if target == FACADE:
                if not set(names) <= FACADE_NAMES:
                    bad.append(f"{m}:{line} imports {names} from the package facade; import the defining module")
                continue
            lo, hi = layer_of(m), layer_of(target)
            if hi is None:
                bad.append(f"{m}:{line} imports {target}, which is not a module")
            elif hi > lo:
                bad.append(f"{m}:{line} ({LAYERS[lo][0]}) imports {target} ({LAYERS[hi][0]})")
    assert not bad, "upward imports:\n" + "\n".join(bad)


def test_config_package_imports_only_itself_and_outpath():
    """``scalevec.config`` (the typed reader, the schemas, their codec) imports nothing of scalevec but its own
    modules and ``scalevec.outpath``: no model, data or training, which all read their input through it."""
    def config(name: str) -> bool:
        return name == "scalevec.config" or name.startswith("scalevec.config.")

    bad = [f"{m}:{line} imports {target}" for m in MODULES if config(m)
           for target, _, line in imports_of(m) if not (target == "scalevec.outpath" or config(target))]
    assert not bad, "the config package imports above itself:\n" + "\n".join(bad)


def test_facade_imports_only_the_bottom_layers():
    """``scalevec/__init__.py`` re-exports config and model entry points only, so importing any module stays cheap;
    the integrations are exported lazily, by its module ``__getattr__`` (PEP 562), imported on first use."""
    model = [i for i, (name, _) in enumerate(LAYERS) if name == "model"][0]
    lazy = [range(n.lineno, n.end_lineno + 1) for n in ast.parse(MODULES[FACADE].read_text()).body
            if isinstance(n, ast.FunctionDef) and n.name == "__getattr__"]
    for target, _, line in imports_of(FACADE):
        if any(line in r for r in lazy):
            assert target == "scalevec.integrations", f"scalevec/__init__.py:{line} imports {target} lazily"
            continue
        layer = layer_of(target)
        assert layer is not None and layer <= model, f"scalevec/__init__.py:{line} imports {target}"


def test_no_import_circle():
    """The module import graph is acyclic (a circle is reported as its modules in order)."""
    g = graph()
    state, stack, circles = {}, [], []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for t in sorted(g.get(m, ())):
            if t not in MODULES:
                continue
            if state.get(t) == "open":
                circles.append(stack[stack.index(t):] + [t])
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = "done"

    for m in sorted(g):
        if m not in state:
            visit(m)
    assert not circles, "import circles:\n" + "\n".join(" -> ".join(c) for c in circles)


def test_nobody_imports_the_trainer_to_read_a_run():
    """Reading a run goes through ``training.rundir``; only the commands that build a trainer import the trainer
    module: ``scalevec train``'s command line (``training.command``) and ``scalevec convert`` (``hf.convert``: the
    trainer's set-up converts the model, and writes a step-0 run), which ``cli`` reaches by name; and the GPU
    check's resume stage (``bench.gpu_stages``: trains, stops and resumes runs in one process group)."""
    users = sorted(m for m, deps in graph().items() if "scalevec.training.trainer" in deps)
    assert users == ["scalevec.bench.gpu_stages", "scalevec.hf.convert", "scalevec.training.command"], (
        f"{users} import scalevec.training.trainer; read runs with scalevec.training.rundir")


# The owners of the run directory's files: rundir (the run's own files) and the checkpoint package (checkpoints/).
RUN_FILE_OWNERS = ("scalevec.training.rundir", "scalevec.training.checkpoint")
# Names spelled elsewhere in the package with another meaning are left out, since a string cannot say which it
# is: "tokenizer" (the data.tokenizer field), "tensorboard" / "wandb" (train.tracker's values), "latest" and
# "dcp" (plain words). Every other name of a run's entry is unambiguous, and is checked.
AMBIGUOUS_RUN_NAMES = {"tokenizer", "tensorboard", "wandb", "latest", "dcp"}
# (package, name): a different file that shares a run file's name, spelled where that format lives
OTHER_FILES_OF_THE_SAME_NAME = {
    ("scalevec.data", "meta.json"),  # a token cache entry's own meta.json (data/corpus.py)
    ("scalevec.hf_format", "model.safetensors"),  # a Hugging Face model directory's weights (transformers' name)
    ("scalevec.hf", "model.safetensors"),  # the same, in an export directory
}


def run_file_names() -> set[str]:
    """Every entry name of a run directory and of a checkpoint, read from their owners' constants."""
    from scalevec.training import rundir
    from scalevec.training.checkpoint import layout

    names = {*rundir.RUN_ENTRIES, rundir.LOCK, rundir.METRICS + rundir.DAMAGED}
    names |= {layout.CKPT_DIR, layout.LATEST, layout.DCP_DIR, layout.MODEL_FILE, layout.TRAIN_STATE, layout.MANIFEST}
    return names - AMBIGUOUS_RUN_NAMES


def path_literals(path: Path, names: set[str]) -> list[tuple[int, str]]:
    """``[(line, string)]`` of the string constants in ``path`` that spell one of ``names`` as a path: the name
    itself, or an f-string's piece of a path (``"/config.yaml"``, ``"checkpoints/"``). A sentence that mentions a
    name (an error message, a help text) is prose, as docstrings and bare string statements are: not counted."""
    docs = {id(n.value) for n in _nodes(path) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    hits = []
    for n in _nodes(path):
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs:
            if n.value.strip("/") in names:
                hits.append((n.lineno, n.value))
    return hits


def test_run_file_names_are_spelled_by_their_owners_only():
    """Outside ``training/rundir.py`` and ``training/checkpoint/``, no module spells a run-directory or checkpoint
    file name as a string: readers and writers go through the owners (their functions and constants), so a file's
    name and its reading rules (the cut-off metrics line, the manifest) have one home (DESIGN.md §12)."""
    names = run_file_names()
    assert {"config.yaml", "metrics.jsonl", "DONE", "checkpoints", "MANIFEST.json"} <= names
    bad = []
    for m, path in MODULES.items():
        if any(m == o or m.startswith(o + ".") for o in RUN_FILE_OWNERS):
            continue
        for line, value in path_literals(path, names):
            if not any((m == pkg or m.startswith(pkg + ".")) and value.strip("/") == name
                       for pkg, name in OTHER_FILES_OF_THE_SAME_NAME):
                bad.append(f"{m}:{line} spells {value!r}")
    assert not bad, "run-file names outside rundir/checkpoint (use their constants or functions):\n" + "\n".join(bad)


def test_path_literals_sees_paths_not_prose(tmp_path):
    """The checker counts a name and an f-string's path piece, not a sentence or a docstring that mentions it."""
    f = tmp_path / "probe.py"
    f.write_text('"""Reads config.yaml."""\n'
                 'def f(run):\n'
                 '    """The DONE marker."""\n'
                 '    a = run / "DONE"\n'
                 '    b = f"{run}/metrics.jsonl"\n'
                 '    raise ValueError(f"{run} has no config.yaml; pass a run")\n')
    assert path_literals(f, {"config.yaml", "DONE", "metrics.jsonl"}) == [(4, "DONE"), (5, "/metrics.jsonl")]


def test_cli_subcommands_resolve():
    """Every ``scalevec`` subcommand names an existing module with ``add_arguments`` and ``run``."""
    from scalevec.cli import SUBCOMMANDS

    for name, module, _ in SUBCOMMANDS:
        assert module in MODULES, f"subcommand {name}: no module {module}"
        tree = ast.parse(MODULES[module].read_text())
        defs = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        assert {"add_arguments", "run"} <= defs, f"subcommand {name}: {module} lacks add_arguments/run"


@pytest.mark.parametrize("source, expected", [
    ("from scalevec.training import rundir\n", ["scalevec.training.rundir"]),
    ("def f():\n    from ..model.fold import fold_scales\n", ["scalevec.model.fold"]),
])
def test_imports_of_reads_nested_and_relative_imports(tmp_path, monkeypatch, source, expected):
    """The checker itself sees submodule imports, relative imports and imports inside functions."""
    f = tmp_path / "probe.py"
    f.write_text(source)
    monkeypatch.setitem(MODULES, "scalevec.hf.probe", f)
    assert [t for t, _, _ in imports_of("scalevec.hf.probe")] == expected


ROOT = SRC.parent  # the checkout: its study (reproduction/, scripts/, results/) is not part of the library
CHECKOUT_FOLDERS = ("scripts", "results", "reproduction", "sweeps", "tests")


def climbs_out(node: ast.AST, depth: int) -> bool:
    """Whether ``node`` is ``….parents[k]`` or a chain of ``.parent`` that reaches above a module ``depth``
    folders below ``src/scalevec`` (a module of ``scalevec/x/`` has depth 1: ``parents[1]`` is ``scalevec``)."""
    if (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and node.value.attr == "parents"
            and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, int)):
        return node.slice.value > depth
    ups = 0
    while isinstance(node, ast.Attribute) and node.attr == "parent":
        ups, node = ups + 1, node.value
    return ups > depth + 1  # Path(__file__).parent is the module's own folder


def test_no_installed_module_finds_the_checkout_or_imports_the_study():
    """No module of src/scalevec climbs from its own path out of the package (``parents[3]``: the checkout an
    editable install happens to run from) or imports the repository's ``reproduction`` study: an installed
    scalevec reads only the paths it is given."""
    bad = []
    for m, path in MODULES.items():
        depth = len(path.relative_to(SRC / "scalevec").parts) - 1
        for node in _nodes(path):
            if climbs_out(node, depth):
                bad.append(f"{m}:{node.lineno} climbs out of the package from its own path")
            if isinstance(node, ast.Import):
                roots = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                roots = [(node.module or "").split(".")[0]]
            else:
                continue
            if "reproduction" in roots:
                bad.append(f"{m}:{node.lineno} imports the reproduction study")
    assert not bad, "\n".join(bad)


def checkout_uses(path: Path) -> list[str]:
    """What a checkout tool does and an installed module must not, as ``"line: what"``: join one of the checkout's
    folders onto a path (``root / "tests"``), spell a path into one (``"scripts/gpu_ladder.sh"``), or run pytest."""
    docs = {id(n.value) for n in _nodes(path) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    hits = []
    for n in _nodes(path):
        if (isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div) and isinstance(n.right, ast.Constant)
                and isinstance(n.right.value, str) and n.right.value.strip("/").split("/")[0] in CHECKOUT_FOLDERS):
            hits.append(f"{n.lineno}: joins {n.right.value!r} onto a path")
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs:
            if n.value.lstrip("/").split("/")[0] in CHECKOUT_FOLDERS and "/" in n.value.strip("/"):
                hits.append(f"{n.lineno}: spells the path {n.value!r}")
            elif re.match(r"pytest\b", n.value):
                hits.append(f"{n.lineno}: runs the tests ({n.value!r})")
    return hits


def test_no_installed_module_names_the_checkouts_folders_or_runs_its_tests():
    """No module of src/scalevec joins scripts/, results/, tests/, reproduction/ or sweeps/ onto a path, spells a
    path into them, or runs pytest: a tool that drives the checkout (the GPU check's orchestrator) is a script."""
    bad = [f"{m}:{hit}" for m, path in MODULES.items() for hit in checkout_uses(path)]
    assert not bad, "installed modules that use the checkout (move them into scripts/):\n" + "\n".join(bad)


def test_checkout_uses_sees_the_gpu_checks_orchestrator():
    """The checker flags what scripts/gpu_check.py does and the library must not: it runs ``pytest`` on the
    checkout's ``tests/``, and ``scripts/gpu_ladder.sh`` against ``results/``."""
    hits = " ".join(checkout_uses(ROOT / "scripts" / "gpu_check.py"))
    for what in ("joins 'tests'", "joins 'results'", "joins 'scripts'", "runs the tests ('pytest')"):
        assert what in hits, f"{what} not seen in {hits}"


def test_climbs_out_sees_parents_and_parent_chains():
    """The checker flags ``parents[3]`` and ``.parent.parent.parent`` from a depth-1 module, not ``parents[1]``."""
    expr = lambda text: ast.parse(text, mode="eval").body  # noqa: E731
    assert climbs_out(expr("Path(__file__).resolve().parents[3]"), 1)
    assert climbs_out(expr("Path(__file__).parent.parent.parent"), 1)
    assert not climbs_out(expr("Path(__file__).resolve().parents[1]"), 1)
    assert not climbs_out(expr("Path(__file__).parent / 'corpora'"), 1)


def test_study_modules_live_outside_the_installed_package():
    """Every module that ``scripts/`` or ``reproduction/`` import from scalevec is also imported inside the
    library or is a ``scalevec`` subcommand: a module only the reproduction uses belongs in ``reproduction/``."""
    from scalevec.cli import SUBCOMMANDS

    used_inside = {t for deps in graph().values() for t in deps} | {m for _, m, _ in SUBCOMMANDS}
    outside = [p for folder in ("scripts", "reproduction") for p in sorted((ROOT / folder).rglob("*.py"))]
    assert outside, "no scripts found"
    bad = []
    for path in outside:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in MODULES else node.module
                         for a in node.names]
            for name in names:
                if name in MODULES and name not in used_inside and name != FACADE:
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {name}, used by no module of "
                               f"scalevec: move it into reproduction/")
    # `python -m scalevec.X` in a script runs a module as a program: one that no library module uses is the study's
    for path in sorted((ROOT / "scripts").glob("*.sh")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            for name in re.findall(r"-m (scalevec(?:\.\w+)+)", line):
                if name in MODULES and name not in used_inside:
                    bad.append(f"{path.relative_to(ROOT)}:{n} runs {name}, used by no module of scalevec: move it "
                               f"into reproduction/")
    assert not bad, "\n".join(bad)


# An audit hook (PEP 578) sees every open, listdir and scandir while every module of the package is imported.
IMPORT_PROBE = """
import importlib, os, pkgutil, sys
root, hits = os.path.realpath(sys.argv[1]), []
folders = tuple(os.path.join(root, f) + os.sep for f in sys.argv[2].split(","))
def hook(event, args):
    if event in ("open", "os.listdir", "os.scandir") and args and isinstance(args[0], (str, bytes, os.PathLike)):
        path = os.path.realpath(os.fsdecode(args[0])) + os.sep
        if path.startswith(folders):
            hits.append(f"{event} {path}")
sys.addaudithook(hook)
os.chdir(root)  # from the checkout itself, where a relative results/ would be found
import scalevec
for m in pkgutil.walk_packages(scalevec.__path__, "scalevec."):
    if not m.name.endswith("__main__"):  # `python -m scalevec` runs the CLI
        importlib.import_module(m.name)
hits += [f"imported {m}" for m in sys.modules if m.split(".")[0] == "reproduction"]
print("\\n".join(hits))
"""


@pytest.mark.slow
def test_importing_scalevec_touches_no_checkout_folder():
    """``import scalevec`` and the import of every installed module, run from the checkout, open or list nothing
    under scripts/, results/, reproduction/, sweeps/ or tests/, and import no reproduction module."""
    import subprocess
    import sys

    probe = subprocess.run([sys.executable, "-c", IMPORT_PROBE, str(ROOT), ",".join(CHECKOUT_FOLDERS)],
                           capture_output=True, text=True, timeout=300,
                           env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin", "HOME": str(ROOT)})
    assert probe.returncode == 0, probe.stderr[-2000:]
    assert probe.stdout.strip() == "", f"importing scalevec touched the checkout:\n{probe.stdout}"

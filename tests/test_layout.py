"""The package layout: the README's layer order and no import cycles, each family's read path,
one owner of the run dir's files, and a short way from ``attnlab train`` to the training step.

The checks of the source read it with ``ast`` (nothing is imported), so they see every import,
including the ones inside functions, and every string literal; the way to the training step
is traced in a tiny real training.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
RUN_DIR_NAMES = ("config.json", "tokenizer.json", "metrics.csv", "results.json",
                 "model.safetensors", "state.json", "state.safetensors", "manifest.json",
                 "loss.png")
# (module, name) pairs allowed outside attnlab.runs. Why each one is not a run-dir file:
ALLOWED_NAMES = {
    # a Hugging Face model directory has its own config.json (read when importing weights)
    ("attnlab.interop.hf", "config.json"),
    # ... and its own weight file names (model.safetensors, pytorch_model.bin, shard indexes)
    ("attnlab.interop.hf", "model.safetensors"),
    # ... and its own tokenizer files (tokenizer.json, tokenizer_config.json), read and written
    ("attnlab.interop.hf_tokenizer", "tokenizer.json"),
    ("attnlab.interop.hf_tokenizer", "config.json"),
    # a prepared token dir (attnlab data prepare) keeps the tokenizer that made its ids
    ("attnlab.data.shards", "tokenizer.json"),
}


def modules(root: Path, package: str) -> dict[str, Path]:
    """Dotted module name -> file, for every module of ``package`` under ``root``."""
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _runtime_nodes(tree: ast.AST, type_only: bool = False):
    """Every node of ``tree`` except the bodies of ``if TYPE_CHECKING:`` blocks, which hold
    imports for annotations only and never run (``type_only``: those too)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if not type_only and isinstance(node, ast.If) and _is_type_checking(node):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def imports_of(name: str, path: Path, known: dict[str, Path], type_only: bool = False) -> set[str]:
    """The modules of ``known`` that module ``name`` imports, at the top or in a function
    (``type_only``: in ``if TYPE_CHECKING:`` blocks too)."""
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    found = set()
    for node in _runtime_nodes(ast.parse(path.read_text(encoding="utf-8")), type_only):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)  # `from M import x` runs M (a package's __init__ included)
            found.update(f"{target}.{a.name}" for a in node.names)  # x may be a submodule
    return {m for m in found if m in known and m != name}


def import_graph(root: Path, package: str, type_only: bool = False) -> dict[str, set[str]]:
    known = modules(root, package)
    return {name: imports_of(name, path, known, type_only) for name, path in known.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def run_dir_names(root: Path, package: str) -> list[tuple[str, str]]:
    """(module, run-dir file name) for each string literal outside docstrings that names a
    file of a run dir, in every module but :mod:`attnlab.runs` (their one owner)."""
    hits = []
    for name, path in modules(root, package).items():
        if name == f"{package}.runs":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                      if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                        ast.AsyncFunctionDef))
                      and n.body and isinstance(n.body[0], ast.Expr)
                      and isinstance(n.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                    and id(node) not in docstrings):
                hits += [(name, f) for f in RUN_DIR_NAMES
                         if f in node.value and (name, f) not in ALLOWED_NAMES]
    return sorted(set(hits))


# ---- the package ------------------------------------------------------------------------------
def test_no_import_cycles_in_attnlab():
    graph = import_graph(SRC, "attnlab")
    assert len(graph) > 30 and "attnlab.runs" in graph["attnlab.train.runner"]
    assert cycles(graph) == []


def test_no_type_only_import_runs_back_up():
    """Annotations follow the layers too: an ``if TYPE_CHECKING:`` import that closes a cycle
    means a type lives above the code that uses it (move the type down)."""
    assert cycles(import_graph(SRC, "attnlab", type_only=True)) == []


def test_only_runs_spells_run_dir_file_names():
    assert run_dir_names(SRC, "attnlab") == []


# ---- the checks themselves can fail -----------------------------------------------------------
def write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_a_cycle_is_found_through_function_level_and_relative_imports(tmp_path):
    write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "from .sub import b\n",
        "pkg/sub/__init__.py": "",
        "pkg/sub/b.py": "def f():\n    from ..c import x\n",
        "pkg/c.py": "import pkg.a\nx = 1\n",
        "pkg/d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a\n",
        "pkg/e.py": "from pkg import d\n",
    })
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg.a"] == {"pkg.sub", "pkg.sub.b"}
    assert graph["pkg.d"] == set()  # annotations-only imports do not run
    assert cycles(graph) == [["pkg.a", "pkg.c", "pkg.sub.b"]]
    assert import_graph(tmp_path, "pkg", type_only=True)["pkg.d"] == {"pkg", "pkg.a"}
    write(tmp_path, {"pkg/c.py": "x = 1\n"})
    assert cycles(import_graph(tmp_path, "pkg")) == []


def test_a_type_only_import_that_runs_back_up_is_a_cycle(tmp_path):
    write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/low.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                      "    from .high import Config\n",
        "pkg/high.py": "from . import low\nclass Config: ...\n",
    })
    assert cycles(import_graph(tmp_path, "pkg")) == []  # nothing runs back up ...
    assert cycles(import_graph(tmp_path, "pkg", type_only=True)) == [["pkg.high", "pkg.low"]]


@pytest.mark.parametrize("code, found", [
    ('PATH = "runs/x/metrics.csv"\n', [("pkg.offender", "metrics.csv")]),
    ('def f(d):\n    return d / f"best/{\'model.safetensors\'}"\n',
     [("pkg.offender", "model.safetensors")]),
    ('"""Writes config.json (a docstring is prose, not a path)."""\n', []),
])
def test_a_run_dir_file_name_outside_runs_is_found(tmp_path, code, found):
    write(tmp_path, {"pkg/__init__.py": "", "pkg/runs.py": 'NAME = "config.json"\n',
                     "pkg/offender.py": code})
    assert run_dir_names(tmp_path, "pkg") == found


# ---- the layers the README states ------------------------------------------------------------
def readme_layers(readme: str) -> list[str]:
    """The layer order the README states, lowest first: its line ``Layers, lowest first:
    `a -> b -> ...` `` (each a top-level module or sub-package of attnlab)."""
    line = next(row for row in readme.splitlines() if row.startswith("Layers, lowest first:"))
    return [name.strip() for name in line.split("`")[1].split("->")]


def unit_of(module: str) -> str:
    """The top-level module or sub-package of ``attnlab`` that ``module`` belongs to."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def upward_imports(graph: dict[str, set[str]], order: list[str]) -> list[tuple[str, str]]:
    """(importer, imported) pairs where a module imports from a layer above its own."""
    rank = {name: i for i, name in enumerate(order)}
    found = []
    for module, targets in graph.items():
        low = rank.get(unit_of(module))
        for target in targets:
            high = rank.get(unit_of(target))
            if low is not None and high is not None and high > low:
                found.append((module, target))
    return sorted(found)


def test_imports_follow_the_readme_layer_order():
    """Every module imports only from its own layer and the ones the README lists before it,
    annotation-only imports included; every top-level module and package has a layer."""
    order = readme_layers((SRC.parent / "README.md").read_text(encoding="utf-8"))
    graph = import_graph(SRC, "attnlab", type_only=True)
    units = {unit_of(m) for m in graph} - {"attnlab", "__main__"}
    assert units - set(order) == set(), "modules missing from the README's layer line"
    assert set(order) - units == set(), "the README's layer line names modules that are gone"
    assert upward_imports(graph, order) == []


def test_an_upward_import_is_found(tmp_path):
    write(tmp_path, {"pkg/__init__.py": "", "pkg/low.py": "def f():\n    from . import high\n",
                     "pkg/high.py": "from . import low\n"})
    graph = import_graph(tmp_path, "pkg")
    assert upward_imports(graph, ["low", "high"]) == [("pkg.low", "pkg.high")]
    assert upward_imports(graph, ["high", "low"]) == [("pkg.high", "pkg.low")]
    assert readme_layers("x\nLayers, lowest first: `a -> b.c -> d`.\n") == ["a", "b.c", "d"]


# ---- the read path of each family -------------------------------------------------------------
FAMILIES = ("attnlab.models.decoder", "attnlab.models.encoder", "attnlab.models.encoder_decoder")
# exception classes only (no behaviour a forward pass runs): not part of what a reader follows
NOT_READ = {"attnlab.errors"}


def read_path(module: str, root: Path = SRC) -> dict[str, int]:
    """The modules a reader follows from ``module`` (its runtime imports, transitively, minus
    :data:`NOT_READ`) and the lines of each file."""
    known = modules(root, module.split(".")[0])
    seen, todo = {}, [module]
    while todo:
        name = todo.pop()
        if name in seen or name in NOT_READ:
            continue
        path = known[name]
        seen[name] = len(path.read_text(encoding="utf-8").splitlines())
        todo += imports_of(name, path, known)
    return seen


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_reads_top_to_bottom_in_three_files(family):
    """A family's forward pass is read in its own file, the building blocks (attnlab.nn) and
    the config: no other module, and under 1,300 lines together (docstrings included)."""
    path = read_path(family)
    assert set(path) == {family, "attnlab.nn", "attnlab.config"}, path
    assert sum(path.values()) < 1300, path


MAX_CORE_LINES = 1300


def test_the_building_blocks_and_the_three_families_stay_under_1300_lines():
    """``nn.py`` holds building blocks only (speed tricks live in :mod:`attnlab.speed`,
    parameter counts in :mod:`attnlab.info`, mask helpers nothing runs stay out), so it and
    ``models/*.py`` read in one sitting: at most 1,300 lines together, docstrings included."""
    files = [SRC / "attnlab" / "nn.py", *sorted((SRC / "attnlab" / "models").glob("*.py"))]
    lines = {f.name: len(f.read_text(encoding="utf-8").splitlines()) for f in files}
    assert len(files) == 5 and sum(lines.values()) <= MAX_CORE_LINES, lines


def test_the_read_path_follows_imports(tmp_path):
    write(tmp_path, {"pkg/__init__.py": "", "pkg/a.py": "from .b import x\n",
                     "pkg/b.py": "from .c import y\nx = 1\n", "pkg/c.py": "y = 2\n\n\n"})
    assert read_path("pkg.a", tmp_path) == {"pkg.a": 1, "pkg.b": 2, "pkg.c": 3}


# ---- functions a reader can hold in their head ------------------------------------------------
MAX_FUNCTION_LINES = 50


def long_functions(root: Path, package: str) -> list[str]:
    """``module:line name (n lines)`` for each function whose code (after its docstring) runs
    over :data:`MAX_FUNCTION_LINES` lines without a ``Long:`` reason in its docstring."""
    found = []
    for name, path in modules(root, package).items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            doc = ast.get_docstring(node) or ""
            first = node.body[1] if doc and len(node.body) > 1 else node.body[0]
            n = node.end_lineno - first.lineno + 1
            if n > MAX_FUNCTION_LINES and "Long:" not in doc:
                found.append(f"{name}:{node.lineno} {node.name} ({n} lines)")
    return sorted(found)


def private_imports(root: Path, package: str) -> list[str]:
    """``module imports name from other`` for each private name (one leading underscore)
    that a module imports from another module of the package."""
    found = []
    for name, path in modules(root, package).items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith(
                    package)):
                found += [f"{name} imports {a.name} from {'.' * node.level}{node.module or ''}"
                          for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__")]
    return sorted(found)


def test_no_function_runs_over_fifty_lines_without_a_reason():
    assert long_functions(SRC, "attnlab") == []


def test_no_private_helper_is_imported_across_modules():
    assert private_imports(SRC, "attnlab") == []


def test_the_function_checks_can_fail(tmp_path):
    body = "".join(f"    x{i} = {i}\n" for i in range(51))
    write(tmp_path, {"pkg/__init__.py": "", "pkg/a.py": f"def long():\n{body}\n"
                     f"def reasoned():\n    \"\"\"Long: one table.\"\"\"\n{body}\n"
                     "def short():\n    return 1\n",
                     "pkg/b.py": "from .a import _hidden, short\nfrom pkg.a import _other\n"})
    assert long_functions(tmp_path, "pkg") == ["pkg.a:1 long (51 lines)"]
    assert private_imports(tmp_path, "pkg") == ["pkg.b imports _hidden from .a",
                                                "pkg.b imports _other from pkg.a"]


def test_the_readme_layout_names_every_module_and_package():
    """README's Layout block lists each top-level module and sub-package of attnlab, and each
    module of the decoding package (one home per concept), so it shows the tree as it is."""
    readme = (SRC.parent / "README.md").read_text(encoding="utf-8")
    block = readme.split("## Layout", 1)[1].split("```", 2)[1]
    package = SRC / "attnlab"
    wanted = [p.name for p in package.glob("*.py") if not p.name.startswith("__")]
    wanted += [f"{p.name}/" for p in package.iterdir() if (p / "__init__.py").exists()]
    missing = [name for name in wanted if name not in block]
    missing += [f"decoding/{p.stem}" for p in (package / "decoding").glob("*.py")
                if not p.name.startswith("_") and p.stem not in block]
    assert not missing, f"README's Layout does not mention {missing}"


# ---- one home for atomic writes ---------------------------------------------------------------
# (module, what) pairs allowed outside attnlab.files, with the reason each is not an atomic
# write of its own. None today: every write-then-rename goes through attnlab.files.
ALLOWED_RENAMES: set[tuple[str, str]] = set()
RENAMES = ("replace", "rename", "renames")  # os.*; Path.rename / Path.replace(target)


def rename_calls(root: Path, package: str) -> list[tuple[str, str]]:
    """(module, what) for each temporary file or rename outside ``package.files``, the one
    home of atomic writes: an import of ``tempfile``, a call of ``os.replace`` / ``os.rename``
    / ``shutil.move``, any ``.rename(...)``, and ``.replace(target)`` with one positional
    argument and no keywords (``Path.replace``; ``str.replace`` takes two, a dataclass's
    ``replace`` keywords)."""
    found = []
    for name, path in modules(root, package).items():
        if name == f"{package}.files":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found += [(name, "import tempfile") for a in node.names
                          if a.name.split(".")[0] == "tempfile"]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                module = (node.module or "").split(".")[0]
                if module == "tempfile":
                    found.append((name, "import tempfile"))
                found += [(name, f"{module}.{a.name}") for a in node.names
                          if (module, a.name) in {("os", r) for r in RENAMES} | {
                              ("shutil", "move")}]
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                attr, owner = node.func.attr, node.func.value
                owner_name = owner.id if isinstance(owner, ast.Name) else None
                if owner_name in ("os", "shutil") and attr in (*RENAMES, "move"):
                    found.append((name, f"{owner_name}.{attr}"))
                elif owner_name not in ("os", "dataclasses") and (attr == "rename" or (
                        attr == "replace" and len(node.args) == 1 and not node.keywords)):
                    found.append((name, f".{attr}()"))
    return sorted(set(found) - ALLOWED_RENAMES)


def test_only_files_writes_through_temporary_files_and_renames():
    """Atomic writes have one home (attnlab.files: a file, a folder, a file and the files
    beside it): a temporary name and a rename anywhere else is a second implementation."""
    assert rename_calls(SRC, "attnlab") == []


@pytest.mark.parametrize("code, found", [
    ("import tempfile\n", [("pkg.offender", "import tempfile")]),
    ("from tempfile import mkstemp\n", [("pkg.offender", "import tempfile")]),
    ("import os\ndef f(a, b):\n    os.replace(a, b)\n", [("pkg.offender", "os.replace")]),
    ("from os import rename\n", [("pkg.offender", "os.rename")]),
    ("import shutil\ndef f(a, b):\n    shutil.move(a, b)\n", [("pkg.offender", "shutil.move")]),
    ("def f(p, q):\n    p.with_suffix('.tmp').rename(q)\n", [("pkg.offender", ".rename()")]),
    ("def f(p, q):\n    (p / 'x.tmp').replace(q)\n", [("pkg.offender", ".replace()")]),
    ("import dataclasses\ndef f(s, c):\n    return s.replace('a', 'b'), c.replace(x=1), "
     "dataclasses.replace(c, x=1)\n", []),
])
def test_a_rename_outside_files_is_found(tmp_path, code, found):
    write(tmp_path, {"pkg/__init__.py": "", "pkg/files.py": "import os, tempfile\n"
                     "def f(a, b):\n    os.replace(a, b)\n", "pkg/offender.py": code})
    assert rename_calls(tmp_path, "pkg") == found


# ---- from the command to the training step ----------------------------------------------------
MAX_CALLS_TO_STEP = 5  # (nanoGPT: none, one script; litgpt: about four)
Stack = list[tuple[int, str]]  # a call stack, outermost first: (id of the frame, its name)


def step_chain(forward: Stack, backward: Stack, update: Stack,
               top: str = "attnlab.cli.train.cmd_train") -> list[str]:
    """The frames from ``top`` down to the training step, both included: the function that
    calls the loss's backward itself, and under which the model's forward and the optimizer's
    update of the same step ran (each stack ends in that call)."""
    def below_top(stack: Stack) -> list[str]:
        names = [name for _, name in stack]
        return names[names.index(top):] if top in names else names

    step = backward[-2]  # the caller of Tensor.backward
    for what, stack in (("forward", forward), ("optimizer's update", update)):
        assert step in stack, (f"{step[1]} calls backward, but the {what} does not run under "
                               f"it: {' -> '.join(below_top(stack))}")
    chain = below_top(backward[:-1])
    assert chain[0] == top, f"{top} does not run the step: {chain}"
    return chain


def traced_stacks(argv: list[str]) -> tuple[Stack, Stack, Stack]:
    """Run ``attnlab *argv`` in this process under ``sys.setprofile``: the call stacks at the
    first optimizer update and at the last forward of the model and the last backward before
    it."""
    import sys

    import torch

    from attnlab.cli import main

    models, backward = str(SRC / "attnlab" / "models"), torch.Tensor.backward.__code__
    seen: dict[str, Stack] = {}
    alive = []  # the frames recorded, held so that no id is used again while this runs

    def stack(frame) -> Stack:
        out = []
        while frame is not None:
            alive.append(frame)
            out.append((id(frame), f"{frame.f_globals.get('__name__')}.{frame.f_code.co_qualname}"))
            frame = frame.f_back
        return out[::-1]

    def profile(frame, event, arg) -> None:
        code = frame.f_code
        if event != "call" or "update" in seen:
            return
        if code.co_name == "forward" and code.co_filename.startswith(models):
            seen["forward"] = stack(frame)
        elif code is backward:
            seen["backward"] = stack(frame)
        elif code.co_name == "step" and isinstance(frame.f_locals.get("self"),
                                                   torch.optim.Optimizer):
            seen["update"] = stack(frame)

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        assert main(argv) == 0
    finally:
        sys.setprofile(previous)
    return seen["forward"], seen["backward"], seen["update"]


def test_attnlab_train_reaches_the_training_step_in_at_most_five_calls(tmp_path, capsys):
    """From ``cmd_train`` (the CLI command) to the function that runs forward, backward and
    the optimizer's update, traced in a real one-step training of a tiny model: at most
    :data:`MAX_CALLS_TO_STEP` calls, so a reader follows ``attnlab train`` to the step
    without passing through wrappers that only hand their arguments on."""
    tiny = ["model.d_model=16", "model.n_heads=2", "model.n_layers=1", "train.max_steps=1",
            "train.batch_size=4", "train.precision=fp32", "train.progress=false",
            "train.tensorboard=false", "train.eval_batches=1", "train.final_eval_batches=1",
            "data.val_size=8"]
    argv = ["train", "reverse", *(f"--set={s}" for s in tiny), "--out", str(tmp_path / "run")]
    chain = step_chain(*traced_stacks(argv))
    assert chain[-1].endswith(".train_step"), chain
    assert len(chain) - 1 <= MAX_CALLS_TO_STEP, " -> ".join(chain)


def test_the_step_chain_can_fail():
    def stack(*names: str) -> Stack:
        return [(hash(name), name) for name in names]

    outer = ("main", "cmd_train", "a", "b", "c", "d", "e", "step")
    chain = step_chain(stack(*outer, "loss", "forward"), stack(*outer, "backward"),
                       stack(*outer, "scaler.step", "opt.step"), top="cmd_train")
    assert chain == ["cmd_train", "a", "b", "c", "d", "e", "step"]  # 6 calls: too many
    # forward and backward in a helper of the step: the helper is no training step
    with pytest.raises(AssertionError, match="accumulate calls backward, but the optimizer"):
        step_chain(stack(*outer, "accumulate", "forward"), stack(*outer, "accumulate", "backward"),
                   stack(*outer, "opt.step"), top="cmd_train")
    with pytest.raises(AssertionError, match="does not run the step"):
        step_chain(stack("main", "x", "forward"), stack("main", "x", "backward"),
                   stack("main", "x", "opt.step"), top="cmd_train")


# ---- a thin CLI: what varies by family lives with the run, the task, viz or interpret --------
FAMILIES_NAMED = {"decoder", "encoder", "encoder_decoder"}
# (module, function, comparison) of attnlab.cli allowed to compare a model's family with a
# family name. Each refuses a command that does not fit the run, and says why:
ALLOWED_FAMILY_CHECKS = {
    # --target (viz attention, interpret): only an encoder-decoder reads a target
    ("attnlab.cli.common", "check_target", 'family != "encoder_decoder"'),
    # interpret lens / attribute need a model that predicts tokens, not a classifier
    ("attnlab.cli.interpret", "_load", "cfg.family in LM_HEAD"),
    # interpret ablate --text refuses a masked LM: its loss needs masked positions
    ("attnlab.cli.interpret", "ablate_batch", 'cfg.family == "encoder"'),
    # interpret patch of a translation run needs --target (the translation so far)
    ("attnlab.cli.interpret", "patch_inputs", 'run.model.config.family == "encoder_decoder"'),
}


def _names_family(node: ast.AST, constants: set[str]) -> bool:
    """Whether ``node`` is a family name: a string literal, a set / tuple / list / dict
    literal holding one, or a module-level name bound to such a literal."""
    if isinstance(node, ast.Constant):
        return node.value in FAMILIES_NAMED
    if isinstance(node, (ast.Set, ast.Tuple, ast.List)):
        return any(_names_family(e, constants) for e in node.elts)
    if isinstance(node, ast.Dict):
        return any(k is not None and _names_family(k, constants) for k in node.keys)
    return isinstance(node, ast.Name) and node.id in constants


def _is_family(node: ast.AST) -> bool:
    """``x.family`` or a variable named ``family``."""
    return (isinstance(node, ast.Attribute) and node.attr == "family") or (
        isinstance(node, ast.Name) and node.id == "family")


def family_checks(root: Path, package: str, allowed=frozenset()) -> list[tuple[str, str, str]]:
    """(module, function, comparison) for each comparison in ``package.cli`` of a model's
    family (``.family``, ``family``) with a family name, except those in ``allowed``."""
    found = []
    for name, path in modules(root, f"{package}/cli").items():
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
        constants = {t.id for node in tree.body if isinstance(node, ast.Assign)
                     for t in node.targets if isinstance(t, ast.Name)
                     and _names_family(node.value, set())}
        stack: list[tuple[ast.AST, str]] = [(tree, "<module>")]  # (node, its function)
        while stack:
            node, func = stack.pop()
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                func = node.name
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                if any(map(_is_family, sides)) and any(
                        _names_family(s, constants) for s in sides):
                    found.append((name, func, ast.get_source_segment(text, node)))
            stack += [(child, func) for child in ast.iter_child_nodes(node)]
    return sorted(set(found) - set(allowed))


def test_the_cli_does_not_switch_on_the_model_family():
    """What varies by family (the inputs of a text, the attention views, the batch an
    analysis measures, the samples after training) has its home below the CLI (the run,
    viz, interpret, the task); the CLI compares a family only to refuse a command that does
    not fit the run: :data:`ALLOWED_FAMILY_CHECKS`, each with its reason, all still there."""
    assert family_checks(SRC, "attnlab", ALLOWED_FAMILY_CHECKS) == []
    assert ALLOWED_FAMILY_CHECKS <= set(family_checks(SRC, "attnlab"))


def test_a_family_switch_in_the_cli_is_found(tmp_path):
    write(tmp_path, {"pkg/__init__.py": "", "pkg/cli/__init__.py": "",
                     "pkg/cli/a.py": 'LM = {"decoder", "encoder_decoder"}\n'
                     "def f(cfg, family):\n"
                     '    if cfg.family == "encoder":\n        return 1\n'
                     "    if family in LM or cfg.family in ('decoder',):\n        return 2\n"
                     '    return cfg.head == "mlm", family == cfg.family\n',
                     "pkg/other.py": 'def g(cfg):\n    return cfg.family == "decoder"\n'})
    assert family_checks(tmp_path, "pkg") == [
        ("pkg.cli.a", "f", "cfg.family == \"encoder\""),
        ("pkg.cli.a", "f", "cfg.family in ('decoder',)"),
        ("pkg.cli.a", "f", "family in LM")]
    allowed = {("pkg.cli.a", "f", "family in LM")}
    assert len(family_checks(tmp_path, "pkg", allowed)) == 2

"""The package layout is the pipeline: each package imports only from those before it, the runtime and
the ONNX-only commands stay free of PyTorch (and the runtime of ONNX), and the runtime installs alone."""

from __future__ import annotations

import ast
import graphlib
import json
import os
import shutil
import subprocess
import venv
from collections.abc import Callable
from pathlib import Path

import pytest
from support.common import HEAVY, REPO, modules_after, tiny_config

PACKAGE = REPO / "tfm_export"
# Dependency order; packages in one tuple are siblings and may not import each other.
ORDER = ("core", "artifacts", "model", "runtime", "graphs", "precision", "trt", ("verify", "bench", "demo", "serving"),
         "hf_layout", "cli", "benchmarks")
# Third-party modules a package may not import at all, lazily or not.
BANNED = {"core": HEAVY, "artifacts": HEAVY, "runtime": HEAVY - {"torch", "onnxruntime", "tensorrt"},
          "precision": {"torch"}, "trt": {"torch"}}
# The runtime's modules that may import PyTorch (lazily): the reference backend and the door's opener of it.
TORCH_IN_RUNTIME = {"runtime/backends/reference.py", "runtime/backends/__init__.py"}
# Test directories beside one per package: the shared helpers and oracles, the hostile battery, the examples in
# other languages, the project as a whole, and data files.
TEST_DIRS = {"support", "hostile", "examples", "project", "data"}
# scripts/ holds tooling only, each file with what runs it; benchmarks are tfm_export.benchmarks, one-off
# investigations the docs cite are experiments/.
TOOLING = {"build_cpp.py": "make cpp", "demo_verdict.py": "make demo",
           "gpu_check.py": "the lent GPU machine's one call (docs/runtime.md)",
           "gpu_parts": "gpu_check.py's parts, one module each"}

# The backend modules whose tests are not tests/runtime/backends/test_<module>.py: the file that holds them instead
# (its docstring names the module), beside the fixture or the oracle they share.
BACKEND_TESTS = {"__init__.py": "runtime/backends/test_door.py", "generate.py": "graphs/test_generate.py",
                 "tensorrt.py": "trt/test_tensorrt.py", "pingpong.py": "trt/test_tensorrt.py",
                 "reference.py": "runtime/test_search_equivalence.py",
                 "device_graphs.py": "runtime/backends/test_device.py",
                 "decoder_step_search.py": "runtime/backends/test_inplace.py"}


def _tier(package: str) -> int:
    return next(i for i, item in enumerate(ORDER) if package == item or (isinstance(item, tuple) and package in item))


def _imports(path: Path, root: Path) -> list[tuple[int, str]]:
    """(line, absolute module) of every import in a module, function-level and TYPE_CHECKING ones included."""
    here = path.relative_to(root.parent).parts[:-1]  # the package the module is in
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(here[:len(here) - node.level + 1]) if node.level else ""
            module = ".".join(p for p in (base, node.module or "") if p)
            found += [(node.lineno, f"{module}.{alias.name}" if node.module is None else module)
                      for alias in node.names]
    return found


def layer_violations(root: Path = PACKAGE) -> list[str]:
    problems = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).parts
        if len(parts) == 1:  # the package's own __init__: the public API, resolved lazily from runtime
            continue
        source = parts[0]
        for line, module in _imports(path, root):
            top, *rest = module.split(".")
            where = f"{path.relative_to(root.parent)}:{line} imports {module}"
            if top == "tfm_export" and rest and rest[0] in _ALL and rest[0] != source:
                if _tier(rest[0]) >= _tier(source):
                    problems.append(f"{where}: {rest[0]} is not before {source} in the pipeline")
            elif top in BANNED.get(source, ()):
                problems.append(f"{where}: {source} may not use {top}")
            elif top == "torch" and source == "runtime" and "/".join(parts) not in TORCH_IN_RUNTIME:
                problems.append(f"{where}: only the runtime's reference backend uses PyTorch")
    return problems


_ALL = {p for item in ORDER for p in (item if isinstance(item, tuple) else (item,))}


def test_every_package_is_placed_in_the_order():
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert packages == _ALL


def test_no_package_imports_from_a_later_one():
    assert layer_violations() == []


def test_the_layer_check_sees_an_upward_lazy_import(tmp_path):
    """The rule has teeth: a function-level import of the export code from the runtime is found."""
    copy = tmp_path / "tfm_export"
    for path in PACKAGE.rglob("*.py"):
        (copy / path.relative_to(PACKAGE)).parent.mkdir(parents=True, exist_ok=True)
        (copy / path.relative_to(PACKAGE)).write_text(path.read_text())
    leak = copy / "runtime" / "decoding.py"
    leak.write_text(leak.read_text() + "\n\ndef _leak():\n    from ..graphs.export import export_all\n")
    found = layer_violations(copy)
    assert len(found) == 1 and "graphs is not before runtime" in found[0]


def test_backends_are_one_interface_not_duck_typed():
    """One `expand` (runtime.step.Reorders) for every backend, and no `hasattr` probing of what a backend is: a
    searcher is chosen where the backend is opened."""
    expands, probes = [], []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef) and node.name == "expand":
                expands.append(str(path.relative_to(PACKAGE)))
            elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "hasattr" and \
                    "backend" in ast.unparse(node.args[0]):
                probes.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert set(expands) == {"runtime/step.py"} and probes == []  # the protocol and Reorders


def ast_findings(root: Path, skip: Callable[[tuple[str, ...]], bool], match: Callable[[ast.AST], bool],
                 label: Callable[[ast.AST], str] = lambda node: "") -> list[str]:
    """`module:line` (and label(node)) of every syntax node `match` picks in the modules under root, but those
    whose path within root (its parts) skip() leaves out."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if not skip(path.relative_to(root).parts):
            found += [f"{path.relative_to(root.parent)}:{node.lineno}{label(node)}"
                      for node in ast.walk(ast.parse(path.read_text(), str(path))) if match(node)]
    return found


def graph_kind_tests(root: Path = PACKAGE) -> list[str]:
    """Where code outside core decides what a graph is by its type (isinstance against a graph class) instead of
    reading the fact from its GraphSpec (optional, shares_table, capturable, simplified)."""
    return ast_findings(root, lambda parts: parts[0] == "core", lambda node: (
        isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance" and len(node.args) == 2
        and "Graph" in ast.unparse(node.args[1])))


def test_graph_kinds_are_facts_of_their_specs():
    assert graph_kind_tests() == [], "read the fact from the graph's GraphSpec (tfm_export.core.graph_spec)"


def backend_reads(root: Path = PACKAGE) -> list[str]:
    """Where code outside runtime reaches through an opened backend into its parts (`opened.backend.decoder`)
    instead of asking the runtime for what it needs (Opened.source, loaders.open_contract_sessions)."""
    return ast_findings(root, lambda parts: parts[0] == "runtime", lambda node: (
        isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and node.value.attr == "backend"))


def test_only_the_runtime_reads_a_backends_parts():
    assert backend_reads() == [], "ask tfm_export.runtime for it (Opened.source, open_contract_sessions)"


def _is_manifest(node: ast.AST) -> bool:
    return (isinstance(node, ast.Name) and node.id == "manifest") or \
        (isinstance(node, ast.Attribute) and node.attr == "manifest")


def manifest_reads(root: Path = PACKAGE) -> list[str]:
    """Where code outside artifacts looks a manifest's fields up by key (`manifest["graphs"]`,
    `x.manifest.get("parent")`) instead of reading its record (artifacts.records) or its directory's methods."""
    return ast_findings(root, lambda parts: parts[0] == "artifacts", lambda node: (
        (isinstance(node, ast.Subscript) and _is_manifest(node.value)) or
        (isinstance(node, ast.Attribute) and node.attr == "get" and _is_manifest(node.value))))


def test_only_artifacts_reads_a_manifests_keys():
    assert manifest_reads() == [], "read the manifest's record (tfm_export.artifacts.records) or ModelDir's methods"


def backend_imports(root: Path = PACKAGE) -> list[str]:
    """Where the export or precision code imports one of the runtime's backend modules instead of its door
    (runtime.backends: open_backend, graph_decoders, open_graph) or a runtime module made for it
    (runtime.prepacked, runtime.step_graph)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.relative_to(root).parts[0] in ("graphs", "precision"):
            found += [f"{path.relative_to(root.parent)}:{line} imports {module}"
                      for line, module in _imports(path, root) if module.startswith(f"{root.name}.runtime.backends.")]
    return found


def test_export_and_precision_code_use_the_runtimes_door():
    assert backend_imports() == []


def non_tooling(scripts: Path = REPO / "scripts", makefile: Path = REPO / "Makefile") -> list[str]:
    """Files in scripts/ that are not tooling: not in TOOLING, or said to be run by make but not in the Makefile."""
    recipes = makefile.read_text()
    found = []
    for path in sorted(p for p in scripts.iterdir() if p.name != "__pycache__"):
        if path.name not in TOOLING:
            found.append(f"{path.name}: not tooling (a benchmark is a module of tfm_export.benchmarks, an "
                         "investigation the docs cite a file of experiments/)")
        elif TOOLING[path.name].startswith("make ") and f"scripts/{path.name}" not in recipes:
            found.append(f"{path.name}: {TOOLING[path.name]} does not run it")
    return found


def test_scripts_holds_only_tooling():
    assert non_tooling() == []


def test_the_tooling_check_sees_a_stray_script_and_one_make_does_not_run(tmp_path):
    scripts, makefile = tmp_path / "scripts", tmp_path / "Makefile"
    scripts.mkdir()
    makefile.write_text("cpp:\n\tpython scripts/build_cpp.py\n")
    for name in ("build_cpp.py", "demo_verdict.py", "gpu_check.py", "timing.py"):
        (scripts / name).write_text("print()\n")
    found = non_tooling(scripts, makefile)
    assert [line.split(":")[0] for line in found] == ["demo_verdict.py", "timing.py"], found
    assert "make demo does not run it" in found[0] and "not tooling" in found[1], found


def test_the_tests_mirror_the_packages():
    """tests/<package>/ for each package (the reader finds a module's tests without grep), and nothing else but the
    shared helpers, the hostile battery, the examples, the project-wide checks and data."""
    tests = REPO / "tests"
    found = {p.name for p in tests.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert found == _ALL | TEST_DIRS
    assert not list(tests.glob("test_*.py")), "every test file belongs to a package's directory"


def untested_backends(backends: Path = PACKAGE / "runtime" / "backends", tests: Path = REPO / "tests") -> list[str]:
    """Backend modules without a test file that says it tests them: tests/runtime/backends/test_<module>.py, or
    the home BACKEND_TESTS gives it, whose docstring names runtime/backends/<module>."""
    found = []
    for path in sorted(backends.glob("*.py")):
        home = tests / BACKEND_TESTS.get(path.name, f"runtime/backends/test_{path.name}")
        named = home.exists() and f"runtime/backends/{path.name}" in (ast.get_docstring(ast.parse(home.read_text()))
                                                                      or "")
        if not named:
            found.append(f"{path.name}: no {home.relative_to(tests)} whose docstring names "
                         f"runtime/backends/{path.name}")
    return found


def test_each_backend_has_a_test_file_of_its_own():
    assert untested_backends() == []


def test_the_backend_test_check_sees_a_backend_without_tests(tmp_path):
    backends, tests = tmp_path / "backends", tmp_path / "tests"
    (tests / "runtime" / "backends").mkdir(parents=True)
    backends.mkdir()
    for name in ("concat.py", "fresh.py", "generate.py"):
        (backends / name).write_text("")
    (tests / "runtime" / "backends" / "test_concat.py").write_text('"""runtime/backends/concat.py"""\n')
    (tests / "runtime" / "backends" / "test_fresh.py").write_text('"""Tests of something else."""\n')
    assert [line.split(":")[0] for line in untested_backends(backends, tests)] == ["fresh.py", "generate.py"]


def _module_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (function-level imports included)."""
    modules = {".".join(p.relative_to(root.parent).with_suffix("").parts).removesuffix(".__init__"): p
               for p in root.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        graph[name] = set()
        for _, module in _imports(path, root):
            while module and module not in modules:  # `from .x import name` names a module or a member
                module = module.rpartition(".")[0]
            if module and module != name:
                graph[name].add(module)
    return graph


def import_cycle(root: Path = PACKAGE) -> list[str]:
    """One cycle of modules importing each other (lazily or not), or []: a cycle means one of them belongs
    elsewhere."""
    try:
        tuple(graphlib.TopologicalSorter(_module_graph(root)).static_order())
    except graphlib.CycleError as error:
        return error.args[1]
    return []


def test_no_module_imports_itself_through_others():
    assert import_cycle() == []


def test_the_cycle_check_sees_a_lazy_circle(tmp_path):
    copy = tmp_path / "tfm_export"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    reader = copy / "model" / "checkpoint.py"
    reader.write_text(reader.read_text() + "\n\ndef _hf():\n    from .huggingface import load_hf_checkpoint\n")
    assert set(import_cycle(copy)) == {"tfm_export.model.checkpoint", "tfm_export.model.huggingface"}


def literal_names(root: Path = PACKAGE) -> list[str]:
    """Where a module spells one of the graph contract's tensor names as a string instead of importing it. The
    names are read from the contract itself: every input and output of the graphs (the fused search step holds the
    search step's and one more)."""
    from tfm_export.core.graph_spec import Graph, decoder_step_spec, encoder_spec, search_step_spec
    cfg = tiny_config()
    specs = (encoder_spec(cfg), decoder_step_spec(cfg), search_step_spec(cfg, Graph.DECODER_STEP_SEARCH_FUSED))
    names = {t.name for spec in specs for t in (*spec.inputs, *spec.outputs)}
    return ast_findings(root, lambda parts: parts == ("core", "graph_spec.py"),
                        lambda node: isinstance(node, ast.Constant) and node.value in names,
                        lambda node: f": {node.value!r}")


def test_the_contracts_tensor_names_are_written_once():
    assert literal_names() == [], "import these names from tfm_export.core.graph_spec"


@pytest.mark.parametrize("check, module, code, found", [
    ("graph_kind_tests", "pkg/m.py", "def f(g):\n    return isinstance(g.graph, (Graph, str))\n", "pkg/m.py:2"),
    ("backend_reads", "pkg/m.py", "def f(opened):\n    config.backend = 1\n    return opened.backend.decoder\n",
     "pkg/m.py:3"),
    ("literal_names", "pkg/m.py", 'FEEDS = {"input_ids": 1}\nLABEL = f"logits of {FEEDS}"\n',
     "pkg/m.py:1: 'input_ids'"),
    ("backend_imports", "graphs/m.py", "from ..runtime.backends import open_backend\n"
     "from ..runtime.backends.decoder_step_search import SEARCH\n",
     "graphs/m.py:2 imports {root}.runtime.backends.decoder_step_search"),
    ("manifest_reads", "pkg/m.py", "def f(d, manifest):\n    return d.manifest.opset, manifest.graphs,\\\n"
     "        d.manifest.get('parent')\n", "pkg/m.py:3"),
    ("manifest_reads", "pkg/m.py", "def f(manifest):\n    return manifest.files\n\n\ng = lambda m: m['graphs'] or "
     "manifest['graphs']\n", "pkg/m.py:5"),
], ids=["isinstance", "backend-read", "literal", "backend-import", "manifest-get", "manifest-key"])
def test_each_check_sees_what_it_forbids(tmp_path, check, module, code, found):
    """Each rule above has teeth: a small package that breaks it once is found, at that line and only there."""
    (tmp_path / module).parent.mkdir()
    (tmp_path / module).write_text(code)
    assert globals()[check](tmp_path) == [f"{tmp_path.name}/{found.format(root=tmp_path.name)}"]


def test_importing_the_runtime_loads_neither_torch_nor_onnx():
    assert not modules_after("import tfm_export.runtime; from tfm_export import Translator") & {"torch", "onnx"}


def test_the_device_runtime_loads_neither_torch_nor_onnx(demo_onnx):
    """The GPU path (`tfm-run translate --device cuda` opens the device backend) decodes with no PyTorch and no
    onnx: run here on CPU OrtValues, the same code."""
    code = (f"import numpy as np\nfrom tfm_export.runtime import decoding\n"
            f"from tfm_export.runtime.backends import open_backend\nfrom tfm_export.runtime.session import "
            f"SessionOptions\nbackend = open_backend({str(demo_onnx)!r}, 'onnxruntime-device')"
            f".backend\nassert decoding.beam_search(backend, np.array([[2, 30, 31, 3]]), 2, 5)")
    loaded = modules_after(code)
    assert "onnxruntime" in loaded and not loaded & {"torch", "onnx"}


def test_translate_on_a_model_directory_loads_neither_torch_nor_onnx(demo_onnx):
    code = (f"from tfm_export.cli.run_cli import main\n"
            f"main(['translate', '--model', {str(demo_onnx)!r}, 'forty-two'], standalone_mode=False)")
    loaded = modules_after(code)
    assert "onnxruntime" in loaded and not loaded & {"torch", "onnx"}


@pytest.mark.parametrize("command", [["check", "--model", "{model}"],
                                     ["quantize", "--model", "{model}", "--precision", "int8", "--mode", "dynamic",
                                      "--output", "{out}"]])
def test_check_and_quantize_do_not_load_torch(demo_onnx, tmp_path, command):
    args = [a.format(model=demo_onnx, out=tmp_path / "out") for a in command]
    code = f"from tfm_export.cli.export_cli import main\nmain({args!r}, standalone_mode=False)"
    assert "torch" not in modules_after(code)


def test_the_runtime_installs_and_translates_without_pytorch(demo_onnx, tmp_path):
    """`pip install tfm-export` (no extras) into a fresh venv: translate the demo directory, no torch installed."""
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    source = tmp_path / "src"  # a copy, so the build leaves nothing in the repository
    shutil.copytree(REPO / "tfm_export", source / "tfm_export", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    subprocess.run([python, "-m", "pip", "install", "--quiet", str(source)], check=True, env=env, cwd=tmp_path)
    installed = subprocess.run([python, "-m", "pip", "list", "--format=json"], capture_output=True, text=True,
                               check=True, env=env).stdout
    names = {p["name"].lower() for p in json.loads(installed)}
    assert "tfm-export" in names and not names & {"torch", "onnx", "onnxscript", "polygraphy"}, sorted(names)
    run = subprocess.run([env_dir / "bin" / "tfm-run", "translate", "--model", demo_onnx, "forty-two"],
                         capture_output=True, text=True, env=env, cwd=tmp_path)
    assert run.returncode == 0 and run.stdout == "quarante-deux\n", run.stderr
    export = subprocess.run([env_dir / "bin" / "tfm-export", "onnx", "--checkpoint", REPO / "models/demo/ckpt.pt",
                             "--output", tmp_path / "out"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert export.returncode == 1 and "pip install 'tfm-export[export]'" in export.stderr
    assert "Traceback" not in export.stderr and not (tmp_path / "out").exists()

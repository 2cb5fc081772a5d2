"""dvc.yaml's stages declare what their commands read: DVC reruns a stage only when a dependency
changes, so a file read but not listed goes stale silently. A stage's code is its module and every
module of the repository that module imports, at any depth (lazy imports inside functions too);
its deps name whole folders (pipeline/lib, runtime/specrt), which cover every file under them."""

import ast
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
SPECBENCH = "../shared/data/specbench/question.jsonl"
DVC_FILES = ("dvc.yaml", "pipeline/full/dvc.yaml", "pipeline/vlm/dvc.yaml")
PACKAGES = {"pipeline": REPO / "pipeline", "specrt": REPO / "runtime" / "specrt"}  # the repository's own code
KERNELS = "runtime/kernels"  # the C++ sources of the library specrt.backend.kernels loads


def _stages() -> dict[str, dict]:
    """Every stage of both DVC files by ``file:name`` (foreach/matrix templates as written: their
    ``do`` body), its paths relative to the repository root (every stage of the full and vlm files
    runs with ``wdir: ../..``)."""
    stages = {}
    for file in DVC_FILES:
        for name, stage in yaml.safe_load((REPO / file).read_text())["stages"].items():
            stages[f"{file}:{name}"] = stage.get("do", stage)
    return stages


def _module_file(module: str) -> Path | None:
    """The source file of ``module`` if it is the repository's own (a package's ``__init__.py``)."""
    top, *rest = module.split(".")
    if top not in PACKAGES:
        return None
    base = PACKAGES[top].joinpath(*rest)
    for path in (base / "__init__.py", base.with_suffix(".py")):
        if path.is_file():
            return path
    return None


def _imported(module: str, path: Path) -> set[str]:
    """Every name an import statement of ``path`` names, relative ones resolved; ``from a import b``
    gives ``a`` and ``a.b`` (b may be a submodule)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            parts = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            source = ".".join(parts + ([node.module] if node.module else []))
            names.add(source)
            names.update(f"{source}.{alias.name}" for alias in node.names)
    return names


def import_closure(module: str) -> dict[str, Path]:
    """The repository's modules that running ``module`` imports, at any depth, with their files;
    importing ``a.b.c`` runs ``a`` and ``a.b`` first, so they count too."""
    seen: dict[str, Path] = {}
    todo = [module]
    while todo:
        parts = todo.pop().split(".")
        for i in range(1, len(parts) + 1):
            name = ".".join(parts[:i])
            if name not in seen and (path := _module_file(name)) is not None:
                seen[name] = path
                todo.extend(_imported(name, path))
    return seen


def _docstring_only(path: Path) -> bool:
    """A file whose only statement is its docstring: nothing in it can change what a stage does."""
    body = ast.parse(path.read_text()).body
    return len(body) == 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)


def _covered(path: Path, deps: list[str]) -> bool:
    rel = path.relative_to(REPO)
    return any(rel == Path(dep) or Path(dep) in rel.parents for dep in deps)


def _module_of(stage: dict) -> str:
    cmd = stage["cmd"].split()
    return cmd[cmd.index("-m") + 1]  # python -m pipeline.<stage>


@pytest.mark.parametrize("name", sorted(_stages()))
def test_a_stage_lists_its_module_and_the_spec_bench_file_when_its_command_reads_them(name):
    stage = _stages()[name]
    cmd, deps = stage["cmd"].split(), stage.get("deps", [])
    module = _module_of(stage)
    assert f"{module.replace('.', '/')}.py" in deps, f"{name}: its script {module} is not in deps"
    if SPECBENCH in cmd:
        assert SPECBENCH in deps, f"{name}: reads {SPECBENCH} but does not list it in deps"


@pytest.mark.parametrize("name", sorted(_stages()))
def test_a_stage_lists_every_module_its_code_imports(name):
    stage = _stages()[name]
    deps = stage.get("deps", [])
    closure = import_closure(_module_of(stage))
    missing = sorted(str(path.relative_to(REPO)) for path in closure.values()
                     if not _covered(path, deps) and not _docstring_only(path))
    assert not missing, f"{name}: imports code that its deps do not cover, a change there would not rerun it: {missing}"
    if any(m.startswith("specrt") for m in closure):
        assert KERNELS in deps, f"{name}: runs the runtime, whose operators are built from {KERNELS}"


def test_the_import_closure_follows_lazy_and_relative_imports():
    # pipeline.peers imports pipeline.lib.peer_worker inside a function, which imports
    # pipeline.lib.genai_peer inside another; `from .lib.measure import ...` is relative
    closure = import_closure("pipeline.peers")
    assert {"pipeline", "pipeline.lib", "pipeline.lib.peer_worker", "pipeline.lib.genai_peer",
            "pipeline.lib.measure", "specrt.engine.loop"} <= set(closure)
    assert "pipeline.lossless" not in closure  # no stage imports another
    assert not any(m.startswith("specrt") for m in import_closure("pipeline.weights"))

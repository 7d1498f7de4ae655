"""The wheel contains every module of the repository's stage folders and each imports
from an installed copy (an unlisted subpackage imports in editable mode yet is missing
from the wheel)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: repository folder → import package, as pyproject's package-dir maps them
STAGES = {
    "polytile": "polytile",
    "frontend": "polytile.frontend",
    "poly": "polytile.poly",
    "search": "polytile.search",
    "codegen": "polytile.codegen",
}


def source_files() -> dict[str, Path]:
    """Every module of the stage folders by its import name."""
    modules = {}
    for folder, package in STAGES.items():
        for path in (ROOT / folder).rglob("*.py"):
            if "__pycache__" in path.parts:
                continue
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join((package, *parts))] = path
    return modules


def source_modules() -> set[str]:
    return set(source_files())


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # build from a clean copy: setuptools reuses a stale build/ folder in the source tree
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for folder in STAGES:
        shutil.copytree(
            ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__")
        )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out),
            str(source),
        ],
        check=True,
    )
    (found,) = out.glob("polytile-*.whl")
    return found


def wheel_modules(wheel: Path) -> set[str]:
    modules = set()
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if name.endswith(".py"):
                parts = Path(name).with_suffix("").parts
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                modules.add(".".join(parts))
    return modules


def test_wheel_holds_every_source_module(wheel: Path) -> None:
    missing = source_modules() - wheel_modules(wheel)
    assert not missing, f"modules missing from the wheel (list them in pyproject): {missing}"


def test_every_module_imports_from_installed_wheel(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "-q",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
    )
    modules = sorted(wheel_modules(wheel))
    script = (
        "import importlib, sys\n"
        f"target = {str(target)!r}\n"
        f"for name in {modules!r}:\n"
        "    module = importlib.import_module(name)\n"
        "    assert module.__file__.startswith(target), (name, module.__file__)\n"
        "print(len(sys.modules))\n"
    )
    # -S skips site-packages' .pth files, so the editable install cannot answer the import
    site = sysconfig.get_paths()["purelib"]
    env = {"PYTHONPATH": f"{target}:{site}", "PATH": "/usr/bin:/bin"}
    result = subprocess.run(
        [sys.executable, "-S", "-c", script],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr


def test_wheel_holds_the_modern_zoo(wheel: Path) -> None:
    """The zoo's light ONNX files are package data: a user's install has no ../shared."""
    shipped = sorted((ROOT / "polytile" / "zoo" / "models").glob("*.onnx"))
    assert len(shipped) == 32
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    missing = [p.name for p in shipped if f"polytile/zoo/models/{p.name}" not in names]
    assert not missing, f"zoo files missing from the wheel (pyproject package-data): {missing}"

"""The host a result was measured on, stamped into every file the benchmarks write: a
figure means something only beside the CPU, its features, its cores and L2, and the
versions of polytile and its peers that produced it.

`fingerprint()` is the record (the `meta` of every json), `header()` its one-line form
(the second line of every md), and `write_results` writes a json/md pair with both.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import importlib.util
import json
import os
import platform
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

import llvmlite.binding as llvm

from polytile.codegen.target import host

#: distributions whose versions a result depends on; the optional peers only when installed
LIBRARIES = ("polytile", "numpy", "onnxruntime", "onnx", "llvmlite", "islpy", "scikit-learn")
#: optional peers: import name -> distribution names that may provide it
OPTIONAL = {"openvino": ("openvino",), "tvm": ("apache-tvm", "tlcpack", "tvm")}
#: environment variables that change a peer's speed (OpenBLAS's kernels, thread counts)
ENVIRONMENT = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OMP_NUM_THREADS", "POLYTILE_THREADS")
#: feature prefixes the md header names (the vector ISA; the json keeps all features)
VECTOR_FEATURES = ("avx", "fma", "amx", "sse4")


def _version(*names: str) -> str | None:
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def library_versions() -> dict[str, str]:
    """Installed versions of polytile's dependencies and of the optional peers."""
    found = {name: _version(name) for name in LIBRARIES}
    for module, dists in OPTIONAL.items():
        if importlib.util.find_spec(module) is None:
            continue
        version = _version(*dists)
        if version is None:  # built from source: no distribution metadata
            version = str(getattr(__import__(module), "__version__", "unknown"))
        found[module] = version
    found["llvm"] = ".".join(map(str, llvm.llvm_version_info))
    return {k: v for k, v in found.items() if v is not None}


def git_commit(root: Path | None = None) -> dict[str, object]:
    """polytile's commit and whether the work tree differs from it (None outside git);
    the report's own outputs (benchmarks/results, the README's table) do not count."""
    root = root or Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            cwd=root, capture_output=True, text=True, check=True, timeout=30,
        ).stdout.strip()  # fmt: skip
        changed = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
             ":(exclude)benchmarks/results", ":(exclude)README.md"],
            cwd=root, capture_output=True, text=True, check=True, timeout=60,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}
    return {"commit": commit, "dirty": bool(changed)}


def _cpu_model() -> str:
    """The marketing name of the CPU (/proc/cpuinfo), or the platform's processor string."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def fingerprint(threads: int | None = None) -> dict[str, object]:
    """This host as the benchmarks saw it: LLVM's CPU name and enabled features, cores,
    L2, library versions and polytile's commit."""
    target = host(threads)
    enabled = sorted(f[1:] for f in target.features.split(",") if f.startswith("+"))
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        usable = os.cpu_count() or 1
    return {
        "cpu": target.cpu,
        "cpu_model": _cpu_model(),
        "features": enabled,
        "vector_bits": target.vector_bits,
        "cores": usable,
        "threads": target.num_threads,
        "l2_bytes": target.l2_bytes,
        "machine": platform.machine(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "versions": library_versions(),
        "polytile_commit": git_commit(),
        "environment": {k: os.environ[k] for k in ENVIRONMENT if k in os.environ},
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def header(fp: Mapping[str, object]) -> str:
    """One markdown line naming the host and the versions (the md files' second line)."""
    features = " ".join(f for f in fp["features"] if f.startswith(VECTOR_FEATURES))
    versions = ", ".join(f"{k} {v}" for k, v in fp["versions"].items())
    git = fp["polytile_commit"]
    commit = git.get("commit") or "no git"
    if git.get("dirty"):
        commit += " with local changes"
    env = fp.get("environment") or {}
    settings = "; " + ", ".join(f"{k}={v}" for k, v in env.items()) if env else ""
    return (
        f"Host: {fp['cpu']} ({fp['cpu_model']}), {fp['cores']} cores, "
        f"{fp['threads']} threads, L2 {int(fp['l2_bytes']) // 1024} KiB, "
        f"{fp['vector_bits']}-bit vectors ({features}); polytile commit {commit}; "
        f"{versions}{settings}; {fp['date']}."
    )


def write_results(
    out: Path,
    stem: str,
    rows: Sequence[object] | Mapping[str, object],
    lines: Sequence[str],
    meta: Mapping[str, object] | None = None,
    fp: Mapping[str, object] | None = None,
) -> list[Path]:
    """`out/stem.json` ({"meta": fingerprint + meta, "rows": rows}) and `out/stem.md` (the
    lines, with the host header after the title). Returns the paths written."""
    fp = dict(fp) if fp is not None else fingerprint()
    out.mkdir(parents=True, exist_ok=True)
    data = {"meta": {**fp, **(meta or {})}, "rows": rows}
    json_path, md_path = out / f"{stem}.json", out / f"{stem}.md"
    json_path.write_text(json.dumps(data, indent=1, default=float) + "\n")
    text = [*lines[:1], "", header(fp), *lines[1:]]
    md_path.write_text("\n".join(text).rstrip("\n") + "\n")
    return [json_path, md_path]

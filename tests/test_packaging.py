"""The built distribution: an sdist and a wheel that carry every native source, and a wheel that, installed into a
fresh virtual environment, builds the int4 kernel from its own installed sources and runs a layer with it."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NATIVE = ROOT / "verispec" / "native"

# Run inside the fresh environment, from a folder outside the source tree: the installed package builds its kernel
# into the cache folder $VERISPEC_CACHE names and runs one 4-bit layer, checked against the float product.
INSTALLED_LAYER = """
import sys
import torch
import verispec
from verispec.cache import cache_dir
from verispec.models.grid4 import grid_4bit
from verispec.models.int4 import Int4Linear

assert verispec.__file__.startswith(sys.argv[1]), verispec.__file__
gen = torch.Generator().manual_seed(0)
q = torch.randint(0, 16, (64 * 64 // 32, 32), generator=gen).float()
scale = torch.rand(q.shape[0], 1, generator=gen) * 0.01 + 0.001
weight = (-8 * scale + scale * q).reshape(64, 64)
layer = Int4Linear(*grid_4bit(weight)[:3], None)
x = torch.randn(3, 64, generator=gen)
y, expected = layer(x), x @ weight.T
assert y.shape == (3, 64)
assert (y - expected).abs().max() <= 0.02 * expected.abs().max(), (y - expected).abs().max()
built = [str(p) for p in (cache_dir() / "native").glob("int4-*/*.so")]
assert built, "the kernel was not built in the cache folder"
print(verispec.__file__, built[0], layer.kernel.isa())
"""


def native_sources() -> set[str]:
    return {path.name for path in NATIVE.iterdir() if path.suffix in {".c", ".cpp", ".h"}}


@pytest.mark.slow
def test_the_wheel_installs_and_builds_its_kernel_from_its_own_sources(tmp_path):
    # 1. The sdist, and the wheel built from it (python -m build), with the interpreter's setuptools: no network.
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(ROOT)], check=True,
                   capture_output=True, timeout=300)
    (wheel,) = dist.glob("verispec-*.whl")
    assert len(list(dist.glob("verispec-*.tar.gz"))) == 1
    with zipfile.ZipFile(wheel) as archive:
        packed = {Path(name).name for name in archive.namelist() if name.startswith("verispec/native/")}
    assert native_sources() <= packed, native_sources() - packed

    # 2. A fresh environment that sees this interpreter's libraries (torch, ...) through a .pth file, and the wheel
    # installed into it without the network.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], check=True,
                          capture_output=True, text=True).stdout.strip()
    (Path(site) / "outer.pth").write_text(sysconfig.get_path("purelib") + "\n")
    env = {key: value for key, value in os.environ.items() if key not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    env["VERISPEC_CACHE"] = str(tmp_path / "cache")
    # --ignore-installed: this interpreter's own (editable) verispec is visible through the .pth; leave it alone.
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--ignore-installed",
                    str(wheel)], check=True, env=env, timeout=120)

    # 3. From a folder outside the source tree: the installed copy is the one imported, builds and runs.
    work = tmp_path / "work"
    work.mkdir()
    run = subprocess.run([str(python), "-c", INSTALLED_LAYER, str(venv)], cwd=work, env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    imported, built, _ = run.stdout.split()
    assert imported.startswith(str(venv)) and built.startswith(str(tmp_path / "cache"))

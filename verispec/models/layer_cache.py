"""The kernel layers a GGUF model's load computes rather than repacks, cached once per model and backend.

Why: a GGUF's 4-bit blocks become the kernel's layers by a repack (`verispec.models.gguf_layers.kernel_layer`), but
every other tensor is dequantised and then computed on: rounded to a 4-bit grid for the draft (`grid_4bit`) or
quantised to int8 rows (`Int8RowLinear`: the target's Q6_K layers and LM head). On the default pair those were most
of the load (measured with 2 threads on a 2-core Xeon: the draft 17 s, of which 10 s rounding its layers and head;
the target 18 s, of which 5.5 s its int8 rows). Here the computed layers' packed tensors are written once into
one safetensors file and read back on later loads. Layers repacked from 4-bit blocks are not cached: the repack is
about as fast as reading them back, and caching them would double the default pair's disk use.

Each file is checked as the model folders are (`verispec.models.manifest`): its sha256 once after it was written
or moved, its size and stat after that. A damaged, stale or unreadable cache is rebuilt, never loaded; a cache that
cannot be written (a read-only or full disk) leaves the load as it was, with one line saying so.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from verispec.models.int4 import Int4Linear, Int8RowLinear
from verispec.models.manifest import (
    file_manifest,
    file_stat,
    manifest_problem,
    publish_folder,
    read_marker,
    scratch_folder,
    write_marker,
    write_verified,
)

LAYOUT = 1  # bump when a cached layer's tensors change meaning (int4.pack, pack8, what `state()` returns)
FILE = "layers.safetensors"
KINDS = {"int4": Int4Linear, "int8_rows": Int8RowLinear}


class LayerCache:
    """The cached layers of one model in `folder` (None: no cache), read if whole, written by `save` when a load
    computed layers the folder did not have."""

    def __init__(self, folder: Path | None, source: str = "") -> None:
        self.folder, self.source = folder, source
        self.found: dict[str, tuple[Any, dict[str, int]]] = {}
        self.computed: dict[str, tuple[Any, dict[str, int]]] = {}
        if folder is not None and _whole(folder):
            try:
                self.found = _read(folder / FILE)
            except (OSError, ValueError, KeyError, RuntimeError) as exc:  # unreadable: rebuilt by this load
                print(f"verispec: the layer cache {folder} is unreadable ({exc}); rebuilding it", file=sys.stderr)

    def layer(self, name: str, compute: Any) -> tuple[Any, dict[str, int]]:
        """Return (layer, its counts per kind) for the linear `name`: the cached one, else `compute()`'s, kept for
        `save` when it is a layer kind this cache holds."""
        if name in self.found:
            return self.found[name]
        layer, counts = compute()
        if self.folder is not None and type(layer) in KINDS.values():
            self.computed[name] = (layer, counts)
        return layer, counts

    def save(self) -> None:
        """Write every layer of this model (found and computed) to the folder, if this load computed any."""
        if self.folder is None or not self.computed:
            return
        scratch = None
        try:
            scratch = scratch_folder(self.folder)
            _write(scratch / FILE, {**self.found, **self.computed})
            files = file_manifest(scratch)
            write_marker(scratch, {"source": self.source, "layout": LAYOUT, "files": files})
            # the sha256 just written matches: the first load trusts the file by its stat, as a verified one
            write_verified(scratch, {FILE: {"sha256": files[FILE]["sha256"], **file_stat(scratch / FILE)}})
            publish_folder(scratch, self.folder)
        except OSError as exc:  # a full or read-only disk: the model is loaded, only the next load is slower
            print(f"verispec: could not cache the computed layers in {self.folder} ({exc.strerror or exc}); "
                  "the next load computes them again", file=sys.stderr)
        finally:
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)
        self.found, self.computed = {**self.found, **self.computed}, {}


def _whole(folder: Path) -> bool:
    marker = read_marker(folder)
    if marker is None or marker.get("layout") != LAYOUT or "files" not in marker:
        return False
    problem = manifest_problem(folder, marker["files"])
    if problem is not None:
        print(f"verispec: the layer cache is damaged ({problem}); rebuilding it", file=sys.stderr)
    return problem is None


def _write(path: Path, layers: dict[str, tuple[Any, dict[str, int]]]) -> None:
    from safetensors.torch import save_file

    tensors, index = {}, {}
    for name, (layer, counts) in layers.items():
        kind = next(k for k, cls in KINDS.items() if type(layer) is cls)
        index[name] = {"kind": kind, "counts": counts}
        tensors |= {f"{name}/{part}": t.contiguous() for part, t in layer.state().items()}
    save_file(tensors, str(path), metadata={"layers": json.dumps(index)})
    with open(path, "rb+") as handle:  # on disk before the marker names it (a crash leaves no half file trusted)
        os.fsync(handle.fileno())


def _read(path: Path) -> dict[str, tuple[Any, dict[str, int]]]:
    from safetensors import safe_open

    layers = {}
    with safe_open(str(path), framework="pt") as handle:  # memory-mapped: one layer's tensors read at a time
        index = json.loads(handle.metadata()["layers"])
        parts: dict[str, list[str]] = {name: [] for name in index}
        for key in handle.keys():
            parts[key.rsplit("/", 1)[0]].append(key)
        for name, entry in index.items():
            state = {key.rsplit("/", 1)[1]: handle.get_tensor(key) for key in parts[name]}
            layers[name] = (KINDS[entry["kind"]].from_state(state), dict(entry["counts"]))
    return layers


def folder_for(root: Path, key: str, rounded: bool) -> Path:
    """Return the cache folder of the model whose tokenizer folder is keyed `key`, on "int4-rounded" or not."""
    return root / "layers" / f"{key}-{'rounded' if rounded else 'exact'}-L{LAYOUT}"

"""A GGUF file's tensor table and its tensors' bytes, memory-mapped: what loading its weights needs, read in a second.

Why not `gguf.GGUFReader`: it builds a numpy view per metadata element, and a Qwen2.5 GGUF's tokenizer metadata holds
300,000 strings (vocabulary and merges): 12-18 s per file on a 2-core Xeon before the first tensor is read.
This reader walks past metadata arrays and keeps only scalar values (architecture, head counts, alignment); the
config is built from these scalars and the tokenizer read by transformers, once, and cached
(`verispec.models.gguf_meta`, `verispec.models.gguf_direct.model_files`).

Format (github.com/ggml-org/ggml/blob/master/docs/gguf.md, little-endian): magic "GGUF", version (2 or 3), tensor
count, metadata count; metadata as (key, type, value); per tensor its name, dimensions (innermost first), ggml type
and offset into the data section, which starts at the next multiple of `general.alignment` (default 32).
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from math import prod
from pathlib import Path
from typing import Any

import torch
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as GGML

from verispec.errors import ModelFilesError

# metadata value type -> struct format of the fixed-size ones; 8 is a string, 9 an array
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9
VERSIONS = (2, 3)


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of a GGUF file: where its bytes are and how they encode it."""

    name: str
    shape: tuple[int, ...]  # torch order: [rows, cols] for a matrix (GGUF lists the innermost dimension first)
    type_id: int  # the ggml type as stored (`ggml_type` is its enum, when this gguf package knows it)
    offset: int  # from the start of the file
    nbytes: int

    @property
    def ggml_type(self) -> GGML:
        return GGML(self.type_id)


class _Cursor:
    """Reads the header's little-endian fields in order."""

    def __init__(self, buf: Any) -> None:
        self.buf, self.pos = buf, 0

    def scalar(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.scalar("<Q")
        if self.pos + n > len(self.buf):
            raise ValueError("a string runs past the end of the file")
        self.pos += n
        return bytes(self.buf[self.pos - n: self.pos]).decode("utf-8", errors="replace")

    def value(self, kind: int) -> Any:
        """Return a metadata value; an array is skipped and stands as its length (no caller needs its items)."""
        if kind in SCALARS:
            return self.scalar(SCALARS[kind])
        if kind == STRING:
            return self.string()
        if kind != ARRAY:
            raise ValueError(f"unknown metadata value type {kind}")
        item, count = self.scalar("<I"), self.scalar("<Q")
        if item in SCALARS:
            self.pos += count * struct.calcsize(SCALARS[item])
        elif item == STRING:  # a tokenizer's vocabulary: a length, then the bytes, per string
            for _ in range(count):
                self.pos += 8 + struct.unpack_from("<Q", self.buf, self.pos)[0]
        else:
            for _ in range(count):
                self.value(item)
        if self.pos > len(self.buf):
            raise ValueError("an array runs past the end of the file")
        return count


class GGUFFile:
    """The tensor table and scalar metadata of the GGUF file at `path` (`arrays`: the metadata keys that hold arrays,
    which `metadata` gives as their lengths), its data memory-mapped (copy-on-write, so
    tensors viewing it are writable and the file is never changed). Raises ModelFilesError, in one line naming the
    file, for a file that is no GGUF or is shorter than its tensors' extent (a truncated download or copy)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            with open(self.path, "rb") as handle:
                self._map = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY)
        except (OSError, ValueError) as exc:  # ValueError: an empty file cannot be mapped
            raise ModelFilesError(f"cannot read the GGUF file {self.path}: {exc}") from None
        try:
            self.metadata, self.tensors, self.arrays = self._parse(_Cursor(self._map))
        except (struct.error, ValueError, OverflowError) as exc:
            raise ModelFilesError(f"{self.path} is not a readable GGUF file ({exc})") from None
        end = max((t.offset + t.nbytes for t in self.tensors.values()), default=0)
        if end > len(self._map):
            raise ModelFilesError(f"the GGUF file {self.path} is truncated: it has {len(self._map)} bytes, its "
                                  f"tensors extend to {end}")

    @staticmethod
    def _parse(cur: _Cursor) -> tuple[dict[str, Any], dict[str, TensorEntry], frozenset[str]]:
        if bytes(cur.buf[:4]) != b"GGUF":
            raise ValueError("it does not start with the GGUF magic number")
        cur.pos = 4
        version = cur.scalar("<I")
        if version not in VERSIONS:
            raise ValueError(f"GGUF version {version}; this reader knows {', '.join(map(str, VERSIONS))}")
        n_tensors, n_meta = cur.scalar("<Q"), cur.scalar("<Q")
        metadata, arrays = {}, set()
        for _ in range(n_meta):
            key = cur.string()
            kind = cur.scalar("<I")
            metadata[key] = cur.value(kind)
            if kind == ARRAY:
                arrays.add(key)
        infos = []
        for _ in range(n_tensors):
            name = cur.string()
            dims = [cur.scalar("<Q") for _ in range(cur.scalar("<I"))]
            infos.append((name, tuple(reversed(dims)), cur.scalar("<I"), cur.scalar("<Q")))
        align = int(metadata.get("general.alignment", 32))
        start = -(-cur.pos // align) * align
        tensors = {}
        for name, shape, type_id, offset in infos:
            block, size = GGML_QUANT_SIZES.get(_known(type_id), (1, 0))
            nbytes = prod(shape) // block * size  # 0 for a type this gguf package does not know (refused later)
            tensors[name] = TensorEntry(name, shape, type_id, start + offset, nbytes)
        return metadata, tensors, frozenset(arrays)

    @property
    def architecture(self) -> str:
        """`general.architecture`: "qwen2", "llama", ..."""
        return str(self.metadata.get("general.architecture", "?"))

    def parameter_counts(self) -> tuple[int, int]:
        """Return (parameters, parameters one forward reads: all but an untied input-embedding table), as
        `verispec.profile.count_params` counts a float model's."""
        params = sum(prod(t.shape) for t in self.tensors.values())
        embed = self.tensors.get("token_embd.weight")
        tied = "output.weight" not in self.tensors
        return params, params - (0 if tied or embed is None else prod(embed.shape))

    def raw(self, name: str) -> torch.Tensor:
        """Return the bytes of tensor `name` as a uint8 tensor viewing the mapped file (no copy)."""
        entry = self.tensors[name]
        return torch.frombuffer(self._map, dtype=torch.uint8, count=entry.nbytes, offset=entry.offset)

    def release(self, name: str) -> None:
        """Drop the mapped pages of tensor `name` from this process's memory, once what was built from its bytes no
        longer views them. Why: every page a load reads stays resident while the file is mapped, and a 1.5B Q4_K_M
        target's file (1.1 GB) sat beside the weights built from it until the load ended. A page touched again is
        read again from the file (the mapping is private and never written), so this changes no value."""
        entry = self.tensors[name]
        start = entry.offset - entry.offset % mmap.PAGESIZE
        if hasattr(mmap, "MADV_DONTNEED") and entry.nbytes:
            self._map.madvise(mmap.MADV_DONTNEED, start, entry.offset + entry.nbytes - start)


def _known(type_id: int) -> GGML | None:
    try:
        return GGML(type_id)
    except ValueError:
        return None


def type_name(entry: TensorEntry) -> str:
    """The name of the tensor's ggml type ("Q4_K"), or its number when this gguf package does not know it."""
    known = _known(entry.type_id)
    return known.name if known is not None else f"type id {entry.type_id}"

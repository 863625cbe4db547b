"""Provenance: the CPU description parsed from /proc texts, and the keys every results file records."""

from __future__ import annotations

from verispec.provenance import cpu_description, provenance

CPUINFO = """processor\t: 0
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse2 avx2 fma avx512f avx512_vnni amx_tile
processor\t: 1
model name\t: another entry, not read
"""


def test_cpu_description_reads_the_model_the_kernel_features_and_the_memory():
    cpu = cpu_description(CPUINFO, "MemTotal:       16777216 kB\nMemFree: 1 kB\n")
    assert cpu == {"cpu_model": "Intel(R) Xeon(R) Platinum 8480+",
                   "cpu_features": ["avx2", "fma", "avx512f", "avx512_vnni", "amx_tile"], "memory_gb": 16.0}


def test_cpu_description_without_proc_files_says_it_does_not_know():
    assert cpu_description("", "") == {"cpu_model": None, "cpu_features": None, "memory_gb": None}


def test_provenance_has_the_results_file_keys():
    origin = provenance("cpu")
    assert list(origin) == ["machine", "versions", "git_commit", "git_dirty"]
    assert origin["machine"]["device"] == "cpu" and origin["versions"]["torch"] == origin["machine"]["torch"]

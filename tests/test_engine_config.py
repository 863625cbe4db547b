"""DecodeConfig's number of draft paths: a multi-path method gets several by default and refuses one."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from verispec import Decoder
from verispec.engine import MULTIPATH_PATHS, DecodeConfig
from verispec.errors import ConfigError
from verispec.methods import METHODS

MULTIPATH = [name for name, method in METHODS.items() if method.multipath]
SINGLE = [name for name, method in METHODS.items() if not method.multipath]


def test_the_registry_has_both_kinds():
    assert {"gbv", "specinfer", "spectr", "nss", "traversal"} <= set(MULTIPATH) and {"ar", "sd", "bv"} <= set(SINGLE)


@pytest.mark.parametrize("method", MULTIPATH)
def test_multipath_methods_default_to_several_paths_and_refuse_one(method):
    config = DecodeConfig(method)
    assert config.paths == MULTIPATH_PATHS >= 2 and config == DecodeConfig(method, paths=MULTIPATH_PATHS)
    assert asdict(config)["paths"] == MULTIPATH_PATHS  # what results files record is the K that ran
    assert DecodeConfig(method, paths=2).paths == 2
    with pytest.raises(ConfigError, match=f"method '{method}' needs paths >= 2"):
        DecodeConfig(method, paths=1)


def test_gbv_with_one_path_names_the_method_it_would_be():
    with pytest.raises(ConfigError) as error:
        DecodeConfig("gbv", paths=1)
    assert str(error.value) == "method 'gbv' needs paths >= 2 (with one path it is block verification: use --method bv)"


@pytest.mark.parametrize("method", SINGLE)
def test_single_path_methods_default_to_one_path(method):
    assert DecodeConfig(method).paths == 1
    with pytest.raises(ConfigError, match="single path"):
        DecodeConfig(method, paths=2)


def test_the_api_decodes_gbv_with_the_default_paths(tiny_pair):
    decoder = Decoder(tiny_pair["target"], tiny_pair["partial"])
    gen = decoder.generate("hello", method="gbv", gamma=2, max_new_tokens=6, temperature=1.0, seed=2)
    assert gen.config.paths == MULTIPATH_PATHS
    assert {r.paths for r in gen.trace.rounds} == {MULTIPATH_PATHS}
    with pytest.raises(ConfigError, match="needs paths >= 2"):
        decoder.generate("hello", method="gbv", paths=1)

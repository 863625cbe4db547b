"""verispec: speculative decoding on real models, with the cost of every speed-up measured.

Public API: `generate` (one call) and `Decoder` (a model pair kept loaded, chosen by a `ModelSpec`); `Engine` and
the pure verifiers in `verispec.verify` for lower-level use.
"""

from verispec.api import Decoder, Generation, generate
from verispec.engine import DecodeConfig, DecodeOutput, Engine
from verispec.errors import ConfigError, IncompatibleModelsError, ModelFilesError, VerispecError
from verispec.methods import METHODS
from verispec.models.spec import ModelSpec
from verispec.sampling import SamplingConfig

__version__ = "0.1.0"

__all__ = [
    "METHODS",
    "ConfigError",
    "DecodeConfig",
    "DecodeOutput",
    "Decoder",
    "Engine",
    "Generation",
    "IncompatibleModelsError",
    "ModelFilesError",
    "ModelSpec",
    "SamplingConfig",
    "VerispecError",
    "generate",
]

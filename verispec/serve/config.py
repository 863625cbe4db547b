"""The settings of one server (its request defaults are a `DecodeConfig`, the one carrier of decode settings)."""

from __future__ import annotations

from dataclasses import dataclass, field

from verispec.engine import DecodeConfig
from verispec.errors import ConfigError

LOAD_GAMMA = ("invariant", "always", "off")


@dataclass(frozen=True)
class ServeConfig:
    """Settings of a server; requests override `defaults` field by field."""

    defaults: DecodeConfig = field(default_factory=DecodeConfig)  # method, γ, K, sampling, seed, max tokens
    model_name: str = "verispec"  # the one id in /v1/models; requests naming another model get 404
    max_queue: int = 16  # requests waiting for the engine; one more is answered 429
    max_batch: int = 4  # requests decoded at once (verispec.serve.batched); 1: one at a time, first come first served
    # Whether a batched request's adaptive draft length follows the load (verispec.serve.batched.load_follows):
    # "invariant" (where that cannot change its tokens), "always" (the same law, another sample at T > 0) or "off".
    load_gamma: str = "invariant"
    time_limit: float = 600.0  # seconds a generation may run; it then ends at the next round boundary
    shutdown_grace: float = 10.0  # seconds running generations may go on after SIGTERM/SIGINT before they are ended

    def __post_init__(self) -> None:
        if not isinstance(self.max_queue, int) or self.max_queue < 1:
            raise ConfigError(f"max_queue must be an integer >= 1, got {self.max_queue!r}")
        if not isinstance(self.max_batch, int) or isinstance(self.max_batch, bool) or not 1 <= self.max_batch <= 64:
            raise ConfigError(f"max_batch must be an integer in 1..64, got {self.max_batch!r}")
        if self.load_gamma not in LOAD_GAMMA:
            raise ConfigError(f"load_gamma must be one of {', '.join(LOAD_GAMMA)}, got {self.load_gamma!r}")
        if not isinstance(self.time_limit, (int, float)) or not self.time_limit > 0:
            raise ConfigError(f"time_limit must be a number of seconds > 0, got {self.time_limit!r}")
        # 0 is allowed: running generations end at their next round boundary, with no grace at all.
        if not isinstance(self.shutdown_grace, (int, float)) or not self.shutdown_grace >= 0:
            raise ConfigError(f"shutdown_grace must be a number of seconds >= 0, got {self.shutdown_grace!r}")

"""`verispec serve`: an OpenAI-compatible HTTP server over a `Decoder`, with streaming and acceptance metrics.

`create_app(decoder, ServeConfig(...))` returns the ASGI app for embedding; `verispec serve` runs it on uvicorn.
The web stack is imported on first use, so the rest of the `verispec` command does not pay for it.
"""

from typing import Any

__all__ = ["ServeConfig", "create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from verispec.serve.app import create_app

        return create_app
    if name == "ServeConfig":
        from verispec.serve.config import ServeConfig

        return ServeConfig
    raise AttributeError(name)

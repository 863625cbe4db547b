"""Subcommands of the benchmark harness, registered into the `verispec` parser."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    """Add the benchmark subcommands to the `verispec` command's subparsers."""

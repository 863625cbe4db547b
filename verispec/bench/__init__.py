"""Benchmarks and reports: they sit on top of the public API and never reach into the engine's internals."""

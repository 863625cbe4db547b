"""verispec's exceptions: every user-facing failure is one of these, with a message that names the problem."""


class VerispecError(Exception):
    """Base class of verispec's errors."""


class ConfigError(VerispecError, ValueError):
    """An invalid argument: length, temperature, threshold, method name, prompt.

    `fields`: the settings it is about (DecodeConfig, SamplingConfig or ModelSpec names), the one to blame first;
    empty when it is about none in particular. An error about two settings lists both (`ngram_min` above
    `ngram_max`), so that a caller can name the one its user gave (the server's `param`).
    """

    def __init__(self, message: str, field: str | tuple[str, ...] | None = None) -> None:
        super().__init__(message)
        self.fields: tuple[str, ...] = (field,) if isinstance(field, str) else tuple(field or ())

    @property
    def field(self) -> str | None:
        """Return the setting the error is about first (None: none in particular)."""
        return self.fields[0] if self.fields else None


class ModelFilesError(VerispecError, FileNotFoundError):
    """Model files are missing, corrupt or of the wrong version."""


class IncompatibleModelsError(VerispecError, ValueError):
    """Draft and target cannot be paired (different vocabularies or tokenizers)."""


class VerifierFileError(VerispecError, ValueError):
    """A verifier (or verifier training data) file is missing, corrupt, incomplete, or made for another draft."""

"""verispec's exceptions: every user-facing failure is one of these, with a message that names the problem."""


class VerispecError(Exception):
    """Base class of verispec's errors."""


class ConfigError(VerispecError, ValueError):
    """An invalid argument: length, temperature, threshold, method name, prompt."""


class ModelFilesError(VerispecError, FileNotFoundError):
    """Model files are missing, corrupt or of the wrong version."""


class IncompatibleModelsError(VerispecError, ValueError):
    """Draft and target cannot be paired (different vocabularies or tokenizers)."""


class VerifierFileError(VerispecError, ValueError):
    """A verifier (or verifier training data) file is missing, corrupt, incomplete, or made for another draft."""

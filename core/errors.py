"""Errors a user can act on. Each message says what was wrong, where, and what to do."""


class MidlensError(Exception):
    """Base class: anything midlens refuses on purpose."""


class ModelError(MidlensError):
    """A model could not be found, verified or loaded."""


class CorpusError(MidlensError):
    """A corpus file or folder cannot be read as documents."""


class RetrievalIndexError(MidlensError):
    """A saved retrieval index is missing, corrupt or built for something else."""


class PromptTooLongError(MidlensError):
    """The stacked prompt does not fit the model's context window."""

    def __init__(self, message: str, prompt_tokens: int, window: int, passages_that_fit: int, passages: int):
        super().__init__(message)
        self.prompt_tokens = prompt_tokens
        self.window = window
        self.passages_that_fit = passages_that_fit
        self.passages = passages


class MethodConfigError(MidlensError):
    """A generator method or one of its options is invalid."""


class DeviceError(MidlensError):
    """A device or dtype was asked for that this machine or model cannot give."""


class ArtefactError(MidlensError):
    """A trained artefact (weights + metadata) is missing, damaged or made for another model."""

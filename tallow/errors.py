"""Errors a user can cause and fix: each carries one sentence and an exit code."""


class TallowError(Exception):
    """A problem with user input (file, flag, request) — printed as one sentence, no traceback."""

    exit_code = 1


class ModelFileError(TallowError):
    """The GGUF file cannot be used: truncated, wrong magic, unknown architecture or tensor type."""

    exit_code = 2


class UsageError(TallowError):
    """A bad flag or argument."""

    exit_code = 2


class MemoryBudgetError(TallowError):
    """The model and its buffers do not fit in the memory the user allowed."""

    exit_code = 3


class SystemRefusalError(TallowError):
    """The machine refused what tallow needs to start: the port is taken or not allowed, or
    tallow's home folder cannot be written. Nothing is wrong with the flags or the model."""

    exit_code = 4

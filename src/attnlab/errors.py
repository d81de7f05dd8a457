"""The errors attnlab raises for bad input, under one base class.

:class:`InputError` means "what the user gave cannot be used": a config value, a data file, a
run dir, checkpoint or model folder, a command-line argument, an optional package not
installed. It is raised once, where the input enters, with a message that names what was wrong
and what is allowed. The CLI prints it in one line (exit code 2); any other exception is an
internal error and keeps its traceback. Every class here is also a ``ValueError``, so
``except ValueError`` in user code keeps working.
"""

from __future__ import annotations


class InputError(ValueError):
    """Bad input from the user; the message says what was wrong and what is allowed."""


class ConfigError(InputError):
    """A configuration value (a recipe key, a ``--set``, a model config field) not allowed."""


class DataError(InputError):
    """A data file, data set name or data option that is invalid."""


class MissingFileError(InputError, FileNotFoundError):
    """A file or folder the user named (a recipe, a model folder, a tokenizer file) does not
    exist; also a ``FileNotFoundError``."""


class MissingDependencyError(InputError, ImportError):
    """An optional package that a request needs is not installed; the message names the
    ``pip install`` that adds it. Also an ``ImportError``."""


class VocabularyError(DataError):
    """A text with characters or words outside a tokenizer's vocabulary."""


class DataFileNotFoundError(DataError, MissingFileError):
    """A data file or directory that was asked for does not exist."""


class DownloadError(DataError):
    """Downloading a data set failed (network error, bad archive or checksum mismatch)."""


class RunError(InputError):
    """A run dir, checkpoint or pretrained model folder that cannot be used."""


class UsageError(InputError):
    """A request that cannot be met: command-line arguments that do not fit together, an
    export to a format that cannot express the model."""


__all__ = ["ConfigError", "DataError", "DataFileNotFoundError", "DownloadError", "InputError",
           "MissingDependencyError", "MissingFileError", "RunError", "UsageError",
           "VocabularyError"]

"""The errors attnlab raises for bad input, under one base class.

:class:`InputError` means "what the user gave cannot be used": a config value, a data file, a
run dir or checkpoint, a command-line argument. It is raised once, where the input enters, with
a message that names what was wrong and what is allowed. The CLI prints it in one line (exit
code 2); any other exception is a bug and keeps its traceback. Every class here is also a
``ValueError``, so ``except ValueError`` in user code keeps working.
"""

from __future__ import annotations


class InputError(ValueError):
    """Bad input from the user; the message says what was wrong and what is allowed."""


class ConfigError(InputError):
    """A configuration value (a recipe key, a ``--set``, a model config field) not allowed."""


class DataError(InputError):
    """A data file, data set name or data option that is invalid."""


class DataFileNotFoundError(DataError, FileNotFoundError):
    """A data file or directory that was asked for does not exist."""


class DownloadError(DataError):
    """Downloading a data set failed (network error, bad archive or checksum mismatch)."""


class RunError(InputError):
    """A run dir or checkpoint that cannot be used."""


class UsageError(InputError):
    """A command-line request that cannot be met (arguments that do not fit together)."""


__all__ = ["ConfigError", "DataError", "DataFileNotFoundError", "DownloadError", "InputError",
           "RunError", "UsageError"]

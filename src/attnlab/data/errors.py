"""Exceptions raised for bad data inputs.

Every problem a user can cause with a data file, a data set name or a data option is reported
as one :class:`DataError` whose message names what was wrong and what is allowed. Catch
``DataError`` (a ``ValueError``) to handle all of them; missing files raise
:class:`DataFileNotFoundError`, which is also a ``FileNotFoundError``.
"""

from __future__ import annotations


class DataError(ValueError):
    """A data file, data set name or data option is invalid."""


class DataFileNotFoundError(DataError, FileNotFoundError):
    """A data file or directory that was asked for does not exist."""


class DownloadError(DataError):
    """Downloading a data set failed (network error, bad archive or checksum mismatch)."""

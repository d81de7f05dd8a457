"""The errors of bad data input (their home is :mod:`attnlab.errors`).

Every problem a user can cause with a data file, a data set name or a data option is reported
as one :class:`DataError` whose message names what was wrong and what is allowed; missing files
raise :class:`DataFileNotFoundError`, which is also a ``FileNotFoundError``.
"""

from ..errors import DataError, DataFileNotFoundError, DownloadError

__all__ = ["DataError", "DataFileNotFoundError", "DownloadError"]

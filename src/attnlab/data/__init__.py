"""Data: reading corpora, synthetic tasks, batching, and fetching the public data sets.

Bad data raises :class:`DataError`, a missing file :class:`DataFileNotFoundError` (also a
``FileNotFoundError``). The function :func:`~attnlab.data.fetch.fetch` is re-exported here,
so the attribute ``attnlab.data.fetch`` is that function: reach the module's other names
with ``from attnlab.data.fetch import ...``.
"""

from attnlab.data.batching import ClassificationBatches, Seq2SeqBatches, pad
from attnlab.data.errors import DataError, DataFileNotFoundError, DownloadError
from attnlab.data.fetch import DatasetInfo, RemoteFile, default_cache_dir, fetch
from attnlab.data.labelled import read_labelled_tsv, split_holdout, split_sentences, whole_sentences
from attnlab.data.parallel import read_lines, read_parallel
from attnlab.data.synthetic import SYNTHETIC_NAMES, SyntheticData
from attnlab.data.text import embedded_corpus, read_text

__all__ = [
    "SYNTHETIC_NAMES",
    "ClassificationBatches",
    "DataError",
    "DataFileNotFoundError",
    "DatasetInfo",
    "DownloadError",
    "RemoteFile",
    "Seq2SeqBatches",
    "SyntheticData",
    "default_cache_dir",
    "embedded_corpus",
    "fetch",
    "pad",
    "read_labelled_tsv",
    "read_lines",
    "read_parallel",
    "read_text",
    "split_holdout",
    "split_sentences",
    "whole_sentences",
]

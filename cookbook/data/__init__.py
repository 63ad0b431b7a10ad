"""Dataset plug-in: read and check a dataset, measure it with the model's tokenizer, write its config.

Public API: :class:`DatasetSpec`, :func:`read_rows`, :func:`validate_rows`, :class:`DataError`,
:class:`TokenizerSpec`, :func:`check_dataset`, :class:`DataReport`, :func:`dataset_block`,
:func:`dataset_overrides` (asked of the recipe); torchtitan layouts in :mod:`cookbook.data.titan`.
"""

from cookbook.data.check import DataReport, TokenizerSpec, VocabCheck, build_dataset, check_dataset, check_vocab
from cookbook.data.formats import STYLES, DataError, DatasetSpec, RowProblem, read_rows, validate_rows
from cookbook.data.recipe import dataset_block, dataset_overrides, dataset_yaml

__all__ = [
    "STYLES",
    "DataError",
    "DataReport",
    "DatasetSpec",
    "RowProblem",
    "TokenizerSpec",
    "VocabCheck",
    "build_dataset",
    "check_dataset",
    "check_vocab",
    "dataset_block",
    "dataset_overrides",
    "dataset_yaml",
    "read_rows",
    "validate_rows",
]

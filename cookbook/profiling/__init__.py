"""Profiling: enable the PyTorch profiler, collect traces, summarize and view them.

- :mod:`.enable`: the profiling schedule (the overrides are each recipe's ``profiling_overrides``).
- :mod:`.collect`: find every trace of a run and copy a subset into a view folder.
- :mod:`.trace`: read one Kineto trace JSON into tables.
- :mod:`.summarize`: step times, top operators, compute / communication / idle per rank; plots.
- :mod:`.memory`: memory timeline from CUDA memory snapshots.
- :mod:`.view`: TensorBoard on a free port, the ``ssh -N -L`` line, Perfetto pointer.
"""

"""ipywidgets for the notebooks: :class:`JobBuilder` (fill in, validate live, render, submit) and
:class:`JobMonitor` (state, progress and ETA, live loss/throughput plot, log tail, diagnosis, cancel).

Both are thin: validation is the recipe engine's, submission is :func:`cookbook.walkthrough.submit`,
metrics come from :mod:`cookbook.metrics`.
"""

from cookbook.widgets.builder import JobBuilder
from cookbook.widgets.monitor import JobMonitor

__all__ = ["JobBuilder", "JobMonitor"]

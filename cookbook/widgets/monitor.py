"""Job monitor widget: state, progress + ETA, live loss/throughput plot, log tail, diagnosis, cancel.

A background thread calls :meth:`JobMonitor.refresh` every ``interval`` seconds until the job ends
(ipywidgets state set from a thread reaches the browser through the kernel's iopub channel, so the
widget keeps updating while another cell runs, e.g. ``job.wait()``).
"""

from __future__ import annotations

import html
import io
import threading
import time
import warnings
from pathlib import Path

import ipywidgets as W
import pandas as pd

from cookbook.metrics import LogFollower, diagnose, eta
from cookbook.slurm.client import JobInfo, SlurmError
from cookbook.walkthrough import Job, merge_metrics, progress_line, tail_text

_STATE_COLORS = {"COMPLETED": "#2e7d32", "RUNNING": "#1565c0", "PENDING": "#8d6e63", "CONFIGURING": "#8d6e63"}


def figure_png(df: pd.DataFrame, title: str = "") -> bytes:
    """Loss and throughput against step as PNG bytes (for an ``ipywidgets.Image``)."""
    from cookbook.metrics import plot_runs

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "no artists with labels" on a 1-run legend
        fig = plot_runs({title or "run": df}, panels=["loss", "throughput"])
    fig.set_size_inches(10, 3.2)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    return buf.getvalue()


class JobMonitor:
    """Live view of one job (or, with ``job=None``, of a log file alone)."""

    def __init__(
        self, job: Job | None = None, log: str | Path | None = None, interval: float = 2.0, tail_lines: int = 15
    ):
        if job is None and log is None:
            raise ValueError("give a job or a log file")
        self.job, self.interval, self.tail_lines = job, interval, tail_lines
        files = job.metrics_files() if job is not None else [Path(log)]  # type: ignore[arg-type]
        self.log = files[0]
        self._followers = {p: LogFollower(p) for p in files}
        self.info: JobInfo | None = None
        self.df = pd.DataFrame()
        self._rows_plotted = -1
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        title = f"job {job.job_id}: {job.recipe} ({job.profile})" if job else f"log {self.log.name}"
        self.title = W.HTML(f"<b>{html.escape(title)}</b>")
        self.state = W.HTML("state: …", layout=W.Layout(min_width="220px"))
        self.progress = W.FloatProgress(
            value=0.0, min=0.0, max=1.0, description="progress", layout=W.Layout(width="320px")
        )
        self.progress_text = W.Label("no training step logged yet")
        self.plot = W.Image(format="png", layout=W.Layout(max_width="900px"))
        self.tail = W.Textarea(value="", disabled=True, layout=W.Layout(width="100%", height="180px"))
        self.diagnosis = W.HTML("")
        self.nodes = W.HTML("")  # a line per node: its GPUs' clocks, temperature, any throttle or error
        self._nodes_read, self._nodes_final = float("-inf"), False
        self.cancel_button = W.Button(
            description="Cancel job", button_style="danger", icon="stop", disabled=job is None
        )
        self.cancel_button.on_click(lambda _b: self.cancel())
        self.widget = W.VBox(
            [
                self.title,
                W.HBox([self.state, self.cancel_button]),
                W.HBox([self.progress, self.progress_text]),
                self.plot,
                self.nodes,
                self.diagnosis,
                W.HTML("<i>log tail</i>"),
                self.tail,
            ],
            layout=W.Layout(border="1px solid #ccc", padding="6px"),
        )
        self.widget.add_class("cookbook-job-monitor")
        self.state.add_class("cookbook-monitor-state")
        self.plot.add_class("cookbook-monitor-plot")

    # ------------------------------------------------------------------ one update
    def refresh(self) -> JobInfo | None:
        """Poll Slurm and the logs once and update every widget; returns the job's state."""
        with self._lock:
            if self.job is not None:
                try:
                    self.info = self.job.info()
                except SlurmError as e:
                    self.state.value = f"state: <span style='color:#c62828'>{html.escape(str(e))}</span>"
            for f in self._followers.values():
                f.poll()
            self.df = merge_metrics([f.df for f in self._followers.values()])
            self._show_state()
            self._show_progress()
            if len(self.df) and len(self.df) != self._rows_plotted and "loss" in self.df:
                self.plot.value = figure_png(self.df, self.job.name if self.job else self.log.stem)
                self._rows_plotted = len(self.df)
            self.tail.value = tail_text(self.log, self.tail_lines)
            self._show_diagnosis()
            self._show_nodes()
            return self.info

    def _show_nodes(self) -> None:
        """Each node's line from the run's telemetry (read at most every 30 s; once more when the job is done)."""
        done = self.info is not None and self.info.done
        if self._nodes_final or (not done and time.monotonic() - self._nodes_read < 30):
            return
        self._nodes_read, self._nodes_final = time.monotonic(), done
        from cookbook.metrics.telemetry import NOTHING_FOUND, node_lines, telemetry_from_log

        rows = []
        for line in node_lines(telemetry_from_log(self.log)):
            bad = " GPUs, " in line and not line.endswith(NOTHING_FOUND)
            rows.append(f"<div class='cookbook-monitor-node' style='color:{'#c62828' if bad else '#333'}'>"
                        f"{html.escape(line)}</div>")  # fmt: skip
        self.nodes.value = "".join(rows)

    def _show_state(self) -> None:
        if self.info is None:
            self.state.value = "state: (log only)" if self.job is None else "state: …"
            return
        color = _STATE_COLORS.get(self.info.state, "#c62828")
        extra = f" on {self.info.nodes}" if self.info.nodes and self.info.state == "RUNNING" else ""
        self.state.value = (
            f"state: <b style='color:{color}' data-state='{self.info.state}'>{self.info.state}</b>{html.escape(extra)}"
        )
        self.cancel_button.disabled = self.info.done

    def _show_progress(self) -> None:
        df = self.df
        if df.empty or "step" not in df:
            return
        train = df[df["split"].eq("train")] if "split" in df else df
        if train.empty:
            return
        total = (
            train["total_steps"].dropna().iloc[-1]
            if "total_steps" in train and train["total_steps"].notna().any()
            else None
        )
        if total:
            self.progress.value = min(float(train["step"].iloc[-1]) / float(total), 1.0)
        if self.info is not None and self.info.state == "COMPLETED":
            self.progress.value = 1.0
        self.progress_text.value = progress_line(df, None if self.info and self.info.done else eta(df))

    def _show_diagnosis(self) -> None:
        found = diagnose(self.log) if self.log.exists() else []
        if not found:
            self.diagnosis.value = ""
            return
        items = "".join(
            f"<li><b>{html.escape(f.kind)}</b> (line {f.line_number}): {html.escape(f.hint)}</li>" for f in found
        )
        self.diagnosis.value = f"<div style='color:#c62828'>diagnosis:<ul>{items}</ul></div>"

    # ------------------------------------------------------------------ background refresh
    def start(self) -> JobMonitor:
        """Refresh in a background thread until the job ends (or :meth:`stop`)."""
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="cookbook-job-monitor", daemon=True)
            self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                info = self.refresh()
            except Exception as e:  # noqa: BLE001 - show it; a monitor must not die silently
                self.diagnosis.value = f"<span style='color:#c62828'>monitor error: {html.escape(repr(e))}</span>"
                info = None
            if self.job is None or (info is not None and info.done):
                break
            self._stop.wait(self.interval)

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout: float | None = None) -> JobInfo | None:
        """Wait for the background refresh to finish (the job ended); returns the last state."""
        if self._thread is not None:
            self._thread.join(timeout)
        return self.info

    def cancel(self) -> None:
        if self.job is not None:
            self.job.cancel()
            self.cancel_button.disabled = True

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)
        self.start()

    def __repr__(self) -> str:
        return f"JobMonitor({self.job or self.log})"

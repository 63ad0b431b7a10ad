"""Job builder widget: recipe, nodes, spare nodes, GPUs per node, GPU kind, partition, time, container, profile,
overrides.

Every change re-validates the job with the recipe engine (:func:`cookbook.render.validate`) and shows
the problems, each saying what to change, and the planner's warning when the job will not fit in the
memory of the chosen GPU kind (:func:`cookbook.planner.job_fit_warning`). *Render* shows the sbatch script;
*Submit* checks the job against the cluster (:func:`cookbook.walkthrough.check_job`), submits it and shows a
:class:`~cookbook.widgets.monitor.JobMonitor` below.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ipywidgets as W

from cookbook.planner import GPUS, job_fit_warning
from cookbook.recipes import list_recipes
from cookbook.render import render_job, validate
from cookbook.spec import MAX_NODES, JobSpec, SpecError, parse_overrides, profile_defaults, profiles
from cookbook.walkthrough import Job, NotebookStop, check_job, job_spec, submit
from cookbook.widgets.monitor import JobMonitor


class JobBuilder:
    """Fill in a job, see its problems live, render and submit it."""

    def __init__(
        self,
        recipe: str = "llama3_3_70b_lora",
        profile: str = "generic",
        nodes: int = 2,
        spare_nodes: int = 0,
        gpus_per_node: int | None = None,
        gpu: str = "h100",
        partition: str = "",
        time: str = "",
        container_image: str = "",
        overrides: dict[str, Any] | None = None,
        run_root: str | Path = "runs",
        on_submit: Callable[[Job], None] | None = None,
    ):
        """Build the form, its buttons and callbacks, and validate the job it starts with."""
        defaults = profile_defaults(profile)
        style = {"description_width": "120px"}
        lay = W.Layout(width="420px")
        self.run_root, self.on_submit = Path(run_root), on_submit
        self.job: Job | None = None
        self.monitor: JobMonitor | None = None
        gpus = gpus_per_node if gpus_per_node is not None else defaults["gpus_per_node"]
        self._job_fields(recipe, profile, nodes, spare_nodes, gpus, gpu, style, lay)
        self._run_fields(partition, time or defaults["time"], container_image, overrides, style, lay)
        self._actions()
        fields = [self.recipe, self.profile, self.nodes, self.spare_nodes, self.gpus, self.gpu, self.partition]
        fields += [self.time, self.container, self.overrides]
        self._connect(fields)
        self.widget = W.VBox(
            [
                W.VBox(fields),
                self.status,
                W.HBox([self.render_button, self.submit_button]),
                self.script,
                self.monitor_box,
            ]
        )
        self.widget.add_class("cookbook-job-builder")
        self.status.add_class("cookbook-builder-status")
        self.validate()

    def _job_fields(
        self,
        recipe: str,
        profile: str,
        nodes: int,
        spare_nodes: int,
        gpus: int,
        gpu: str,
        style: dict[str, str],
        lay: W.Layout,
    ) -> None:
        """The job's shape: recipe, profile, nodes, spare nodes, GPUs per node and their kind."""
        self.recipe = W.Dropdown(
            options=[r.name for r in list_recipes()], value=recipe, description="recipe", style=style, layout=lay
        )
        self.profile = W.Dropdown(
            options=list(profiles()), value=profile, description="profile", style=style, layout=lay
        )
        # bounded by the spec's own limit; a value the rules refuse below it is said by validate()
        self.nodes = W.BoundedIntText(value=nodes, min=0, max=MAX_NODES, description="nodes", style=style, layout=lay)
        # nodes that stand by beside the training ones: a node at fault is swapped for one inside the job
        self.spare_nodes = W.BoundedIntText(
            value=spare_nodes, min=0, max=MAX_NODES, description="spare nodes", style=style, layout=lay
        )
        self.gpus = W.BoundedIntText(value=gpus, min=0, max=64, description="GPUs per node", style=style, layout=lay)
        self.gpu = W.Dropdown(options=sorted(GPUS), value=gpu, description="GPU kind", style=style, layout=lay)

    def _run_fields(
        self,
        partition: str,
        time: str,
        container_image: str,
        overrides: dict[str, Any] | None,
        style: dict[str, str],
        lay: W.Layout,
    ) -> None:
        """Where and how it runs: partition, time limit, container image, the recipe's overrides."""
        self.partition = W.Text(
            value=partition, placeholder="cluster default", description="partition", style=style, layout=lay
        )
        self.time = W.Text(value=time, description="time limit", style=style, layout=lay)
        self.container = W.Text(
            value=container_image,
            placeholder="none (pyxis/enroot image)",
            description="container",
            style=style,
            layout=lay,
        )
        self.overrides = W.Textarea(
            value="\n".join(f"{k}={v}" for k, v in (overrides or {}).items()),
            placeholder="key=value, one per line",
            description="overrides",
            style=style,
            layout=W.Layout(width="420px", height="80px"),
        )

    def _actions(self) -> None:
        """The status line, the Render and Submit buttons, the script shown and the monitor's box."""
        self.status = W.HTML("")
        self.render_button = W.Button(description="Render", icon="file-code-o")
        self.submit_button = W.Button(description="Submit", button_style="primary", icon="paper-plane")
        self.script = W.Textarea(value="", disabled=True, layout=W.Layout(width="100%", height="260px", display="none"))
        self.monitor_box = W.VBox([])

    def _connect(self, fields: list[W.Widget]) -> None:
        """The buttons' clicks, a new profile's defaults, and a validation on every change of a field."""
        self.render_button.on_click(lambda _b: self.render())
        self.submit_button.on_click(lambda _b: self.submit())
        self.profile.observe(self._profile_changed, names="value")
        for w in fields:
            w.observe(lambda _c: self.validate(), names="value")

    # ------------------------------------------------------------------ spec
    def spec(self) -> JobSpec:
        """The job the form describes; :class:`SpecError` when the overrides are not ``key=value``."""
        lines = [ln.strip() for ln in self.overrides.value.splitlines() if ln.strip() and not ln.startswith("#")]
        return job_spec(
            self.recipe.value,
            profile=self.profile.value,
            nodes=self.nodes.value,
            spare_nodes=self.spare_nodes.value,
            gpus_per_node=self.gpus.value,
            partition=self.partition.value.strip() or None,
            time=self.time.value.strip() or None,
            container_image=self.container.value.strip() or None,
            overrides=parse_overrides(lines),
        )

    def problems(self) -> list[str]:
        """Every problem the recipe engine finds with the form's job ([] when it can be submitted)."""
        try:
            validate(self.spec())
        except SpecError as e:
            return e.problems
        return []

    def fit_warning(self) -> str | None:
        """The planner's warning when the job will not fit on the chosen GPU kind (None: it fits)."""
        try:
            return job_fit_warning(self.spec(), self.gpu.value)
        except SpecError:
            return None

    def validate(self) -> list[str]:
        """Re-check the job and show the result; Submit is enabled only for a valid job."""
        problems = self.problems()
        if problems:
            items = "".join(f"<li>{html.escape(p)}</li>" for p in problems)
            status = (
                f"<div style='color:#c62828' data-valid='no'><b>{len(problems)} problem(s):</b><ul>{items}</ul></div>"
            )
        else:
            status = "<div style='color:#2e7d32' data-valid='yes'><b>valid</b>: ready to render and submit</div>"
            if warning := self.fit_warning():
                status += f"<div style='color:#e65100' data-fit='no'><b>warning</b>: {html.escape(warning)}</div>"
        self.status.value = status
        self.submit_button.disabled = bool(problems)
        return problems

    def _profile_changed(self, change: dict) -> None:
        new, old = profile_defaults(change["new"]), profile_defaults(change["old"])
        if new != old:
            self.gpus.value = new["gpus_per_node"]
            self.time.value = new["time"]

    # ------------------------------------------------------------------ actions
    def render(self) -> str | None:
        """Show the sbatch script the job renders to (or its problems)."""
        try:
            text = render_job(self.spec()).script
        except SpecError:
            self.validate()
            return None
        self.script.value = text
        self.script.layout.display = None
        return text

    def submit(self) -> Job | None:
        """Check the job against the cluster, submit it and show its monitor."""
        try:
            spec = self.spec()
            report = check_job(spec, gpu=self.gpu.value)
            job = submit(spec, self.run_root)
        except (NotebookStop, SpecError) as e:
            self.status.value = f"<div style='color:#c62828' data-valid='no'><pre>{html.escape(str(e))}</pre></div>"
            return None
        self.job = job
        self.status.value = (
            f"<div style='color:#2e7d32'>submitted job <b data-job-id='{job.job_id}'>{job.job_id}</b>"
            f" ({html.escape(str(report).splitlines()[-1])}); script {html.escape(str(job.script))}</div>"
        )
        self.monitor = JobMonitor(job)
        self.monitor_box.children = [self.monitor.widget]
        self.monitor.start()
        if self.on_submit:
            self.on_submit(job)
        return job

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)

    def __repr__(self) -> str:
        return f"JobBuilder(recipe={self.recipe.value!r}, profile={self.profile.value!r})"

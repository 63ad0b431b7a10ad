"""With the real defaults (GPU profile, 2 x 8 GPUs, real model paths) on a machine without GPU nodes,
every notebook stops at its check step with one clear message, not a traceback."""

from __future__ import annotations

import nbformat
import pytest

from cookbook.notebook_runner import NotebookStopped, error_output, notebooks, run_notebook

pytestmark = [pytest.mark.cluster]


@pytest.mark.parametrize("name", notebooks())
def test_real_defaults_stop_at_check(name, slurm, kernel_dirs, artifacts, tmp_path):
    with pytest.raises(NotebookStopped) as info:
        run_notebook(name, artifacts, {}, cwd=tmp_path, name=f"{name}.defaults")
    stop = info.value
    assert stop.ename == "NotebookStop", f"stopped with {stop.ename}: {stop.evalue}"
    nb = nbformat.read(str(stop.path), as_version=4)
    # the cell whose output is the error (papermill's cell index counts differently)
    cell = next(c for c in nb.cells if any(o.get("output_type") == "error" for o in c.get("outputs", [])))
    assert any(word in cell.source for word in ("check", "sweep")), f"stopped outside a check step: {cell.source}"
    err = error_output(stop.path)
    text = "\n".join(err["traceback"])
    assert err["traceback"][0].startswith("STOP: ")
    assert "Traceback" not in text and 'File "' not in text, text
    assert not list(tmp_path.rglob("job.json")), "nothing may be submitted"
    assert "local-cpu" in text, "the message says how to run it here"

"""What every notebook test checks: the notebook executed top to bottom by papermill against the real
local cluster (tiny models), its jobs COMPLETED with metrics, the plot shown, and a known HF_TOKEN in no
output, script, config or log. Used by test_notebooks_*.py (split in two files so that pytest-xdist's
``--dist loadfile`` runs the notebooks on both workers at once)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import nbformat
import pytest

from cookbook.notebook_runner import NotebookStopped, jobs_in, local_parameters, notebooks, run_notebook


def notebooks_for(prefixes: tuple[str, ...]) -> list[str]:
    """The walkthrough notebooks whose names start with one of ``prefixes``."""
    return [n for n in notebooks() if n.startswith(prefixes)]


def files_containing(root, needle: str) -> list:
    """Every file under ``root`` whose bytes contain ``needle``."""
    data = needle.encode()
    return [p for p in root.rglob("*") if p.is_file() and data in p.read_bytes()]


def _images(executed) -> int:
    nb = nbformat.read(str(executed), as_version=4)
    return sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.outputs)


def output_text(executed) -> str:
    """Everything the executed notebook's code cells printed or displayed as text (streams, text/plain)."""
    nb = nbformat.read(str(executed), as_version=4)
    parts = []
    for c in nb.cells:
        if c.cell_type != "code":
            continue
        for o in c.outputs:
            parts.append(
                o.get("text", "") if o.get("output_type") == "stream" else o.get("data", {}).get("text/plain", "")
            )
    return "\n".join(p if isinstance(p, str) else "".join(p) for p in parts)


PYTHON_WARNING = re.compile(r"^\S+:\d+: \w*Warning: ", re.M)  # how Python's warnings module prints one


def check_quiet(executed) -> None:
    """No traceback in any output (an error output, or one printed), and on the kernel's stderr no known
    third-party noise (``cookbook.noise``'s messages) and no Python warning line."""
    from cookbook.noise import LOG_NOISE, WARNING_NOISE

    nb = nbformat.read(str(executed), as_version=4)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    errors = [f"{o.get('ename')}: {o.get('evalue')}" for o in outputs if o.get("output_type") == "error"]
    assert not errors, f"{executed}: {errors}"
    text = output_text(executed)
    assert "Traceback (most recent call last)" not in text, f"{executed}: a traceback is printed:\n{text[-3000:]}"
    stderr = "".join(
        "".join(o.get("text", "")) for o in outputs if o.get("output_type") == "stream" and o.get("name") == "stderr"
    )
    noise = [m for starts in LOG_NOISE.values() for m in starts if m in stderr]
    noise += [m for m, _ in WARNING_NOISE if re.search(m, stderr)] + PYTHON_WARNING.findall(stderr)
    assert not noise, f"{executed}: third-party noise on stderr: {noise}\n{stderr[-3000:]}"


# cookbook.analysis: Ledger.render()'s first line (goodput_summary prints it) and Explanation.render()'s first
LEDGER_LINE = re.compile(
    r"\d+ start\(s\), \d+ s allocated, [\d.]+ (GPU|node)-hours, cost [\d,.]+ "
    r"\(at [\d.]+ per (GPU|node)-hour\); goodput (\d+\.\d)%"
)
MFU_LINE = re.compile(r"MFU measured (unknown|\d+\.\d%), planner expects (unknown|\d+\.\d%)")


def check_ledger_and_explanation(executed) -> None:
    """Notebook 06's last two sections: the goodput ledger (summary line + table) and the MFU explanation."""
    text = output_text(executed)
    ledger = LEDGER_LINE.search(text)
    assert ledger, f"no goodput ledger line in the executed notebook:\n{text[-3000:]}"
    assert 0 < float(ledger.group(3)) <= 100, ledger.group(0)  # a timed torchtitan run has productive steps
    # the tables' text/plain: pandas may elide middle columns ("..."), never the first
    assert re.search(r"^\s+part\s", text, re.M), "the ledger table is not shown"
    for part in ("queue", "productive"):
        assert re.search(rf"^\s*\d+\s+{part}\s", text, re.M), f"the ledger table has no {part} row"
    assert MFU_LINE.search(text), f"no MFU line of the explanation:\n{text[-3000:]}"
    assert re.search(r"^\s+cause\s|Columns: \[cause,", text, re.M), "the evidence table is not shown"


def run_and_check(name: str, tiny_assets, artifacts: Path, tmp_path: Path, known_hf_token: str) -> None:
    """Run notebook ``name`` with the local parameters in ``tmp_path`` and check what it produced."""
    t0 = time.monotonic()
    try:
        executed = run_notebook(
            name, artifacts, local_parameters(name, tiny_assets), cwd=tmp_path, name=f"{name}.local"
        )
    except NotebookStopped as e:
        pytest.fail(f"{e} (see {e.path})")
    print(f"{name}: {time.monotonic() - t0:.0f} s")
    check_quiet(executed)
    # the token was in the kernel's and the jobs' environment: it is in no output, script, config or log
    assert known_hf_token not in Path(executed).read_text()
    assert files_containing(tmp_path, known_hf_token) == []
    jobs = jobs_in(tmp_path)
    if name.startswith("00_"):
        assert (tiny_assets.root / "VERSION").exists()
        return
    if name.startswith("08_"):  # the builder submits on a click: tests/browser does that
        nb = nbformat.read(str(executed), as_version=4)
        shown = [
            o
            for c in nb.cells
            if c.cell_type == "code"
            for o in c.outputs
            if "application/vnd.jupyter.widget-view+json" in o.get("data", {})
        ]
        assert shown and not jobs
        return
    assert jobs, "the notebook submitted no job"
    if name.startswith(("02_", "03_", "04_", "05_", "06_")):  # the check step rehearses the job on every node
        text = Path(executed).read_text()
        assert "PASSED: every node can run this job" in text and "head, reached by 1" in text
    for job in jobs:
        assert job.state == "COMPLETED"
        if not job.recipe.endswith("_use"):  # a "use the model" job trains nothing
            df = job.metrics()
            assert len(df) >= 2 and df["loss"].notna().all()
    assert _images(executed) >= 1, "the metrics plot is not in the executed notebook"
    if name.startswith("06_"):
        check_ledger_and_explanation(executed)
    if name.startswith(("02_", "03_")):
        check_preemption(executed)
    check_use_section(name, executed, jobs)


def check_preemption(executed) -> None:
    """02/03 locally (``try_preemption``): USR1 after step 2, every rank saved at one step boundary, the job
    requeued and resumed at that step; the preemption report shows both starts and no step redone."""
    text = output_text(executed)
    assert "USR1 after step 2; the ranks saved" in text, f"the run was not preempted:\n{text[-3000:]}"
    first = re.search(r"start 1: started afresh, trained steps 1-(\d+); USR1: saved at step (\d+)", text)
    assert first and first[1] == first[2] and int(first[2]) >= 2, f"no stop-save at a step boundary:\n{text[-3000:]}"
    assert re.search(rf"start 2: resumed from \S+, trained steps {int(first[2]) + 1}-\d+", text), text[-3000:]
    assert "steps redone after a resume: 0" in text, text[-3000:]


def _shown_part(generated: str) -> str:
    """The start of a generation as a pandas table shows it: up to its first tab or line end (pandas writes those
    escaped), at most 20 characters (a long cell is cut after 47)."""
    return re.split(r"[\t\r\n]", generated.strip())[0][:20].strip()


def check_use_section(name: str, executed, jobs: list) -> None:
    """The "Use the model" section: 02/03 print base vs fine-tuned generations (they differ; the generated text
    itself is in the output) and show the held-out loss table and plot, 03's merged folder loads with
    transformers; 04 shows the FLUX grid; every one prints where the weights are (`cookbook outputs`)."""
    from cookbook.use.report import UseResult, sampled_images

    text = output_text(executed)
    if not name.startswith(("02_", "03_", "04_", "06_")):
        return
    assert "use it:" in text and "weights: " in text, "the outputs of the run are not shown"
    if name.startswith("06_"):
        assert "dcp_to_torch_save" in text
        return
    use = [j for j in jobs if j.recipe.endswith("_use")]
    assert len(use) == 1 and use[0].state == "COMPLETED", [j.recipe for j in jobs]
    if name.startswith("04_"):
        images = sampled_images(use[0].run_dir)
        assert len(images) == 8 and (use[0].run_dir / "images" / "grid.png").is_file()
        assert _images(executed) >= 2, "the sample grid is not shown"
        return
    result = UseResult.load(use[0].run_dir)
    gens = result.generations()
    assert len(gens) >= 2 and (gens["base"] != gens["fine-tuned"]).any(), gens
    assert re.search(r"fine-tuned\s+[\d.]+\s+[\d.]+", text), "the held-out table (before/after) is not shown"
    shown = all(p[:30] in text for p in gens["prompt"]) and "reference" in text and "fine-tuned" in text
    assert shown, "the generations (prompt, reference, base, fine-tuned) are not shown"
    said = [_shown_part(g) for g in [*gens["base"], *gens["fine-tuned"]]]
    assert any(said), f"neither model generated any text: {gens.to_dict('records')}"
    missing = [g for g in said if g and g not in text]
    assert not missing, f"generated text not in the notebook's output (only the table's frame?): {missing}"
    assert _images(executed) >= 2, "the held-out plot (before vs after) is not shown beside the metrics plot"
    assert "/llama3 (LoRA rank" in text or not name.startswith("03_"), "the base model is not named"
    h = result.data["heldout"]
    assert h["tuned_loss"] < h["base_loss"], h
    # the local run trains on train[:90%] (local_parameters): the scored rows were never trained on
    assert h["split"] == "train[90%:]" and not h["trained_on"], h
    if name.startswith("03_"):
        assert result.merged and "transformers loads it as LlamaForCausalLM" in text

"""A real browser: JupyterLab started here, Debian's chromium driven by playwright.

Opens the job-builder notebook (parameterized for the local cluster), runs all cells, checks the
builder's live validation, submits a real job to the local cluster with the builder and waits for the
monitor to show COMPLETED with the loss plotted.
"""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

import nbformat
import pytest

from cookbook.lab import start_lab
from cookbook.notebook_runner import local_parameters, notebook_dir
from cookbook.paths import output_dir

pytestmark = [pytest.mark.browser, pytest.mark.cluster, pytest.mark.slow]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
NOTEBOOK = "08_job_builder.ipynb"


@pytest.fixture(scope="module")
def lab(tmp_path_factory, slurm, tiny_assets):
    """JupyterLab serving a folder with the builder notebook, parameters injected for local-cpu."""
    from papermill.iorw import load_notebook_node
    from papermill.parameterize import parameterize_notebook

    if not Path(CHROMIUM).exists():
        pytest.fail("Debian's chromium is not installed: `make test` installs it (make deps-debian, as root)")
    root = tmp_path_factory.mktemp("labroot")
    nb = load_notebook_node(str(notebook_dir() / NOTEBOOK))
    params = {**local_parameters(NOTEBOOK), "run_root": str(root / "runs")}
    nbformat.write(parameterize_notebook(nb, params), str(root / NOTEBOOK))
    ipython = tmp_path_factory.mktemp("ipython")  # its own IPython history (start_lab: its own runtime)
    server = start_lab(root, env={"IPYTHONDIR": str(ipython)}, log=root / "lab.log")
    yield server
    server.stop()


@pytest.fixture
def page(lab):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
                "--disable-quic",
            ],
        )
        pg = browser.new_page(viewport={"width": 1400, "height": 1000})
        yield pg
        shots = output_dir() / "test-browser"
        shots.mkdir(parents=True, exist_ok=True)
        pg.screenshot(path=str(shots / "job_builder.png"), full_page=True)
        browser.close()


def watch_kernel_frames(page) -> list[str]:
    """Message types received on the kernel's websocket (the only reliable readiness signal)."""
    seen: list[str] = []

    def on_ws(ws):
        if "/api/kernels/" in ws.url and "/channels" in ws.url:

            def on_frame(payload):
                text = payload if isinstance(payload, str) else payload.decode("utf-8", "replace")
                seen.extend(re.findall(r'"msg_type": ?"([a-z_]+)"', text)[:1])

            ws.on("framereceived", on_frame)

    page.on("websocket", on_ws)
    return seen


def wait_kernel_ready(page, seen: list[str], timeout: float = 90) -> None:
    """The idle indicator comes before the websocket is usable; wait for kernel_info_reply and the
    widget manager's first answer (comm_info_reply on a fresh kernel)."""
    deadline = time.time() + timeout
    while not ("kernel_info_reply" in seen and {"comm_info_reply", "comm_msg"} & set(seen)):
        if time.time() > deadline:
            raise AssertionError(f"kernel not ready; frames seen: {seen[:20]}")
        page.wait_for_timeout(100)


def field(page, label: str):
    return page.locator(f".cookbook-job-builder .widget-inline-hbox:has(label:text-is('{label}')) input")


def test_builder_submits_and_monitor_completes(page, lab):
    from playwright.sync_api import expect

    seen = watch_kernel_frames(page)
    page.goto(lab.lab_url(NOTEBOOK).replace("localhost", "127.0.0.1") + "&reset")
    wait_kernel_ready(page, seen)
    page.click(".lm-MenuBar-item:has(.lm-MenuBar-itemLabel:text-is('Run'))")
    page.click(".lm-Menu-item[data-command='runmenu:run-all']")
    expect(page.locator(".jp-CodeCell .jp-InputPrompt").last).to_have_text(re.compile(r"\[\d+\]:"), timeout=120_000)
    status = page.locator(".cookbook-builder-status")
    expect(status).to_contain_text("valid", timeout=60_000)
    expect(status.locator("[data-valid='yes']")).to_have_count(1)

    # live validation: GPUs on the CPU profile is refused with what to change, and fixed again
    gpus = field(page, "GPUs per node")
    gpus.fill("8")
    gpus.press("Enter")
    expect(status).to_contain_text("set gpus_per_node=0", timeout=30_000)
    expect(page.locator(".cookbook-job-builder button:has-text('Submit')")).to_be_disabled()
    gpus.fill("0")
    gpus.press("Enter")
    expect(status.locator("[data-valid='yes']")).to_have_count(1, timeout=30_000)

    # submit a real job to the local cluster and watch it to the end
    page.locator(".cookbook-job-builder button:has-text('Submit')").click()
    expect(status).to_contain_text("submitted job", timeout=60_000)
    state = page.locator(".cookbook-monitor-state")
    expect(state).to_contain_text("COMPLETED", timeout=300_000)
    plot = page.locator("img.cookbook-monitor-plot")
    expect(plot).to_be_visible(timeout=30_000)
    width = plot.evaluate("img => img.naturalWidth")
    assert width > 100, "the monitor shows no plotted metric"
    monitor = page.locator(".cookbook-job-monitor")
    expect(monitor).to_contain_text(re.compile(r"step \d+/\d+\s+loss \d"))
    expect(monitor.locator("textarea")).to_have_value(re.compile(r"\S"))  # the log tail

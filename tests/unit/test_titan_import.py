"""torchtitan's config is checked on a login node whose torch has no triton (CPU or aarch64 wheels) with nothing
to set: the engine's parser child imports torchtitan through :mod:`cookbook_runtime.titan_import` (issue #30,
item 11). Where triton is installed, nothing is patched."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from cookbook_runtime import titan_import

ROOT = Path(__file__).resolve().parents[2]

# both renders in one process: one torchtitan import in one parser child
RENDER_BOTH = """
import sys
from cookbook.cli import main
out = sys.argv[1]
for recipe in ("llama3_8b_c4", "flux_schnell"):
    code = main(["render", recipe, "--nodes", "2", "--gpus-per-node", "8", "-o", f"{out}/{recipe}/job.sbatch"])
    print("exit", recipe, code)
"""


def test_render_torchtitan_recipes_without_triton_and_without_any_variable(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "COOKBOOK_PRELOAD"}  # an old set-up's variable: not needed
    r = subprocess.run(
        [sys.executable, "-c", RENDER_BOTH, str(tmp_path)],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    exits = [ln for ln in r.stdout.splitlines() if ln.startswith("exit ")]
    assert exits == ["exit llama3_8b_c4 0", "exit flux_schnell 0"], r.stdout + r.stderr
    for recipe in ("llama3_8b_c4", "flux_schnell"):
        script = (tmp_path / recipe / "job.sbatch").read_text()
        assert "--module cookbook_runtime.programs.cookbook_titan" in script and f"--config {recipe}" in script
        assert (tmp_path / recipe / "cookbook_runtime" / "programs" / "cookbook_titan.py").is_file()


def test_nothing_is_patched_where_triton_is_installed(tmp_path, monkeypatch):
    (tmp_path / "triton").mkdir()
    (tmp_path / "triton" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    before = set(sys.modules)
    assert titan_import.triton_available()
    assert titan_import.import_torchtitan_without_triton() is False
    assert not {m for m in set(sys.modules) - before if m.startswith(("torch", "triton"))}

"""torchtune components are described from a disk cache: a render on the login node imports torchtune (and
with it torchao and torch._dynamo, ~7 s of CPU) only the first time a component is met."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cookbook.recipes import torchtune as tt

COMPONENTS = ["torchtune.datasets.alpaca_dataset", "torchtune.models.llama3_3.lora_llama3_3_70b"]


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("COOKBOOK_CACHE", str(tmp_path))
    tt._component_signature.cache_clear()
    yield tmp_path
    tt._component_signature.cache_clear()


def test_the_cached_answer_is_the_live_one_and_lands_in_one_file_per_versions(empty_cache):
    first = {t: tt._component_signature(t) for t in COMPONENTS}
    (cache,) = (empty_cache / "tune-components").glob("*.json")
    assert json.loads(cache.read_text()) == first
    tt._component_signature.cache_clear()
    assert (
        {t: tt._component_signature(t) for t in COMPONENTS} == first == {t: tt._load_signature(t) for t in COMPONENTS}
    )
    assert tt._component_default(COMPONENTS[0], "source") == "tatsu-lab/alpaca"
    assert "lora_rank" in (tt._component_params(COMPONENTS[1]) or set())


def test_a_component_that_does_not_load_is_remembered_as_such_and_others_are_not_cached(empty_cache):
    assert tt._component_signature("torchtune.no_such_module.fn") is None
    assert tt._component_params("torchtune.no_such_module.fn") is None
    assert tt._component_signature("json.dumps") is not None  # a user's own component: asked every time
    (cache,) = (empty_cache / "tune-components").glob("*.json")
    assert json.loads(cache.read_text()) == {"torchtune.no_such_module.fn": None}


def test_a_warm_render_does_not_import_torchtune(empty_cache, tmp_path):
    render = (
        "import sys\nfrom cookbook.cli import main\n"
        "try:\n    main(['render', 'llama3_3_70b_lora', '--profile', 'generic', '--nodes', '2', '-o', sys.argv[1]])\n"
        "except SystemExit as e:\n    assert not e.code, e.code\n"
        "print('torchtune imported' if 'torchtune' in sys.modules else 'torchtune not imported')\n"
    )
    env_run = {"capture_output": True, "text": True, "check": True}
    cold = subprocess.run([sys.executable, "-c", render, str(tmp_path / "cold.sh")], **env_run)  # type: ignore[call-overload]
    warm = subprocess.run([sys.executable, "-c", render, str(tmp_path / "warm.sh")], **env_run)  # type: ignore[call-overload]
    assert cold.stdout.strip().endswith("torchtune imported"), cold.stdout
    assert warm.stdout.strip().endswith("torchtune not imported"), warm.stdout
    cold_script, warm_script = (tmp_path / "cold.sh").read_text(), (tmp_path / "warm.sh").read_text()
    assert cold_script.replace("/cold.yaml", "/warm.yaml") == warm_script
    assert (tmp_path / "cold.yaml").read_text().replace("cold.sh", "warm.sh") == (tmp_path / "warm.yaml").read_text()

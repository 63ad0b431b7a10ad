"""torchtitan's config parser answers from a disk cache: a repeated request costs no child (~6 s of imports), and
an edit to a config module misses the cache."""

from __future__ import annotations

import json

from cookbook.recipes import torchtitan as titan


def test_a_cached_answer_starts_no_child(tmp_path, monkeypatch):
    monkeypatch.setenv("COOKBOOK_CACHE", str(tmp_path))
    request = {"args": ["--module", "cookbook_titan", "--config", "nope"], "modules": []}
    path = titan._answer_cache(request)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"config": None, "fields": ["a.b"], "error": ""}))
    parser = titan._ParserProcess()
    assert parser.request(request)["fields"] == ["a.b"]
    assert parser._proc is None  # no child was started


def test_an_edited_config_module_misses_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("COOKBOOK_CACHE", str(tmp_path / "cache"))
    module = tmp_path / "my_titan.py"
    module.write_text("def cfg():\n    return 1\n")
    request = {"args": ["--module", "my_titan", "--config", "cfg"], "modules": [str(module)]}
    before = titan._answer_cache(request)
    assert titan._answer_cache(request) == before  # the same files: the same entry
    module.write_text("def cfg():\n    return 2\n")
    assert titan._answer_cache(request) != before
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "elsewhere"))
    (tmp_path / "elsewhere").mkdir()
    keyed = titan._answer_cache({"args": ["--module", "mod", "--config", "c"]})
    (tmp_path / "elsewhere" / "mod.py").write_text("x = 1\n")  # a --module found on PYTHONPATH counts too
    assert titan._answer_cache({"args": ["--module", "mod", "--config", "c"]}) != keyed

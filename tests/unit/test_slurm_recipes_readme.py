"""slurm-recipes/README.md maps the published (Crusoe, Nebius) torchtitan TOML keys to 0.3.0 config fields:
every field it names must be one torchtitan 0.3.0's own parser knows (for the recipe the row is about)."""

from __future__ import annotations

import re

import pytest

from cookbook.paths import project_root

README = project_root() / "slurm-recipes" / "README.md"
SECTION = "## Published torchtitan TOML keys in torchtitan 0.3.0"


def _rows() -> list[tuple[str, list[str]]]:
    """(TOML column, dotted 0.3.0 keys named in the right column) for each row of the mapping table."""
    text = README.read_text().split(SECTION, 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not cells[0].startswith(("`[", "FLUX")):
            continue
        keys = re.findall(r"`([a-z0-9_]+(?:\.[a-z0-9_]+)+|dump_folder|hf_assets_path)(?:=[^`]*)?`", cells[1])
        rows.append((cells[0], keys))
    return rows


def test_the_mapping_table_is_there():
    rows = _rows()
    assert len(rows) >= 15, rows
    assert sum(len(k) for _, k in rows) >= 30


def test_every_torchtitan_key_in_the_mapping_is_a_real_0_3_0_field():
    from cookbook.recipes.torchtitan import _known_fields

    llama, flux = set(_known_fields("llama3_8b_c4")), set(_known_fields("flux_schnell"))
    assert llama and flux, "torchtitan's parser produced no config"
    wrong = []
    for toml, keys in _rows():
        known = flux if toml.startswith("FLUX") else llama
        wrong += [f"{toml} -> {k}" for k in keys if k not in known]
    assert not wrong, f"not torchtitan 0.3.0 fields: {wrong}"


@pytest.mark.parametrize(
    "old,new",
    [("training.batch_size", "training.local_batch_size"), ("checkpoint.enable_checkpoint", "checkpoint.enable")],
)
def test_a_seed_key_is_rejected_with_the_0_3_0_name(old, new):
    from cookbook.recipes import get_recipe
    from cookbook.spec import make_spec

    problems = get_recipe("llama3_8b_c4").validate(make_spec("llama3_8b_c4", overrides={old: "1"}))
    assert problems and new in problems[0], problems

"""User-facing text names its sources (the Nebius, Crusoe, AWS and torchtune guides, with links), never
"the seeds": a reader cannot follow "seed 003". Random seeds (``--seed``, "the rank's seed") are fine."""

from __future__ import annotations

import re

from cookbook.paths import project_root

ROOT = project_root()
# "seed" as a source: "the seeds", "the seeds'", "seed 003", "the Nebius seed", "the seed table"
AS_A_SOURCE = re.compile(
    r"\bthe seeds\b|\bseeds'|\bseed\s+0\d\d\b|\b(?:Nebius|Crusoe|AWS|torchtune|torchtitan)\s+seeds?\b|\bseed table\b",
    re.IGNORECASE,
)


def _user_facing() -> list:
    files = [ROOT / "README.md", *sorted((ROOT / "notebooks").glob("*.ipynb"))]
    files += sorted(p for p in (ROOT / "slurm-recipes").rglob("*") if p.is_file())
    files += sorted((ROOT / "cookbook").rglob("*.py"))
    return files


def test_no_user_facing_text_calls_a_source_the_seeds():
    found = []
    for path in _user_facing():
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if AS_A_SOURCE.search(line):
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:120]}")
    assert not found, "name the source (with its link) instead:\n" + "\n".join(found)


def test_the_pattern_tells_a_source_from_a_random_seed():
    assert AS_A_SOURCE.search("the seeds' top-level checkpoint_dir=")
    assert AS_A_SOURCE.search("Crusoe torchtitan results (seed 002)")
    assert AS_A_SOURCE.search("the Nebius seed reaches 1.5M tps")
    for fine in ("--seed 42", "shuffled with the rank's seed", "derived from (seed, rank, epoch)", "seed=1234"):
        assert not AS_A_SOURCE.search(fine), fine

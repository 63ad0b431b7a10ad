"""Issue #43: what runs on a node is held once. No file under ``slurm-recipes/`` is a byte-for-byte copy of
another file of the repository (the programs live in the runtime, ``cookbook_runtime/programs/``, and the
scripts reach them through ``$RUNTIME_DIR``; nothing is copied beside a script)."""

from __future__ import annotations

import hashlib
import subprocess
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def repository_files(root: Path) -> list[Path]:
    """Every file git tracks or would track (untracked, not ignored) under ``root``."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        check=True,
    ).stdout
    return sorted({root / name for name in out.decode().split("\0") if name and (root / name).is_file()})


def copies_under(folder: str, files: list[Path], root: Path) -> dict[str, list[str]]:
    """``{file under folder: [other files with the same bytes]}``, empty files left out."""
    by_digest: dict[str, list[str]] = defaultdict(list)
    for path in files:
        data = path.read_bytes()
        if data:
            by_digest[hashlib.sha256(data).hexdigest()].append(path.relative_to(root).as_posix())
    return {
        name: [other for other in same if other != name]
        for same in by_digest.values()
        if len(same) > 1
        for name in same
        if name.startswith(folder + "/")
    }


def test_the_copy_finder_finds_a_copy(tmp_path):
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / "slurm-recipes" / "fsdp").mkdir(parents=True)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "train.py").write_text("print('train')\n")
    (tmp_path / "slurm-recipes" / "fsdp" / "train.py").write_text("print('train')\n")
    (tmp_path / "slurm-recipes" / "fsdp" / "own.py").write_text("print('own')\n")
    found = copies_under("slurm-recipes", repository_files(tmp_path), tmp_path)
    assert found == {"slurm-recipes/fsdp/train.py": ["pkg/train.py"]}


def test_slurm_recipes_holds_no_copy_of_another_file():
    assert copies_under("slurm-recipes", repository_files(ROOT), ROOT) == {}


def _python_files() -> list[Path]:
    return [p for p in repository_files(ROOT) if p.suffix == ".py"]


def test_one_node_report_type_in_the_repository():
    """The gate, the rehearsal and doctor's probe report a node in one type: the runtime's."""
    import ast

    defined = [
        p.relative_to(ROOT).as_posix()
        for p in _python_files()
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, ast.ClassDef) and node.name == "NodeReport"
    ]
    assert defined == ["slurm-recipes/cookbook_runtime/decide.py"]


def test_one_nccl_ib_hca_parser_in_the_repository():
    """Every program that reads ``NCCL_IB_HCA`` selects the devices with the runtime's one parser."""
    import re

    readers = [p for p in _python_files() if re.search(r"environ\.get\(\s*\"NCCL_IB_HCA\"", p.read_text())]
    assert readers and [p.name for p in readers if "devices_selected" not in p.read_text()] == []


def _shipped_and_engine_files() -> list[Path]:
    return [p for p in _python_files() if p.relative_to(ROOT).parts[0] != "tests"]


def test_one_nccl_socket_ifname_parser_in_the_repository():
    """Every program that reads ``NCCL_SOCKET_IFNAME`` matches interfaces with the gate's one parser,
    ``decide.interface_matches`` (the rehearsal had its own, which skipped ``^exclusion`` lists)."""
    import re

    readers = [
        p for p in _shipped_and_engine_files() if re.search(r"environ\.get\(\s*\"NCCL_SOCKET_IFNAME\"", p.read_text())
    ]
    assert readers and [p.name for p in readers if "interface_matches" not in p.read_text()] == []


def test_one_efa_device_test_in_the_repository():
    """An EFA device is told by one function, ``cookbook_runtime.probe.efa_devices`` (the gate's, the rehearsal's
    and the doctor's probe's): its names (``rdmap*``) are written in that file only."""
    named = [p.relative_to(ROOT).as_posix() for p in _shipped_and_engine_files() if '"rdmap"' in p.read_text()]
    assert named == ["slurm-recipes/cookbook_runtime/probe.py"]

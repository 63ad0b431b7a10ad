"""Site profiles as data (issue 19, item 4): the built-in YAML, the user's and the project's files, `extends`,
one error line naming file, line and key, and `cookbook profiles [show NAME]`."""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path

import pytest

from cookbook.cli import main
from cookbook.profiles import EnvVar, Profile, ProfileError, get_profile, origins, profiles
from cookbook.render import render_job
from cookbook.spec import SpecError, make_spec


@pytest.fixture
def home(tmp_path, monkeypatch):
    """An empty XDG config folder and an empty project folder as the current directory."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.chdir(project)
    return tmp_path


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


SITE = """
mysite:
  extends: nebius
  description: my cluster
  interface: ib0
  price_per_gpu_hour: 2.5
  env:
    NCCL_IB_HCA: {value: "mlx5_0,mlx5_1", source: our admins}
    NCCL_IB_TIMEOUT: 22
    NCCL_DEBUG: null
"""


def test_builtins_are_data_in_order_with_coreweave(home):
    known = profiles()
    assert list(known) == ["generic", "nebius", "crusoe", "aws-efa", "coreweave", "local-cpu"]
    assert all(o.builtin for o in origins().values())
    cw = get_profile("coreweave")
    env = {v.name: v for v in cw.env}
    assert env["NCCL_IB_HCA"].value == "ibp" and "coreweave" in env["NCCL_IB_HCA"].source.lower()
    assert cw.interface == "eth0" and "docs.coreweave.com" in cw.interface_source
    assert (cw.fabric, cw.gpu, cw.backend) == ("ib", "h100", "nccl")
    # nebius extends generic: the common GPU variables first, then its own, as the scripts always had them
    assert [v.name for v in get_profile("nebius").env][: len(known["generic"].env)] == [
        v.name for v in known["generic"].env
    ]


def test_user_and_project_files_extend_a_builtin(home):
    write(home / "config/cookbook/profiles/site.yaml", SITE)
    write(home / "project/cookbook-profiles.yaml", "lab:\n  extends: mysite\n  gpu: h200\n")
    write(home / "project/.cookbook/profiles/more.yml", "cpu2:\n  extends: local-cpu\n  description: two\n")
    known = profiles()
    assert list(known)[-3:] == ["mysite", "lab", "cpu2"]
    site = known["mysite"]
    env = {v.name: v for v in site.env}
    assert env["NCCL_IB_HCA"] == EnvVar("NCCL_IB_HCA", "mlx5_0,mlx5_1", "our admins")
    assert env["NCCL_IB_TIMEOUT"].value == "22"  # a number is written as text
    assert "NCCL_DEBUG" not in env  # null drops an inherited variable
    assert [v.name for v in site.env].index("NCCL_IB_HCA") < [v.name for v in site.env].index("NCCL_IB_TIMEOUT")
    assert (site.interface, site.fabric, site.gpu, site.price_per_gpu_hour) == ("ib0", "ib", "h100", 2.5)
    assert known["lab"].gpu == "h200" and known["lab"].interface == "ib0"
    assert not known["cpu2"].uses_gpus and origins()["cpu2"].extends == "local-cpu"
    assert profiles(builtin_only=True).keys() == {"generic", "nebius", "crusoe", "aws-efa", "coreweave", "local-cpu"}
    # a job under the user's profile renders with its values (and nothing of the dropped one)
    script = render_job(make_spec("llama3_3_70b_lora", profile="mysite")).script
    assert "# --- cluster profile mysite: my cluster" in script
    assert "export NCCL_IB_HCA=mlx5_0,mlx5_1  # our admins" in script
    assert "export NCCL_DEBUG=" not in script
    assert "export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-ib0}" in script


def test_an_edited_file_is_read_again(home):
    path = write(home / "project/cookbook-profiles.yaml", "a:\n  extends: generic\n  gpu: h100\n")
    assert get_profile("a").gpu == "h100"
    path.write_text("a:\n  extends: generic\n  gpu: h200\n  description: longer now\n")
    assert get_profile("a").gpu == "h200"


@pytest.mark.parametrize(
    "text, line, words",
    [
        ("x:\n  extends: generic\n  sorce: y\n", 3, ["'x'", "sorce: unknown key"]),
        ("x:\n  extends: nebuis\n", 2, ["extends: unknown profile 'nebuis'", "did you mean 'nebius'"]),
        ("x:\n  extends: generic\n  uses_gpus: maybe\n", 3, ["uses_gpus: expected true or false"]),
        ("x:\n  extends: generic\n  price_per_gpu_hour: cheap\n", 3, ["price_per_gpu_hour: expected a number"]),
        ("x:\n  extends: generic\n  backend: mpi\n", 3, ["backend: got 'mpi': use one of nccl, gloo"]),
        ("x:\n  extends: generic\n  env:\n    NCCL_IB_HCA: {value: a, sorce: b}\n", 4, ["env.NCCL_IB_HCA.sorce"]),
        ("x:\n  extends: generic\n  env:\n    BAD NAME: 1\n", 4, ["'BAD NAME' is not a variable name"]),
        ("x:\n  extends: generic\n  env:\n    FLAG: true\n", 4, ["env.FLAG.value: expected text", "quote it"]),
        ("x:\n  extends: generic\n  gpu: h1000\n", 1, ["gpu 'h1000' is not a GPU kind"]),
        ("x:\n  description: d\n", 1, ["missing backend, env"]),
        ("x:\n  extends: y\ny:\n  extends: x\n", 4, ["profile 'y'", "x -> y -> x is a loop"]),
        ("nebius:\n  extends: generic\n", 1, ["'nebius' is already defined at", "builtin.yaml", "extends: nebius"]),
        ("x:\n  extends: generic\n  gpu: h100\n  gpu: h200\n", 4, ["'gpu' given twice (first on line 3)"]),
        ("x: [1, 2\n", 2, ["not valid YAML"]),
        ("- x\n", 1, ["expected a mapping of profile names"]),
    ],
)
def test_a_mistake_is_one_line_naming_file_line_and_key(home, capsys, text, line, words):
    path = write(home / "config/cookbook/profiles/site.yaml", text)
    with pytest.raises(ProfileError) as err:
        profiles()
    message = str(err.value)
    assert message.startswith(f"{path}:{line}: ") and "\n" not in message, message
    for word in words:
        assert word in message, message
    # the command line: the same line, exit 2, no traceback; a job names it as its one problem
    assert main(["profiles"]) == 2
    assert capsys.readouterr().err == f"error: {message}\n"
    with pytest.raises(SpecError) as job:
        render_job(make_spec("llama3_3_70b_lora", profile="generic"))
    assert str(job.value) == f"invalid job: {message}"


def test_unknown_profile_names_the_close_one(home, capsys):
    assert main(["profiles", "show", "corewave"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unknown profile 'corewave' (did you mean 'coreweave'?)") and err.count("\n") == 1


@dataclasses.dataclass(frozen=True)
class Thresholds:
    min_free_gb: float = 10.0
    checks: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class WiderProfile(Profile):
    site_checks: Thresholds | None = None


def test_the_loader_follows_the_dataclass_fields(home, monkeypatch):
    """A new Profile field (another engineer adds one) is a new key with no loader change."""

    import cookbook.profiles as loader

    monkeypatch.setattr(loader, "Profile", WiderProfile)
    loader._load.cache_clear()
    project = home / "project/cookbook-profiles.yaml"
    write(project, "x:\n  extends: generic\n  site_checks: {min_free_gb: 50, checks: [gpu]}\n")
    prof = profiles()["x"]
    assert prof.site_checks == Thresholds(50.0, ("gpu",))  # type: ignore[attr-defined]
    assert profiles()["generic"].site_checks is None  # type: ignore[attr-defined]
    write(home / "project/cookbook-profiles.yaml", "x:\n  extends: generic\n  site_checks: {min_free: 50}\n")
    with pytest.raises(ProfileError, match=r"cookbook-profiles.yaml:3: profile 'x': site_checks.min_free: unknown key"):
        profiles()
    loader._load.cache_clear()


def test_cookbook_profiles_lists_and_shows(home, capsys):
    write(home / "config/cookbook/profiles/site.yaml", SITE)
    assert main(["profiles"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split() == ["NAME", "GPU", "FABRIC", "FROM", "DESCRIPTION"]
    row = next(ln for ln in lines if ln.startswith("coreweave "))
    assert row.split()[:5] == ["coreweave", "h100", "ib", "built", "in"] and "CoreWeave SUNK" in row
    row = next(ln for ln in lines if ln.startswith("mysite "))
    assert "site.yaml (extends nebius)" in row and "my cluster" in row
    assert "files read:" in out and "site.yaml" in out
    assert main(["profiles", "show", "mysite"]) == 0
    shown = capsys.readouterr().out
    assert shown.startswith(f"# {home}/config/cookbook/profiles/site.yaml".replace(str(Path.home()), "~", 1))
    # what `show` prints is itself a profile file that loads to the same profile
    write(home / "project/.cookbook/profiles/copy.yaml", shown.replace("mysite:", "copy:", 1))
    assert dataclasses.replace(profiles()["copy"], name="mysite") == profiles()["mysite"]


def test_the_readme_profile_file_loads_as_it_is(home):
    """The yaml block of the README's "Your own cluster" section, written where it says."""
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    section = readme[readme.index("## Your own cluster") :]
    block = section[section.index("```yaml\n") + 8 : section.index("```\n", section.index("```yaml"))]
    path = block.splitlines()[0].removeprefix("# ").replace("~/.config", str(home / "config"))
    write(Path(path), block)
    site = get_profile("mysite")
    env = {v.name: v.value for v in site.env}
    assert (site.gpu, site.interface, site.price_per_gpu_hour) == ("h200", "ib0", 3.1)
    assert env["NCCL_IB_HCA"] == "mlx5_0,mlx5_1" and env["NCCL_IB_TIMEOUT"] == "22" and "NCCL_DEBUG" not in env


def test_no_builtin_profile_sets_a_variable_whose_reason_was_wrong():
    """#30 item 5: TORCH_NCCL_ASYNC_ERROR_HANDLING=1 (torch's default is already 3, and mode 1's abort is what can
    hang on a broken fabric) and a bare NCCL_IB_HCA=mlx5 prefix (every mlx5 device, RoCE front-end NICs
    included: NCCL's default) stay out; TRITON_CACHE_DIR's source says what writes to ~/.triton; aws-efa's
    bus-bandwidth floor lets a healthy p4d (~70 GB/s) pass and cites EFA, not InfiniBand."""
    for profile in profiles(builtin_only=True).values():
        env = {v.name: v for v in profile.env}
        assert "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in env, profile.name
        assert env.get("NCCL_IB_HCA") is None or env["NCCL_IB_HCA"].value not in ("mlx5", "mlx5_"), profile.name
        if "TRITON_CACHE_DIR" in env:
            assert "outside inductor" in env["TRITON_CACHE_DIR"].source, profile.name
    efa = get_profile("aws-efa").gate().allreduce_min_busbw_gbps
    assert efa.value < 70 and "EFA" in efa.source and "p4d" in efa.source and "InfiniBand per node" not in efa.source

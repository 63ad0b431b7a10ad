"""One place per fact: every copy of a fact the package keeps must agree with its one source.

- GPU peaks: ``cookbook.gpus`` is the table; the planner and the derived metrics read it, the standalone
  FSDP script (``train.py``) and the pre-flight check read it from ``cookbook_runtime.gpus``: no copies.
- Model shapes and FLOPs per token: the planner's ``MODELS`` and the FSDP script's ``SHAPES`` describe the
  same architectures; the script's FLOPs count (from the built module) equals the planner's formula.
- Versions: pyproject.toml's dependencies; ``cookbook doctor`` and the CPU shims read them.
- Profile defaults: ``spec.profile_defaults``; the generated ``slurm-recipes`` specs use it.
- FLUX's batch (the Nebius guide's images per GPU): ``FluxSchnell.images_per_gpu``; the planner's default
  and the rehearsal's expected value read it, the torchtitan config keeps a copy checked here.
"""

from __future__ import annotations

import tomllib

import pytest
import torch

from cookbook import gpus, versions
from cookbook.metrics import peak_tflops as metrics_peak
from cookbook.paths import project_root
from cookbook.planner import GPUS, get_model
from cookbook.planner.estimate import Settings, flops_per_token
from cookbook_runtime import nodecheck as preflight
from cookbook_runtime.programs import fsdp_train as ft

FSDP_MODELS = [name for name in ft.SHAPES if not name.startswith("tiny")]


def test_the_gpu_table_is_written_once_in_the_runtime():
    import cookbook_runtime.gpus

    assert gpus.GPU_KINDS is cookbook_runtime.gpus.GPU_KINDS
    for module in (ft, preflight):
        assert "PEAK_BF16_TFLOPS" not in vars(module)  # no pinned copy left


@pytest.mark.parametrize(
    "device_name",
    [
        "NVIDIA H100 80GB HBM3",
        "NVIDIA H100 PCIe",
        "NVIDIA H100 NVL",
        "NVIDIA H200",
        "NVIDIA B200",
        "NVIDIA GB200",
        "NVIDIA A100-SXM4-80GB",
        "NVIDIA A100-SXM4-40GB",
        "NVIDIA L40S",
        "NVIDIA L4",
    ],
)
def test_every_reader_of_a_gpu_peak_gets_the_same_number(device_name):
    kind = gpus.gpu_kind(device_name)
    assert ft.peak_tflops(device_name) == metrics_peak(device_name) == kind.peak_bf16_tflops
    assert preflight.peak_tflops(device_name) == kind.peak_bf16_tflops
    if kind.key in GPUS:
        assert GPUS[kind.key].peak_bf16_tflops == kind.peak_bf16_tflops
        assert GPUS[kind.key].memory_gib == kind.memory_gib


def test_planner_gpus_are_kinds_of_the_one_table():
    assert all(spec.kind is gpus.GPU_KINDS[key] for key, spec in GPUS.items())
    assert gpus.peak_tflops("gb200") == 2500.0 and gpus.peak_tflops("h100", "fp8") == 1979.0


@pytest.mark.parametrize("name", FSDP_MODELS)
def test_fsdp_shapes_are_the_planner_shapes(name):
    script, planner = ft.SHAPES[name], get_model(name)
    assert (script.hidden, script.intermediate, script.layers, script.heads, script.kv_heads, script.vocab) == (
        planner.hidden,
        planner.intermediate,
        planner.layers,
        planner.heads,
        planner.kv_heads,
        planner.vocab_size,
    )
    assert script.tie_embeddings == planner.tied_embeddings
    assert (script.experts or 1, script.experts_per_token or 1) == (planner.experts, planner.experts_per_token)


@pytest.mark.parametrize("name", ["llama3_1_8b", "llama3_2_1b", "mixtral_8x7b"])
def test_fsdp_script_flops_per_token_is_the_planner_formula(name):
    from transformers import AutoModelForCausalLM

    shape, seq = ft.SHAPES[name], 2048
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(ft.model_config(shape, seq))
    assert ft.flops_per_token(model, shape, seq) == pytest.approx(
        flops_per_token(get_model(name), Settings(seq_len=seq)), rel=1e-9
    )


def test_versions_come_from_pyproject():
    deps = tomllib.loads((project_root() / "pyproject.toml").read_text())["project"]["dependencies"]
    for package in versions.FRAMEWORKS:
        line = next(d for d in deps if d.split("=")[0].split("<")[0].split(">")[0] == package)
        assert versions.requirement(package).replace(" ", "") in {line.replace(" ", ""), _sorted_spec(line)}
    from cookbook import doctor
    from cookbook.local.compat import cpu

    assert not hasattr(doctor, "KNOWN_GOOD")
    assert cpu.VERIFIED_VERSIONS == {p: versions.exact_version(p) for p in ("torch", "torchtune", "torchtitan")}


def _sorted_spec(line: str) -> str:
    from packaging.requirements import Requirement

    r = Requirement(line)
    return f"{r.name}{r.specifier}"


def test_generated_scripts_take_the_profile_defaults():
    from cookbook.render import generated_specs
    from cookbook.spec import profile_defaults

    for spec in generated_specs():
        assert {k: getattr(spec, k) for k in profile_defaults(spec.profile)} == profile_defaults(spec.profile)


def test_a_bare_jobspec_has_the_gpu_profiles_defaults():
    from cookbook.spec import JobSpec, profile_defaults

    spec = JobSpec(recipe="fsdp_llama3_1_8b")
    for profile in ("generic", "nebius", "crusoe", "aws-efa"):
        assert {k: getattr(spec, k) for k in profile_defaults(profile)} == profile_defaults(profile)


def test_the_rehearsal_manifest_takes_the_profile_defaults(monkeypatch):
    from cookbook.recipes import get_recipe
    from cookbook.rehearsal.rehearse import manifest
    from cookbook.spec import profile_defaults

    real, seen = get_recipe("llama3_8b_c4"), []
    monkeypatch.setattr(real, "read_paths", lambda spec: seen.append(spec) or [])
    for profile in ("local-cpu", "nebius"):
        manifest(f"#!/bin/bash\n# llama3_8b_c4 (torchtitan), profile {profile}: x\n")
        assert {k: getattr(seen[-1], k) for k in profile_defaults(profile)} == profile_defaults(profile)


def test_prices_are_facts_of_the_gpu_table_and_profiles_name_known_kinds():
    from cookbook.analysis import goodput
    from cookbook.spec import profiles

    assert set(gpus.LIST_PRICE_PER_GPU_HOUR) <= set(gpus.GPU_KINDS)
    assert not [name for name in vars(goodput) if "PRICE" in name]  # no second price table
    for profile in profiles().values():
        assert profile.gpu is None or profile.gpu in gpus.GPU_KINDS, profile.name
        assert profile.gpu_hour_price() == (
            profile.price_per_gpu_hour
            if profile.price_per_gpu_hour is not None
            else gpus.LIST_PRICE_PER_GPU_HOUR.get(profile.gpu or "")
        )
        assert profile.gpu is None or profile.uses_gpus


def test_flux_batch_is_one_fact():
    from cookbook.planner.recipes import recipe_defaults
    from cookbook.recipes import get_recipe
    from cookbook.recipes.torchtitan import parse_config
    from cookbook.spec import make_spec

    flux = get_recipe("flux_schnell")
    cfg, err = parse_config("flux_schnell", {})
    assert cfg is not None, err
    assert cfg.training.local_batch_size == flux.images_per_gpu == 32  # the Nebius guide's toml
    assert flux.planner_defaults()["settings"]["micro_batch"] == flux.images_per_gpu
    assert recipe_defaults("flux_schnell").settings.micro_batch == flux.images_per_gpu
    assert flux.expected_config(make_spec("flux_schnell", "nebius"))["training.local_batch_size"][0] == 32

"""Planner: exact parameter counts, published memory figures, fit verdicts, suggestions and the CLI.

Memory tolerance (also stated in benchmarks/README.md ## Planner): the planner's peak must be within 15%
of each published LLM figure, and within 20% for FLUX, whose batch size is inferred from its log.
"""

from __future__ import annotations

import math

import pytest

from cookbook.cli import main as cli_main
from cookbook.planner import (
    MODELS,
    Settings,
    count_parameters,
    estimate_memory,
    fit_warning,
    get_gpu,
    get_model,
    plan,
    settings_overrides,
    shape_from_config,
    suggest,
)
from cookbook.planner.hardware import GIB

MEMORY_TOLERANCE = 0.15
FLUX_MEMORY_TOLERANCE = 0.20


@pytest.mark.parametrize(
    "key, expected",
    [
        ("llama3_1_8b", 8_030_261_248),  # Meta's published count for Llama 3.1 8B
        ("llama3_1_70b", 70_553_706_496),
        ("mixtral_8x7b", 46_702_792_704),  # seed 003 log: "Created model with total parameters: 46702792704"
        ("mathstral_7b", 7_248_023_552),  # seed 003 log: "total parameters: 7248023552"
        ("llama3_2_1b", 1_235_814_400),
        ("llama2_7b", 6_738_415_616),
        ("flux_dev", 11_901_408_320),  # FLUX.1-dev transformer; schnell lacks the guidance embedder
    ],
)
def test_exact_parameter_counts(key, expected):
    assert get_model(key).total_params == expected


def test_moe_active_params_count_two_of_eight_experts():
    m = get_model("mixtral_8x7b")
    assert m.active_params == m.total_params - 6 * m.layers * 3 * m.hidden * m.intermediate
    assert 12.8e9 < m.active_params < 13.0e9
    guidance_embedder = (256 * 3072 + 3072) + (3072 * 3072 + 3072)
    assert get_model("flux_dev").total_params - get_model("flux_schnell").total_params == guidance_embedder


def test_tiny_model_count_matches_the_model_itself(tiny_assets):
    """The planner's count for the tiny model equals the tensors in its safetensors file and the
    parameters of torchtune's module built from its config.json (nothing retyped here)."""
    import json

    from safetensors import safe_open
    from torchtune.models.llama3_1 import llama3_1

    config = json.loads((tiny_assets.llama_dir / "config.json").read_text())
    in_file = 0
    for shard in tiny_assets.llama_dir.glob("*.safetensors"):
        with safe_open(str(shard), "pt") as f:
            in_file += sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())
    module = llama3_1(
        vocab_size=config["vocab_size"],
        num_layers=config["num_hidden_layers"],
        num_heads=config["num_attention_heads"],
        num_kv_heads=config["num_key_value_heads"],
        embed_dim=config["hidden_size"],
        intermediate_dim=config["intermediate_size"],
        max_seq_len=config["max_position_embeddings"],
    )
    assert in_file > 0
    assert shape_from_config(config).total_params == in_file == count_parameters(module)


def test_hf_config_dict_gives_the_same_shape():
    hf = {
        "vocab_size": 128256,
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "tie_word_embeddings": False,
    }
    assert shape_from_config(hf).total_params == MODELS["llama3_1_8b"].total_params
    with pytest.raises(ValueError, match="hidden_size"):
        shape_from_config({"vocab_size": 1})


def _within(planned: float, published: float, tol: float) -> None:
    assert abs(planned / published - 1) <= tol, f"planner {planned:.1f} GiB vs published {published:.1f} GiB"


@pytest.mark.parametrize(
    "nodes, gpn, gpu, settings, published_gib",
    [
        # torchtitan docs/performance.md Table 1: 8B, 8x H100 96GB, FSDP, bs 2, seq 8192, selective AC
        (1, 8, "h100-96", {}, 82.4),
        (1, 8, "h100-96", {"compile": True}, 77.0),
        # Crusoe torchtitan results (seed 002), local batch 5: memory = torch max reserved
        (2, 8, "b200", {"micro_batch": 5}, 161.51),
        (3, 4, "gb200", {"micro_batch": 5}, 161.65),
        (17, 4, "gb200", {"micro_batch": 5}, 158.61),
    ],
)
def test_torchtitan_8b_memory_matches_published(nodes, gpn, gpu, settings, published_gib):
    _within(plan("llama3_8b_c4", nodes, gpn, gpu, **settings).peak_gib, published_gib, MEMORY_TOLERANCE)


def test_torchtune_readme_memory_matches_published():
    # torchtune 0.6.1 README: 70B on 8x A100, bs 2, packed 2048, compile; peak *active* memory
    full = plan("llama3_3_70b_full", 1, 8, "a100-80", seq_len=2048, micro_batch=2, fsdp_cpu_offload=True)
    _within(full.live_gib, 13.9, MEMORY_TOLERANCE)
    lora = plan("llama3_3_70b_lora", 1, 8, "a100-80", seq_len=2048, micro_batch=2, compile=True)
    _within(lora.live_gib, 27.6, MEMORY_TOLERANCE)
    # optimization-flags table: Llama 3.2 3B single device, bs 2, seq 4096, compile + chunked CE + AC
    s = Settings(
        seq_len=4096,
        micro_batch=2,
        checkpointing="full",
        loss="chunked",
        compile=True,
        master_weights_fp32=False,
        optimizer_state_bytes=2,
    )
    _within(estimate_memory(get_model("llama3_2_3b"), s, 1).live / GIB, 24.9, MEMORY_TOLERANCE)


def test_flux_memory_matches_published():
    # Nebius FLUX.1-schnell log (seed 004): "memory: 76.79GiB(96.97%)" on 2x8 H100, at the 64 images/GPU its
    # tps x step time imply (the guide's toml, and so the recipe's default, says 32)
    p = plan("flux_schnell", 2, 8, "h100", micro_batch=64)
    _within(p.peak_gib, 76.8, FLUX_MEMORY_TOLERANCE)
    assert p.fits


def test_memory_responds_to_each_lever():
    base = plan("llama3_8b_c4", 1, 8, "h100")
    modes = [
        plan("llama3_8b_c4", 1, 8, "h100", checkpointing=m).memory.activations for m in ("none", "selective", "full")
    ]
    assert modes[0] > modes[1] > modes[2]
    assert plan("llama3_8b_c4", 4, 8, "h100").memory.optimizer == pytest.approx(base.memory.optimizer / 4)
    assert plan("llama3_8b_c4", 1, 8, "h100", tp=2).memory.activations < base.memory.activations
    assert plan("llama3_8b_c4", 1, 8, "h100", micro_batch=4).peak_gib > base.peak_gib
    assert plan("llama3_8b_c4", 1, 8, "h100", fsdp_cpu_offload=True).memory.optimizer == 0
    assert plan("llama3_8b_c4", 1, 8, "h100", activation_offloading=True).memory.activations < base.memory.activations
    assert plan("llama3_8b_c4", 1, 8, "h100", fused_optimizer=False).memory.optimizer > base.memory.optimizer
    full = plan("llama3_3_70b_full", 2, 8, "h100")
    lora = plan("llama3_3_70b_lora", 2, 8, "h100", seq_len=1024, micro_batch=4)
    assert lora.memory.optimizer < full.memory.optimizer / 100


def test_fit_verdicts_and_warning():
    fits = plan("llama3_3_70b_full", 2, 8, "h100")
    assert fits.fits and fits.margin_gib > 0 and "fits" in fits.render()
    too_big = plan("llama3_3_70b_full", 1, 8, "a100-40")
    assert not too_big.fits and too_big.render().splitlines()[1].startswith("does not fit")
    assert fit_warning("llama3_3_70b_full", 2, 8, "h100", {}) is None
    warning = fit_warning("llama3_3_70b_full", 1, 8, "a100-40", {"epochs": 1, "output_dir": "/x"})
    assert warning and "does not fit" in warning
    assert fit_warning("no_such_recipe", 1, 8, "h100", None) is None


def test_throughput_and_time():
    p = plan("llama3_8b_c4", 1, 8, "h100", dataset_tokens=1e9)
    gpu = get_gpu("h100")
    assert p.tokens_per_s_per_gpu * 57.9e9 == pytest.approx(gpu.peak_bf16_tflops * 1e12 * gpu.mfu, rel=0.01)
    assert p.epoch_time_s == pytest.approx(1e9 / (p.tokens_per_s_per_gpu * 8))
    assert p.gpu_hours == pytest.approx(p.epoch_time_s * 8 / 3600)
    assert p.step_time_s == pytest.approx(2 * 8192 * 8 / (p.tokens_per_s_per_gpu * 8))
    assert plan("llama3_8b_c4", 1, 8, "h100", checkpointing="full").tokens_per_s_per_gpu < p.tokens_per_s_per_gpu


def test_suggest_returns_shapes_that_fit_with_margin():
    found = suggest("llama3_3_70b_full", 8, "a100-40", max_nodes=8)
    assert found
    assert all(s.plan.margin_fraction >= 0.10 for s in found)
    assert found[0].nodes == min(s.nodes for s in found)
    assert suggest("llama3_3_70b_full", 8, "a100-40", max_nodes=1) == []


def test_overrides_accept_config_keys_and_reject_nonsense():
    assert settings_overrides({"batch_size": "8", "enable_activation_checkpointing": "False"}) == {
        "micro_batch": 8,
        "checkpointing": "none",
    }
    with pytest.raises(ValueError, match="unknown setting"):
        settings_overrides({"bogus": 1})
    with pytest.raises(ValueError, match="whole number"):
        settings_overrides({"micro_batch": "two"})
    with pytest.raises(ValueError, match="does not divide"):
        plan("llama3_8b_c4", 1, 6, "h100", tp=4)


def test_cli_exit_codes(capsys):
    assert cli_main(["plan", "llama3_3_70b_full"]) == 0
    assert "fits" in capsys.readouterr().out
    assert cli_main(["plan", "llama3_3_70b_full", "--nodes", "1", "--gpu", "a100-40"]) == 1
    assert "does not fit" in capsys.readouterr().out
    assert cli_main(["plan", "nope"]) == 2
    assert cli_main(["plan", "llama3_8b_c4", "--set", "micro_batch"]) == 2
    assert cli_main(["plan", "llama3_8b_c4", "--set", "checkpointing=sometimes"]) == 2
    assert "checkpointing must be" in capsys.readouterr().err


def test_fit_warning_refuses_an_unknown_gpu_instead_of_reading_fits():
    from cookbook.gpus import UnknownGpu

    with pytest.raises(UnknownGpu, match="unknown GPU 'h1000'"):
        fit_warning("llama3_3_70b_full", 2, 8, "h1000", {})

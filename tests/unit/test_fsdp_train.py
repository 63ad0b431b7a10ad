"""The FSDP training script's pieces (shapes, per-rank data, packing, checkpoints, log line) and the
fsdp_<model> recipes; one real 2-process torchrun run checks training, checkpointing and exact resume."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cookbook_runtime.programs import fsdp_train as ft

ROOT = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------------------ fixtures


def _docs(n: int) -> list[str]:
    rng = random.Random(0)
    words = "the cat dog runs over a hill model shard rank data train step loss fast slow".split()
    return [f"doc {i}: " + " ".join(rng.choice(words) for _ in range(rng.randint(10, 40))) for i in range(n)]


def _write_jsonl(folder: Path, docs: list[str], files: int, prefix: str = "part") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for k in range(files):
        with open(folder / f"{prefix}-{k}.jsonl", "w") as f:
            for d in docs[k::files]:
                f.write(json.dumps({"text": d}) + "\n")
    return folder


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    """A tiny byte-level BPE tokenizer in HF layout (trained in a second, no hub)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    out = tmp_path_factory.mktemp("tok")
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        _docs(300),
        trainers.BpeTrainer(
            vocab_size=300,
            special_tokens=["<unk>", "<s>", "</s>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>").save_pretrained(
        out
    )
    return out


# ------------------------------------------------------------------------------------------ shapes


@pytest.mark.parametrize(
    "name,billions",
    [
        ("llama2_7b", 6.74),
        ("llama2_13b", 13.02),
        ("llama2_70b", 68.98),
        ("llama3_1_8b", 8.03),
        ("llama3_1_70b", 70.55),
        ("llama3_2_1b", 1.24),
        ("llama3_2_3b", 3.21),
        ("mistral_7b", 7.24),
        ("mathstral_7b", 7.25),
        ("mixtral_8x7b", 46.70),
    ],
)
def test_shapes_build_the_published_parameter_counts(name, billions):
    from transformers import AutoModelForCausalLM

    shape = ft.SHAPES[name]
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(ft.model_config(shape, shape.max_context))
    assert sum(p.numel() for p in model.parameters()) / 1e9 == pytest.approx(billions, abs=0.005)
    assert model.config.vocab_size == shape.vocab


def test_tokenizer_must_belong_to_the_model():
    llama3 = ft.SHAPES["llama3_1_8b"]
    ft.check_tokenizer(128256, llama3, "llama3_1_8b", "meta-llama/Llama-3.1-8B")
    with pytest.raises(SystemExit, match="another model family"):  # the seed's flaw: Llama 2 tokenizer
        ft.check_tokenizer(32000, llama3, "llama3_1_8b", "hf-internal-testing/llama-tokenizer")
    with pytest.raises(SystemExit, match="outside the embedding table"):
        ft.check_tokenizer(128300, llama3, "llama3_1_8b", "x")
    with pytest.raises(SystemExit, match="outside the embedding table"):
        ft.check_tokenizer(600, ft.SHAPES["tiny"], "tiny", "x")
    ft.check_tokenizer(397, ft.SHAPES["tiny"], "tiny", "tiny tokenizer")  # tiny: any small enough tokenizer


# ------------------------------------------------------------------------------------------ data


def test_rank_seeds_differ_per_rank_and_epoch_and_are_reproducible():
    seeds = {ft.rank_seed(42, r, e) for r in range(64) for e in range(4)}
    assert len(seeds) == 256
    assert ft.rank_seed(42, 3, 1) == ft.rank_seed(42, 3, 1)


def test_rank_slices_are_disjoint_and_cover_everything():
    items = list(range(103))
    parts = [list(ft.rank_slice(iter(items), r, 4)) for r in range(4)]
    assert sorted(sum(parts, [])) == items
    assert all(set(a).isdisjoint(b) for i, a in enumerate(parts) for b in parts[i + 1 :])


@pytest.mark.parametrize("files", [1, 4])  # 1 file < 2 ranks: every 2nd document; 4 files: 2 files per rank
def test_each_rank_reads_its_own_documents_in_its_own_order(tmp_path, files):
    docs = _docs(60)
    folder = _write_jsonl(tmp_path / "data", docs, files)
    per_rank = [list(ft.rank_documents(str(folder), None, "train", "text", r, 2, 42, 0, 16)) for r in range(2)]
    assert set(per_rank[0]).isdisjoint(per_rank[1])
    assert sorted(per_rank[0] + per_rank[1]) == sorted(docs)
    again = list(ft.rank_documents(str(folder), None, "train", "text", 0, 2, 42, 0, 16))
    assert again == per_rank[0]  # reproducible
    next_epoch = list(ft.rank_documents(str(folder), None, "train", "text", 0, 2, 42, 1, 16))
    assert sorted(next_epoch) == sorted(per_rank[0]) and next_epoch != per_rank[0]  # reshuffled


def test_local_c4_layout_uses_the_split_files_and_refuses_mixed_kinds(tmp_path):
    c4 = tmp_path / "c4"
    _write_jsonl(c4 / "en", _docs(10), 1, prefix="c4-train")
    _write_jsonl(c4 / "en", _docs(4), 1, prefix="c4-validation")
    (c4 / "README.md").write_text("---\nconfigs:\n- config_name: en\n---\n")
    kind, files = ft.local_data_files(c4, "train", "en")
    assert kind == "json" and [Path(f).name for f in files] == ["c4-train-0.jsonl"]
    (c4 / "en" / "extra.txt").write_text("x\n")
    with pytest.raises(SystemExit, match="one kind"):
        ft.local_data_files(c4, "train", "en")


def test_packed_batches_resume_exactly_and_cycle_epochs():
    docs = [f"document {i} " + "word " * (i % 7) for i in range(9)]

    def documents(epoch: int):
        rng = random.Random(epoch)
        return iter(rng.sample(docs, len(docs)))

    def encode(text: str) -> list[int]:
        return [len(w) for w in text.split()] + [0]

    ref = ft.PackedBatches(documents, encode, batch_size=2, seq_len=5)
    batches = [ref.next_batch() for _ in range(12)]  # several epochs of 9 short documents
    assert ref.epoch >= 2
    assert all(b.shape == (2, 6) for b in batches)
    for k in range(12):
        replay = ft.PackedBatches(documents, encode, 2, 5)
        for _ in range(k):
            replay.next_batch()
        resumed = ft.PackedBatches(documents, encode, 2, 5, state=json.loads(json.dumps(replay.state_dict())))
        assert [resumed.next_batch().tolist() for _ in range(12 - k)] == [b.tolist() for b in batches[k:]]


def test_empty_rank_share_fails_clearly():
    data = ft.PackedBatches(lambda epoch: iter([]), lambda t: [1], 1, 4)
    with pytest.raises(SystemExit, match="empty"):
        data.next_batch()


# ------------------------------------------------------------------------------------------ checkpoints, logs


def test_only_complete_checkpoints_count(tmp_path):
    for step, complete in ((4, True), (8, True), (12, False)):
        d = tmp_path / f"step-{step}"
        d.mkdir()
        if complete:
            (d / ft.COMPLETE).write_text("{}")
    (tmp_path / ".step-16.tmp").mkdir()
    (tmp_path / "step-x").mkdir()
    assert ft.latest_checkpoint(tmp_path) == tmp_path / "step-8"
    assert [s for s, _ in ft.complete_checkpoints(tmp_path)] == [4, 8]
    ft.clean_partial_checkpoints(tmp_path)
    assert not (tmp_path / ".step-16.tmp").exists()
    assert ft.latest_checkpoint(tmp_path / "missing") is None


def test_log_line_keeps_the_seed_format_and_adds_throughput():
    line = ft.format_step(12, 5.4321, 14.5, 1e-4, 3712.04, 38.123)
    assert line == (
        "Batch 12 Loss: 5.43210, Speed: 14.50 samples/sec, lr: 0.000100, tokens_per_second_per_gpu: 3712.0, mfu: 38.12%"
    )
    assert ft.format_step(1, 1.0, 1.0, 1.0, 1.0, None).endswith("mfu: N/A")


def test_cookbook_metrics_parses_the_log_line():
    from cookbook.metrics.parse import parse_text

    text = (
        "2026-11-22 22:22:16 I [train.py:627] " + ft.format_step(1, 6.2, 5.7, 5e-4, 183.6, None) + "\n"
        "0: 2026-11-22 22:22:17 I [train.py:627] " + ft.format_step(2, 6.1, 34.9, 1e-3, 1118.2, 12.5) + "\n"
    )
    df = parse_text(text)
    assert list(df["step"]) == [1, 2]
    assert list(df["loss"]) == pytest.approx([6.2, 6.1])
    assert list(df["tokens_per_second_per_gpu"]) == pytest.approx([183.6, 1118.2])
    assert df["mfu_pct"].iloc[1] == pytest.approx(12.5)


def test_mfu_inputs():
    assert ft.peak_tflops("NVIDIA H100 80GB HBM3") == 989.0
    assert ft.peak_tflops("NVIDIA H100 PCIe") == 756.0
    assert ft.peak_tflops("NVIDIA A100-SXM4-80GB") == 312.0
    assert ft.peak_tflops("Quadro RTX") is None
    from transformers import AutoModelForCausalLM

    shape = ft.SHAPES["mixtral_8x7b"]
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(ft.model_config(shape, 4096))
    # Mixtral: ~12.9B active parameters per token, not 46.7B
    active = (ft.flops_per_token(model, shape, 4096) - 12 * shape.layers * shape.hidden * 4096) / 6
    assert active / 1e9 == pytest.approx(12.75, abs=0.2)


def test_lr_schedule_warms_up_then_decays_to_the_floor():
    f = ft.lr_lambda(warmup=4, max_steps=20, min_ratio=0.1)
    assert [round(f(s), 3) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert f(20) == pytest.approx(0.1) and f(100) == pytest.approx(0.1)


# ------------------------------------------------------------------------------------------ a real run


def _torchrun(args: list[str], cwd: Path, nproc: int = 2) -> str:
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "CUDA_VISIBLE_DEVICES": "",
    }
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={nproc}",
            str(ROOT / "slurm-recipes" / "cookbook_runtime" / "programs" / "fsdp_train.py"),
            *args,
        ],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout


def _losses(log: str) -> dict[int, float]:
    return {int(s): float(v) for s, v in re.findall(r"Batch (\d+) Loss: ([\d.]+)", log)}


def _tiny_args(tmp_path: Path, tokenizer_dir: Path, model: str) -> list[str]:
    data = _write_jsonl(tmp_path / "data", _docs(200), 4)
    return [
        f"--model={model}",
        "--seq_len=32",
        f"--tokenizer={tokenizer_dir}",
        f"--dataset={data}",
        f"--checkpoint_dir={tmp_path / 'ckpt'}",
        "--max_steps=6",
        "--checkpoint_freq=3",
        "--warmup_steps=2",
        "--lr=1e-3",
        "--keep_checkpoints=0",
    ]


@pytest.mark.slow
def test_mixtral_shape_trains_with_activation_checkpointing(tmp_path, tokenizer_dir):
    log = _torchrun(
        _tiny_args(tmp_path, tokenizer_dir, "tiny_moe") + ["--activation_checkpointing=1", "--max_steps=3"], tmp_path
    )
    losses = _losses(log)
    assert sorted(losses) == [1, 2, 3] and losses[3] < losses[1]
    assert "activation checkpointing" in log and ft.latest_checkpoint(tmp_path / "ckpt").name == "step-3"


@pytest.mark.slow
def test_two_ranks_train_checkpoint_and_resume_exactly(tmp_path, tokenizer_dir):
    args = _tiny_args(tmp_path, tokenizer_dir, "tiny")
    ckpt = tmp_path / "ckpt"
    full = _torchrun(args, tmp_path)
    first = _losses(full)
    assert sorted(first) == [1, 2, 3, 4, 5, 6]
    assert first[6] < first[1]
    hashes = dict(re.findall(r"rank (\d) first batch sha256 (\w+)", full))
    assert set(hashes) == {"0", "1"} and hashes["0"] != hashes["1"]
    assert [s for s, _ in ft.complete_checkpoints(ckpt)] == [3, 6]

    # the run was "killed" after step 3: newest complete is step-3; junk of a dying save is ignored
    import shutil

    shutil.rmtree(ckpt / "step-6")
    (ckpt / ".step-6.tmp").mkdir()
    (ckpt / "step-9").mkdir()  # no COMPLETE marker: not a checkpoint
    resumed = _torchrun(args, tmp_path)
    assert "Resumed from checkpoint" in resumed and "step-3 (step 3)" in resumed
    second = _losses(resumed)
    assert sorted(second) == [4, 5, 6]
    for step in (4, 5, 6):
        assert second[step] == pytest.approx(first[step], abs=1e-5)
    assert not (ckpt / ".step-6.tmp").exists()
    # finished run started again, on 1 rank: DCP reshards 2 -> 1, then there is nothing left to train
    done = _torchrun(args, tmp_path, nproc=1)
    assert "written by 2 ranks" in done and "nothing to train" in done and not _losses(done)


@pytest.mark.slow
def test_a_missing_tokenizer_fails_with_what_to_do():
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "slurm-recipes" / "cookbook_runtime" / "programs" / "fsdp_train.py"),
            "--model=llama2_7b",
            "--tokenizer=/nonexistent/tokenizer",
            "--dataset=x",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode != 0 and "cannot load tokenizer" in r.stderr


# ------------------------------------------------------------------------------------------ recipes


def test_one_fsdp_recipe_per_table_model():
    from cookbook.recipes import list_recipes
    from cookbook.recipes.fsdp import FSDP_MODELS

    names = {r.name for r in list_recipes() if r.framework == "fsdp"}
    assert names == {f"fsdp_{m}" for m, _, _ in FSDP_MODELS}
    assert {m for m, _, _ in FSDP_MODELS} == {n for n in ft.SHAPES if not n.startswith("tiny")}


def _spec(recipe: str = "fsdp_llama3_1_8b", **kw):
    from cookbook.spec import JobSpec

    if kw.get("profile") == "local-cpu":
        kw.update(gpus_per_node=0, exclusive=False)
    return JobSpec(recipe=recipe, **kw)


def test_overrides_are_checked_by_the_scripts_own_parser():
    from cookbook.render import validate
    from cookbook.spec import SpecError

    validate(_spec(overrides={"max_steps": "500", "dataset": "/fsx/c4/en", "seq_len": "4096"}))
    with pytest.raises(SpecError, match="did you mean max_steps"):
        validate(_spec(overrides={"max_step": "5"}))
    with pytest.raises(SpecError, match="set by the recipe"):
        validate(_spec(overrides={"model": "llama2_7b"}))
    with pytest.raises(SpecError, match="invalid int value"):
        validate(_spec(overrides={"max_steps": "many"}))
    with pytest.raises(SpecError, match="positive"):
        validate(_spec(overrides={"checkpoint_freq": "0"}))


def test_rendered_script_runs_train_py_with_the_recipe_arguments():
    from cookbook.render import render_job, runtime_files

    job = render_job(_spec(profile="aws-efa", container_image="/fsx/pytorch-fsdp.sqsh", container_mounts=["/fsx:/fsx"]))
    assert job.files == {
        "cookbook_runtime/programs/fsdp_train.py": Path(ft.__file__).read_text(),
        **runtime_files(),  # the job runtime, once per job folder
    }
    assert (
        '"${RUNTIME_DIR}"/cookbook_runtime/programs/fsdp_train.py' in job.script and "--model=llama3_1_8b" in job.script
    )
    assert "--container-image=/fsx/pytorch-fsdp.sqsh" in job.script and "FI_PROVIDER=efa" in job.script
    assert '--checkpoint_dir="${RUN_DIR}"/checkpoints' in job.script
    assert any("gated" in w for w in job.warnings)
    local = render_job(_spec("fsdp_mixtral_8x7b", profile="local-cpu"))
    assert "--model=tiny_moe" in local.script and '--dataset="${TINY_DIR}"/c4' in local.script
    assert "--backend=gloo" in local.script and "--nproc-per-node=1" in local.script


def test_slurm_recipes_fsdp_is_up_to_date():
    from cookbook.render import generated_files

    folder = ROOT / "slurm-recipes" / "fsdp"
    expected = {n.split("/", 1)[1]: text for n, text in generated_files().items() if n.startswith("fsdp/")}
    stale = [n for n, text in expected.items() if not (folder / n).is_file() or (folder / n).read_text() != text]
    assert not stale, f"regenerate: cookbook generate-recipes slurm-recipes ({stale[:3]})"
    extra = {p.name for p in folder.iterdir()} - set(expected) - {"README.md"}
    assert not extra, extra


@pytest.mark.slow
def test_profiling_traces_the_chosen_steps_on_every_rank(tmp_path, tokenizer_dir):
    from cookbook.profiling.collect import find_traces
    from cookbook.profiling.summarize import summarize
    from cookbook.recipes import get_recipe

    profile_dir = tmp_path / "run" / "profiling" / "traces"
    overrides = get_recipe("fsdp_llama3_2_1b").profiling_overrides(device="cpu", steps=2, warmup=1, start_step=3)
    flags = [f"--{k}={v}".replace("$RUN_DIR", str(tmp_path / "run")) for k, v in overrides.items()]
    log = _torchrun(_tiny_args(tmp_path, tokenizer_dir, "tiny") + flags, tmp_path)
    assert sorted(_losses(log)) == [1, 2, 3, 4, 5, 6]
    traces = find_traces(tmp_path / "run")
    assert [(t.iteration, t.rank, t.world_size) for t in traces] == [(4, 0, 2), (4, 1, 2)]
    assert all(t.path.parent == profile_dir / "iteration_4" for t in traces)
    summary = summarize([t.path for t in traces])
    assert set(summary.per_rank["rank"]) == {0, 1} and (summary.per_rank["steps"] == 2).all()
    assert "aten::mm" in set(summary.top_ops["name"])

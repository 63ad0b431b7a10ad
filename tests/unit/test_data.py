"""cookbook.data: row-named errors, torchtune's real builders + tokenizer on the tiny assets, layouts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from cookbook.data import (
    DataError,
    DatasetSpec,
    TokenizerSpec,
    check_dataset,
    check_vocab,
    dataset_overrides,
    dataset_yaml,
    read_rows,
    titan,
    validate_rows,
)

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "data"


def _problems(spec: DatasetSpec) -> str:
    with pytest.raises(DataError) as e:
        validate_rows(spec, read_rows(spec))
    return str(e.value)


@pytest.mark.parametrize(
    "name,style,cmap,expected",
    [
        ("sharegpt_bad_role.jsonl", "sharegpt", {}, "row 1 (line 2), column 'conversations[0].from': role 'user'"),
        ("sharegpt_empty.jsonl", "sharegpt", {}, "row 2 (line 3), column 'conversations[1].value': empty message"),
        ("invalid_json.jsonl", "sharegpt", {}, "row 1 (line 3): invalid JSON"),
        ("openai_wrong_order.jsonl", "openai", {}, "row 1 (line 2), column 'messages': Assistant message before"),
        (
            "instruct_wrong_column.csv",
            "instruct",
            {"input": "question", "output": "answer"},
            "row 0 (line 2), column 'answer': missing (row has: question, reply)",
        ),
        (
            "openai_good.jsonl",
            "sharegpt",
            {},
            "row 0 (line 1), column 'conversations': missing (row has: messages); "
            "it has 'messages': use --style openai",
        ),
    ],
)
def test_bad_files_name_row_and_column(name, style, cmap, expected):
    assert expected in _problems(DatasetSpec(str(FIX / name), style, cmap))


def test_wrong_column_in_json_array(tmp_path):
    f = tmp_path / "a.json"
    f.write_text(json.dumps([{"instruction": "a", "output": "b"}, {"instruction": "a", "answer": "b"}]))
    assert "row 1, column 'output': missing" in _problems(DatasetSpec(str(f), "alpaca"))


def test_column_map_keys_checked():
    with pytest.raises(ValueError, match="do not apply to style 'sharegpt'"):
        DatasetSpec(str(FIX / "openai_good.jsonl"), "sharegpt", {"messages": "x"})


def test_hub_dataset_offline_is_a_clear_error(monkeypatch):
    import datasets.config
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    # the libraries read the variables once, at import: an earlier test in this worker may have imported them
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    with pytest.raises(DataError) as e:
        read_rows(DatasetSpec("someone/nonexistent-chat-set", "sharegpt"), limit=5)
    assert "someone/nonexistent-chat-set" in str(e.value)


@pytest.mark.parametrize("style,attr", [("sharegpt", "chat_sharegpt"), ("openai", "chat_openai"), ("alpaca", "alpaca")])
def test_check_tiny_datasets_with_real_tokenizer(tiny_assets, style, attr):
    spec = DatasetSpec(str(getattr(tiny_assets, attr)), style)
    tok = TokenizerSpec(str(tiny_assets.tokenizer_model), str(tiny_assets.special_tokens))
    report = check_dataset(spec, tok, max_seq_len=48, model_dir=tiny_assets.llama_dir, sample=32)
    assert report.rows_checked == 32 and report.rows_total and report.rows_total >= 32
    assert all(n > 5 for n in report.lengths)
    expect_trunc = sum(n > 48 for n in report.lengths) / 32
    assert report.truncated_share == pytest.approx(expect_trunc)
    assert report.packed_sequences and report.packed_sequences <= 32
    assert report.vocab is not None and report.vocab.ok, report.vocab
    fig = report.plot()
    assert fig.axes[0].get_xlabel() == "tokens per sample"
    assert "truncated at max_seq_len=48" in report.render()


def test_instruct_csv_overrides_build_the_same_dataset(tiny_assets):
    from omegaconf import OmegaConf
    from torchtune import config

    spec = DatasetSpec(str(FIX / "instruct_qa.csv"), "instruct", {"input": "question", "output": "answer"})
    ov = dataset_overrides(spec, packed=True, max_seq_len=64)
    assert ov["dataset._component_"] == "torchtune.datasets.instruct_dataset"
    assert ov["dataset.column_map.output"] == "answer" and ov["tokenizer.max_seq_len"] == "64"
    block = yaml.safe_load(dataset_yaml(spec))["dataset"]
    tok = TokenizerSpec(str(tiny_assets.tokenizer_model), str(tiny_assets.special_tokens)).build()
    ds = config.instantiate(OmegaConf.create(block), tokenizer=tok)  # the block as the recipe would use it
    assert len(ds) == 3 and len(ds[0]["tokens"]) > 3
    # the overrides, applied as `tune run` applies them, give the same block
    dotlist = [f"{k}={v}" for k, v in ov.items()]
    cfg = OmegaConf.merge(OmegaConf.create({"dataset": {}}), OmegaConf.from_dotlist(dotlist))
    assert OmegaConf.to_container(cfg.dataset) == {**block, "packed": True}


def test_vocab_mismatch_detected(tiny_assets, tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    cfg = json.loads((tiny_assets.llama_dir / "config.json").read_text())
    cfg["vocab_size"] = 300  # smaller than the tokenizer: wrong tokenizer for this model
    (model / "config.json").write_text(json.dumps(cfg))
    tok = TokenizerSpec(str(tiny_assets.tokenizer_model), str(tiny_assets.special_tokens)).build()
    v = check_vocab(tok, model)
    assert not v.ok and any("embeds only 300" in m for m in v.mismatches)
    assert any("special token ids >= vocab_size 300" in m for m in v.mismatches)
    assert check_vocab(tok, tiny_assets.llama_dir).ok


def test_c4_layout_roundtrip_and_missing_header(tmp_path):
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"body": f"document {i} " * 10}) + "\n" for i in range(12)))
    out = titan.write_c4(titan.texts_from_files([src], column="body"), tmp_path / "c4", shard_rows=5)
    assert len(list((out / "en").glob("c4-train.*.json.gz"))) == 3
    r = titan.check_c4(out)
    assert r.ok and r.details["rows (up to limit)"] == {"train": 11, "validation": 1}
    (out / "README.md").unlink()
    r = titan.check_c4(out)
    assert not r.ok and "config_name: en" in r.problems[0]


def test_cc12m_layout_and_small_images(tmp_path):
    from PIL import Image

    pairs = [(Image.new("RGB", (300, 260), (i * 40, 90, 0)), f"a red square {i}") for i in range(5)]
    out = titan.write_cc12m(pairs, tmp_path / "cc", shard_size=2)
    assert len(list(out.glob("*.tar"))) == 3
    assert titan.check_cc12m(out, output_size=256).ok
    small = titan.check_cc12m(out, output_size=512)
    assert not small.ok and "skips them all" in small.problems[0]


def test_tiny_c4_asset_is_valid(tiny_assets):
    assert titan.check_c4(tiny_assets.c4_dir).ok

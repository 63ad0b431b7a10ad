"""torchtitan data layouts: a local C4 subset and a cc12m webdataset folder, written and checked.

torchtitan's ``c4`` loader calls ``load_dataset(path, name="en", split=..., streaming=True)``: a local
folder therefore needs a README.md whose YAML header declares the config ``en``. Its ``cc12m-test``
loader reads ``*.tar`` webdataset shards (``KEY.jpg`` + ``KEY.txt`` + ``KEY.json``) and skips images
smaller than the training resolution.
"""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cookbook.data.formats import DataError, RowProblem

C4_README = """---
configs:
- config_name: en
  data_files:
  - split: train
    path: en/c4-train.*.json.gz
  - split: validation
    path: en/c4-validation.*.json.gz
---
# Local C4-layout subset (written by cookbook.data.titan.write_c4)

Use with torchtitan 0.3.0: `--dataloader.dataset c4 --dataloader.dataset_path <this folder>`
"""


_C4_TIMESTAMP = "1970-01-01T00:00:00Z"


def write_c4(texts: Iterable[str], out_dir: str | Path, *, shard_rows: int = 10_000, validation_rows: int = 1) -> Path:
    """Lay out ``texts`` as a C4 ``en`` folder (train shards + a validation shard); returns the folder."""
    out = Path(out_dir)
    docs = [t for t in texts if t and t.strip()]
    if len(docs) <= validation_rows:
        raise DataError(
            str(out), [RowProblem(None, "text", f"need more than {validation_rows} non-empty texts, got {len(docs)}")]
        )
    (out / "en").mkdir(parents=True, exist_ok=True)  # after the check: a refused layout leaves no folder
    train, val = docs[: len(docs) - validation_rows], docs[len(docs) - validation_rows :]
    shards = [train[i : i + shard_rows] for i in range(0, len(train), shard_rows)]
    for old in (out / "en").glob("c4-*.json.gz"):
        old.unlink()
    for split, parts in (("train", shards), ("validation", [val])):
        for k, part in enumerate(parts):
            name = out / "en" / f"c4-{split}.{k:05d}-of-{len(parts):05d}.json.gz"
            # allenai/c4's schema (text, timestamp, url); a fixed timestamp keeps the bytes deterministic
            raw = "".join(
                json.dumps({"text": text, "timestamp": _C4_TIMESTAMP, "url": f"local://{split}/{k}/{j}"}) + "\n"
                for j, text in enumerate(part)
            ).encode()
            # fixed mtime and no file name in the header: the same texts give the same bytes
            with open(name, "wb") as f, gzip.GzipFile(filename="", mode="wb", fileobj=f, mtime=0) as gz:
                gz.write(raw)
    (out / "README.md").write_text(C4_README)
    return out


def texts_from_files(paths: Iterable[str | Path], column: str = "text") -> list[str]:
    """Documents from ``.txt`` files (one per file) and ``.jsonl``/``.json`` files (the ``column`` field)."""
    from cookbook.data.formats import DatasetSpec, read_rows, validate_rows

    docs: list[str] = []
    for p in map(Path, paths):
        if p.suffix.lower() == ".txt":
            try:
                docs.append(p.read_text(encoding="utf-8"))
            except UnicodeDecodeError as e:
                raise ValueError(f"{p}: not UTF-8 text ({e.reason} at byte {e.start})") from None
            continue
        spec = DatasetSpec(str(p), "text", {"text": column} if column != "text" else {})
        rows = read_rows(spec)
        validate_rows(spec, rows)
        docs += [r[column] for r in rows.rows]
    return docs


@dataclass
class LayoutReport:
    """What a torchtitan data folder holds, as its loader sees it."""

    path: Path
    kind: str
    samples: int
    problems: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems and self.samples > 0


def check_c4(path: str | Path, *, limit: int = 1000) -> LayoutReport:
    """Load the folder exactly as torchtitan's ``c4`` loader does and check the ``text`` field."""
    from datasets import load_dataset

    p = Path(path)
    problems: list[str] = []
    readme = p / "README.md"
    if not readme.exists() or "config_name: en" not in readme.read_text():
        problems.append(
            f"{readme}: missing or without a `config_name: en` header; torchtitan's c4 loader asks for "
            "config 'en' (write the folder with cookbook.data.titan.write_c4 / `cookbook data c4`)"
        )
        return LayoutReport(p, "c4", 0, problems)
    counts: dict[str, int] = {}
    for split in ("train", "validation"):
        try:
            ds = load_dataset(str(p), name="en", split=split, streaming=True)
            n = 0
            for i, row in enumerate(ds.take(limit)):
                if not isinstance(row.get("text"), str) or not row["text"].strip():
                    problems.append(f"{split} row {i}: empty or missing 'text'")
                n += 1
            counts[split] = n
        except Exception as e:  # noqa: BLE001 - report the loader's own message
            problems.append(f"{split}: {type(e).__name__}: {e}")
    return LayoutReport(p, "c4", counts.get("train", 0), problems, {"rows (up to limit)": counts})


def write_cc12m(pairs: Iterable[tuple[Any, str]], out_dir: str | Path, *, shard_size: int = 1000) -> Path:
    """Write (image, caption) pairs as webdataset tar shards; an image is a path or a PIL image."""
    from PIL import Image

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("cc12m-*.tar"):
        old.unlink()
    tar: tarfile.TarFile | None = None
    n = 0
    for n, (image, caption) in enumerate(pairs):
        if n % shard_size == 0:
            if tar:
                tar.close()
            tar = tarfile.open(out / f"cc12m-train-{n // shard_size:04d}.tar", "w")
        img = image if isinstance(image, Image.Image) else Image.open(image)
        buf = io.BytesIO()
        img.convert("RGB").save(buf, format="JPEG", quality=90)
        key = f"{n:09d}"
        meta = {"key": key, "caption": caption, "width": img.width, "height": img.height}
        for ext, data in (("jpg", buf.getvalue()), ("txt", caption.encode()), ("json", json.dumps(meta).encode())):
            assert tar is not None  # opened for the first image above
            add_to_tar(tar, f"{key}.{ext}", data)
    if tar is None:
        raise DataError(str(out), [RowProblem(None, None, "no (image, caption) pairs given")])
    tar.close()
    return out


def add_to_tar(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    """Add ``data`` as file ``name`` (TarInfo's fixed defaults: mtime 0, mode 0644, uid/gid 0: same bytes each time)."""
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def check_cc12m(path: str | Path, *, output_size: int = 256, limit: int = 1000) -> LayoutReport:
    """Load the shards as torchtitan's ``cc12m-test`` loader does; flag images it would skip."""
    from datasets import load_dataset

    p = Path(path)
    if not list(p.glob("*.tar")):
        return LayoutReport(p, "cc12m", 0, [f"{p}: no *.tar shards"])
    problems: list[str] = []
    n = small = 0
    try:
        ds = load_dataset(str(p), split="train", data_files={"train": "*.tar"}, streaming=True)
        for i, row in enumerate(ds.take(limit)):
            n += 1
            if "jpg" not in row or "txt" not in row:
                problems.append(f"sample {i} ({row.get('__key__')}): needs .jpg and .txt, has {sorted(row)}")
                continue
            if min(row["jpg"].size) < output_size:
                small += 1
            if not row["txt"].strip():
                problems.append(f"sample {i} ({row.get('__key__')}): empty caption")
    except Exception as e:  # noqa: BLE001
        problems.append(f"{type(e).__name__}: {e}")
    if n and small == n:
        problems.append(
            f"every image is smaller than {output_size}px: torchtitan skips them all "
            f"(lower the encoder's img_size or use bigger images)"
        )
    return LayoutReport(p, "cc12m", n, problems, {"smaller than output_size (skipped)": small})

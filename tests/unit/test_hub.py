"""cookbook.hub / `cookbook download`: real huggingface_hub against an unreachable hub and a local HTTP hub.

The real Hub is unreachable here, which is the offline path users hit on compute nodes. Gated, missing and
successful downloads go through the real ``snapshot_download`` talking HTTP to a small local server that
speaks the Hub's protocol (HF_ENDPOINT points at it).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from cookbook.cli import main
from cookbook.paths import project_root

SECRET = "hf_TESTSECRETdoNotLeak0123456789"
SHA = "a" * 40
FILES = {
    "config.json": b'{"vocab_size": 512}',
    "model.safetensors": b"x" * 4096,
    "original/tokenizer.model": b"tok",
    "original/consolidated.00.pth": b"big" * 1000,
}


class _Hub(BaseHTTPRequestHandler):
    auth: list[str] = []

    def log_message(self, *args):  # quiet
        pass

    def _send(self, code: int, body: bytes = b"", headers: dict | None = None, head: bool = False) -> None:
        self.send_response(code)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def do_HEAD(self):
        self.do_GET(head=True)

    def do_GET(self, head: bool = False):
        _Hub.auth.append(self.headers.get("Authorization", ""))
        path = self.path.split("?")[0]
        if "/gated/" in path:
            return self._send(403, b"{}", {"X-Error-Code": "GatedRepo", "X-Error-Message": "gated"}, head)
        if "/missing/" in path:
            return self._send(401, b"{}", {"X-Error-Code": "RepoNotFound", "X-Error-Message": "nope"}, head)
        # any other repo, model or dataset, holds FILES (`cookbook stage` fetches a recipe's real repo ids)
        if m := re.fullmatch(r"/api/(models|datasets)/([\w.-]+/[\w.-]+)/revision/[^/]+", path):
            info = {"id": m[2], "sha": SHA, "siblings": [{"rfilename": f} for f in FILES]}
            return self._send(200, json.dumps(info).encode(), {"Content-Type": "application/json"}, head)
        if re.fullmatch(rf"/api/(models|datasets)/[\w.-]+/[\w.-]+/tree/{SHA}(/.*)?", path):
            tree = [
                {"type": "file", "path": f, "size": len(b), "oid": hashlib.sha1(b).hexdigest()}
                for f, b in FILES.items()
            ]
            return self._send(200, json.dumps(tree).encode(), {"Content-Type": "application/json"}, head)
        m = re.fullmatch(rf"/(datasets/)?[\w.-]+/[\w.-]+/resolve/{SHA}/(.+)", path)
        if m and m[2] in FILES:
            body = FILES[m[2]]
            return self._send(200, body, {"X-Repo-Commit": SHA, "ETag": f'"{hashlib.sha1(body).hexdigest()}"'}, head)
        return self._send(404, b"{}", {"X-Error-Code": "EntryNotFound"}, head)


@pytest.fixture(scope="module")
def local_hub():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def cookbook(*args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess (fresh huggingface_hub constants from the environment)."""
    full = {**os.environ, "PYTHONPATH": str(project_root()), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "cookbook", *args], capture_output=True, text=True, env=full, cwd=cwd, timeout=120
    )


def _isolated(tmp_path: Path, **extra: str) -> dict:
    """HF_HOME in tmp (no real token file, nor another test's HF_TOKEN_PATH), the test token in HF_TOKEN."""
    hf = tmp_path / "hf"
    return {"HF_HOME": str(hf), "HF_TOKEN_PATH": str(hf / "token"), "HF_TOKEN": SECRET,
            "HF_HUB_DISABLE_TELEMETRY": "1", **extra}  # fmt: skip


def test_offline_unreachable_hub_gives_clear_message(tmp_path):
    t0 = time.monotonic()
    r = cookbook(
        "download",
        "meta-llama/Llama-3.2-1B",
        "--output-dir",
        str(tmp_path / "m"),
        env=_isolated(tmp_path, HF_HUB_ETAG_TIMEOUT="3"),
    )
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    assert "cannot reach https://huggingface.co" in r.stderr
    assert "HF_HUB_ETAG_TIMEOUT" in r.stderr and "resumes" in r.stderr
    assert SECRET not in r.stdout + r.stderr
    assert time.monotonic() - t0 < 60


def test_connection_refused_endpoint(tmp_path):
    r = cookbook(
        "download",
        "owner/tiny",
        "--output-dir",
        str(tmp_path / "m"),
        env=_isolated(tmp_path, HF_ENDPOINT="http://127.0.0.1:9"),
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "cannot reach http://127.0.0.1:9" in r.stderr and "Connection refused" in r.stderr


def test_hf_hub_offline_mode(tmp_path):
    r = cookbook(
        "download", "owner/tiny", "--output-dir", str(tmp_path / "m"), env=_isolated(tmp_path, HF_HUB_OFFLINE="1")
    )
    assert r.returncode == 2 and "HF_HUB_OFFLINE=1" in r.stderr and "Traceback" not in r.stderr


def test_gated_repo_says_where_to_request_access(tmp_path, local_hub):
    r = cookbook(
        "download", "owner/gated", "--output-dir", str(tmp_path / "m"), env=_isolated(tmp_path, HF_ENDPOINT=local_hub)
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"Request access at {local_hub}/owner/gated" in r.stderr
    assert "your token has no access" in r.stderr
    assert SECRET not in r.stdout + r.stderr


def test_gated_repo_without_token_says_where_to_set_it(tmp_path, local_hub):
    env = _isolated(tmp_path, HF_ENDPOINT=local_hub)
    env["HF_TOKEN"] = ""
    r = cookbook("download", "owner/gated", "--output-dir", str(tmp_path / "m"), env=env)
    assert r.returncode == 2
    assert "no HF token was found" in r.stderr and "HF_TOKEN" in r.stderr and "hf auth login" in r.stderr


def test_missing_repo(tmp_path, local_hub):
    r = cookbook(
        "download", "owner/missing", "--output-dir", str(tmp_path / "m"), env=_isolated(tmp_path, HF_ENDPOINT=local_hub)
    )
    assert r.returncode == 2 and "owner/missing was not found" in r.stderr and "Traceback" not in r.stderr


def test_download_writes_repo_id_skips_consolidated_and_is_resumable(tmp_path, local_hub):
    out = tmp_path / "model"
    env = _isolated(tmp_path, HF_ENDPOINT=local_hub)
    _Hub.auth.clear()
    r = cookbook("download", "owner/tiny", "--output-dir", str(out), env=env)
    assert r.returncode == 0, r.stderr
    assert (out / "model.safetensors").read_bytes() == FILES["model.safetensors"]
    assert (out / "original" / "tokenizer.model").exists()
    assert not (out / "original" / "consolidated.00.pth").exists()  # default ignore pattern
    assert json.loads((out / "original_repo_id.json").read_text()) == {"repo_id": "owner/tiny"}
    # the token reached the library in-process (sent as a header), not via argv or files
    assert f"Bearer {SECRET}" in _Hub.auth
    # second run: nothing left to fetch (resumable); dry run says so
    (out / "model.safetensors").unlink()
    r = cookbook("download", "owner/tiny", "--output-dir", str(out), "--dry-run", env=env)
    assert r.returncode == 0, r.stderr
    assert "get " in r.stdout and "model.safetensors" in r.stdout and "consolidated" not in r.stdout
    r = cookbook("download", "owner/tiny", "--output-dir", str(out), env=env)
    assert r.returncode == 0 and (out / "model.safetensors").exists()
    for f in out.rglob("*"):
        if f.is_file():
            assert SECRET.encode() not in f.read_bytes(), f
    assert SECRET not in r.stdout + r.stderr


def test_token_status_never_returns_value(monkeypatch):
    from cookbook import hub

    monkeypatch.setenv("HF_TOKEN", SECRET)
    st = hub.token_status()
    assert st.present and st.source == "HF_TOKEN" and SECRET not in str(st) + repr(st)
    assert hub.redact(f"x {SECRET} y", SECRET) == "x *** y"


def test_stage_downloads_every_repo_a_recipe_reads_and_the_render_it_prints_goes_offline(tmp_path, local_hub, capsys):
    """#30 item 8: `cookbook stage` fetches the model and the dataset of the LoRA finetune (their real repo ids,
    from the local hub) once to shared storage and prints the render line; that script sets HF_HUB_OFFLINE=1
    and is warned of no Hub fetch. The token never reaches the output."""
    env = _isolated(tmp_path, HF_ENDPOINT=local_hub)
    root = tmp_path / "shared"
    r = cookbook("stage", "llama3_3_70b_lora", "--profile", "nebius", "--nodes", "4", "--root", str(root), env=env)
    assert r.returncode == 0, r.stderr
    assert f"[1/2] model meta-llama/Llama-3.3-70B-Instruct -> {root}/Llama-3.3-70B-Instruct" in r.stdout
    assert f"[2/2] dataset tatsu-lab/alpaca -> {root}/datasets/alpaca" in r.stdout
    assert (root / "Llama-3.3-70B-Instruct/config.json").is_file()
    assert (root / "datasets/alpaca/config.json").is_file()
    assert not (root / "Llama-3.3-70B-Instruct/original/consolidated.00.pth").exists()  # the default ignore
    assert SECRET not in r.stdout + r.stderr
    line = r.stdout.strip().splitlines()[-1].strip()
    assert line.startswith("cookbook render llama3_3_70b_lora --profile nebius --nodes 4 --set ")
    out = tmp_path / "job" / "lora.sbatch"
    args = [*shlex.split(line)[1:-1], str(out)]
    assert main(args) == 0  # the render, in this process (its warnings on stderr)
    assert "Hub" not in capsys.readouterr().err
    script = out.read_text()
    assert "export HF_HUB_OFFLINE=1  # every model, tokenizer and dataset this job reads is a local path" in script
    assert f"MODEL_DIR=${{MODEL_DIR:-{root}/Llama-3.3-70B-Instruct}}" in script


def test_stage_dry_run_fetches_nothing_and_a_local_cpu_job_has_nothing_to_stage(tmp_path):
    env = _isolated(tmp_path, HF_ENDPOINT="http://127.0.0.1:9")
    r = cookbook("stage", "flux_schnell", "--profile", "crusoe", "--root", "/shared/hf", "--dry-run", env=env)
    assert r.returncode == 0, r.stderr
    assert [ln.split()[2] for ln in r.stdout.splitlines() if ln.startswith("[")] == [
        "black-forest-labs/FLUX.1-schnell",
        "google/t5-v1_1-xxl",
        "openai/clip-vit-large-patch14",
        "pixparse/cc12m-wds",
    ]
    assert "--set encoder.t5_encoder=/shared/hf/t5-v1_1-xxl" in r.stdout
    r = cookbook("stage", "flux_schnell", "--profile", "local-cpu", "--root", "/x", env=env)
    assert r.returncode == 0 and "reads nothing from the Hub" in r.stdout
    r = cookbook("stage", "no_such_recipe", "--root", "/x", env=env)
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1

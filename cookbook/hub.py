"""Token-safe model downloads from the Hugging Face Hub.

The token comes from ``HF_TOKEN`` or HF's token file (``hf auth login``) through
:func:`huggingface_hub.get_token` and is handed to the library in-process: it is never printed,
logged, written to a file or put on a command line. Hub failures become :class:`HubError` with a
message that says what to do (request access, set the token, fix the network), never a traceback.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from huggingface_hub import constants, get_token, snapshot_download
from huggingface_hub.errors import (
    DisabledRepoError,
    DryRunError,
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

#: What the Nebius torchtune guide (https://github.com/nebius/ml-cookbook) skips: Meta's original
#: consolidated ``.pth`` shards duplicate the safetensors.
DEFAULT_IGNORE: tuple[str, ...] = ("original/consolidated*",)
#: torchtune's ``tune download`` writes this; its checkpointers copy it into adapter_config.json.
REPO_ID_FILE = "original_repo_id.json"

TOKEN_HELP = (
    "run `hf auth login` (older: `huggingface-cli login`), which stores the token in "
    f"{constants.HF_TOKEN_PATH}, where jobs on the nodes read it too, or export HF_TOKEN=... for this "
    "shell only (the cookbook never passes it to Slurm, which would keep it in its record of the job). "
    "Create a read token at https://huggingface.co/settings/tokens"
)
NETWORK_HELP = (
    "Compute nodes often have no internet: download on the login node into the shared filesystem. "
    "On slow or busy links raise the timeouts, e.g. HF_HUB_ETAG_TIMEOUT=60 "
    "HF_HUB_DOWNLOAD_TIMEOUT=60. Re-running the same command resumes where it stopped."
)


class HubError(Exception):
    """A Hub problem the user can fix; the message says how (and never contains the token)."""


@dataclass(frozen=True)
class TokenStatus:
    """Where the HF token comes from, without its value."""

    present: bool
    source: str  # "HF_TOKEN", "token file <path>" or "none"

    def __str__(self) -> str:
        return f"found ({self.source})" if self.present else "not found"


def token_status() -> TokenStatus:
    """Whether an HF token is available and from where (the value is never returned)."""
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        if os.environ.get(var, "").strip():
            return TokenStatus(True, var)
    if get_token():
        return TokenStatus(True, f"token file {constants.HF_TOKEN_PATH}")
    return TokenStatus(False, "none")


def redact(text: str, token: str | None = None) -> str:
    """``text`` with the HF token (if any) replaced by ``***``."""
    token = token if token is not None else get_token()
    return text.replace(token, "***") if token else text


def hub_url(repo_id: str, repo_type: str | None = None) -> str:
    """The repo's page, where gated access is requested."""
    prefix = {"dataset": "datasets/", "space": "spaces/"}.get(repo_type or "model", "")
    return f"{constants.ENDPOINT}/{prefix}{repo_id}"


def explain(
    exc: BaseException, repo_id: str, *, repo_type: str | None = None, token_present: bool | None = None
) -> str:
    """A user-facing message for a Hub error: what happened and what to do."""
    has_token = token_status().present if token_present is None else token_present
    url = hub_url(repo_id, repo_type)
    cause = exc.__cause__ if isinstance(exc, (LocalEntryNotFoundError, DryRunError)) and exc.__cause__ else exc
    if isinstance(cause, GatedRepoError):
        if has_token:
            return (
                f"{repo_id} is a gated repository and your token has no access yet. Request access at {url} "
                "(logged in as the account the token belongs to) and wait for the approval e-mail; "
                "a fine-grained token also needs 'read access to public gated repos'."
            )
        return f"{repo_id} is a gated repository and no HF token was found. Request access at {url}, then {TOKEN_HELP}."
    if isinstance(cause, RevisionNotFoundError):
        return f"{repo_id} has no such revision (branch, tag or commit): see {url}/tree/main"
    if isinstance(cause, DisabledRepoError):
        return f"{repo_id} has been disabled on the Hub ({url})."
    if isinstance(cause, RepositoryNotFoundError) or (
        isinstance(cause, HfHubHTTPError) and cause.response is not None and cause.response.status_code == 401
    ):
        hint = "" if has_token else f" If it is private, {TOKEN_HELP}."
        return (
            f"{repo_id} was not found on {constants.ENDPOINT} (check the spelling: owner/name, "
            f"and --repo-type for datasets), or it is private and your token cannot see it.{hint}"
        )
    if isinstance(cause, OfflineModeIsEnabled):
        return (
            "HF_HUB_OFFLINE=1 is set and the files are not on disk yet. Unset it (or run the download "
            "where the Hub is reachable) and retry."
        )
    if isinstance(cause, (httpx.TimeoutException,)):
        return (
            f"timed out talking to {constants.ENDPOINT} while fetching {repo_id} "
            f"({type(cause).__name__}). {NETWORK_HELP}"
        )
    if isinstance(cause, (httpx.ConnectError, httpx.NetworkError, httpx.ProxyError, ConnectionError)):
        return (
            f"cannot reach {constants.ENDPOINT} to fetch {repo_id}: {cause}. Check the internet connection "
            f"or proxy (HTTPS_PROXY) of this machine. {NETWORK_HELP}"
        )
    if isinstance(cause, HfHubHTTPError):
        code = cause.response.status_code if cause.response is not None else "?"
        return f"the Hub answered HTTP {code} for {repo_id}: {str(cause).splitlines()[0]}. {NETWORK_HELP}"
    if isinstance(exc, OSError) and getattr(exc, "errno", None) == 28:
        return f"the disk is full while downloading {repo_id}: free space or choose another --output-dir."
    return f"download of {repo_id} failed: {type(exc).__name__}: {exc}"


@dataclass(frozen=True)
class RemoteFile:
    """One file a download would fetch."""

    path: str
    size: int
    will_download: bool


def download(
    repo_id: str,
    output_dir: str | os.PathLike,
    *,
    revision: str | None = None,
    repo_type: str | None = None,
    allow_patterns: Sequence[str] | None = None,
    ignore_patterns: Sequence[str] | None = DEFAULT_IGNORE,
    etag_timeout: float | None = None,
    max_workers: int = 8,
) -> Path:
    """Download a repo snapshot into ``output_dir`` (resumable) and write ``original_repo_id.json``.

    Raises :class:`HubError` with an actionable message on gated / missing repos and network trouble.
    """
    folder = Path(
        _snapshot(
            repo_id,
            output_dir,
            repo_type,
            revision=revision,
            allow_patterns=allow_patterns,
            ignore_patterns=ignore_patterns,
            etag_timeout=etag_timeout if etag_timeout is not None else constants.HF_HUB_ETAG_TIMEOUT,
            max_workers=max_workers,
        )
    )
    if (repo_type or "model") == "model":
        (folder / REPO_ID_FILE).write_text(json.dumps({"repo_id": repo_id}, indent=4))
    return folder


def plan(
    repo_id: str,
    output_dir: str | os.PathLike,
    *,
    revision: str | None = None,
    repo_type: str | None = None,
    allow_patterns: Sequence[str] | None = None,
    ignore_patterns: Sequence[str] | None = DEFAULT_IGNORE,
) -> list[RemoteFile]:
    """What :func:`download` would fetch (``snapshot_download(dry_run=True)``): paths and sizes."""
    infos = _snapshot(
        repo_id,
        output_dir,
        repo_type,
        revision=revision,
        allow_patterns=allow_patterns,
        ignore_patterns=ignore_patterns,
        dry_run=True,
    )
    return [RemoteFile(i.filename, int(i.file_size or 0), bool(i.will_download)) for i in infos]


def _snapshot(
    repo_id: str,
    output_dir: str | os.PathLike,
    repo_type: str | None,
    allow_patterns: Sequence[str] | None,
    ignore_patterns: Sequence[str] | None,
    **kwargs: Any,
) -> Any:
    """``snapshot_download`` with the token handed over in-process; every failure becomes a :class:`HubError`."""
    token = get_token()
    try:
        return snapshot_download(
            repo_id,
            repo_type=repo_type,
            local_dir=Path(output_dir).expanduser(),
            token=token or None,
            allow_patterns=list(allow_patterns) if allow_patterns else None,
            ignore_patterns=list(ignore_patterns) if ignore_patterns else None,
            **kwargs,
        )
    except Exception as e:  # noqa: BLE001 - every library failure becomes one clear message
        raise HubError(redact(explain(e, repo_id, repo_type=repo_type, token_present=bool(token)), token)) from None

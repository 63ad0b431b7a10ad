"""The record a submission leaves next to its script: ``job.json`` (job id, script, log, run folder)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path

JOB_FILE = "job.json"


@dataclass
class JobRecord:
    """A submitted job: its script, log and run folder (recorded in ``job.json`` next to the script)."""

    job_id: str
    script: Path
    log: Path
    run_dir: Path
    recipe: str
    profile: str
    name: str
    submitted: str = ""

    def save(self) -> Path:
        """Write ``job.json`` next to the script; its path."""
        names = {f.name for f in fields(JobRecord)}
        data = {k: str(v) for k, v in asdict(self).items() if k in names}
        path = self.script.parent / JOB_FILE
        path.write_text(json.dumps(data, indent=2) + "\n")
        return path

    @classmethod
    def load(cls, folder: str | os.PathLike[str]) -> JobRecord:
        """The job recorded in ``folder/job.json`` (``folder`` may also be the file itself)."""
        p = Path(folder)
        data = json.loads((p if p.is_file() else p / JOB_FILE).read_text())
        return cls(
            job_id=data["job_id"],
            script=Path(data["script"]),
            log=Path(data["log"]),
            run_dir=Path(data["run_dir"]),
            recipe=data["recipe"],
            profile=data["profile"],
            name=data["name"],
            submitted=data.get("submitted", ""),
        )

"""Every ``cookbook ...`` line of README.md and slurm-recipes/README.md runs as pasted (issue #42, item 7).

Each command (a code block's line, or an inline code span) is parsed by the CLI's own argparse parser, with its
placeholders (``JOBID``, ``RUN_DIR``, ``[--now]``, ``a|b``) given sample values: an unknown verb or flag, a missing
required option, a shell pipeline of cookbook verbs fail here. Those that need no cluster, no network and no file
of the reader's (``RUNS_HERE`` verbs, no placeholder) run in a folder of their own; the exit code is checked.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from cookbook.cli import build_parser, main
from cookbook.paths import project_root

READMES = (project_root() / "README.md", project_root() / "slurm-recipes" / "README.md")
CMD = re.compile(r"(?<![\w./$-])cookbook (?=[a-z])")
PLACEHOLDER = re.compile(r"[A-Z][A-Z0-9_]*|\.\.\.|\$SHARED\b.*|<[^>]*>")
RUNS_HERE = frozenset({"recipes", "profiles", "plan", "render"})  # verbs that need no cluster, network or download
# files a command reads that the reader brings: what the test writes in their place
READER_FILES = {
    "train.py": "import torch.distributed  # your torchrun program\n",
    "my.yaml": None,  # torchtune's own llama3_1/8B_full.yaml, written by _reader_files
}
NOT_RUN = {"titan:my_models.py:my_config": "a torchtitan config module of your own"}
EXIT = {"cookbook render llama3_8b_c4 --set training.batch_size=4 -o job.sbatch": 2}  # the README says: exits 2


@dataclass(frozen=True)
class Command:
    where: str  # FILE:LINE
    tokens: tuple[str, ...]  # from `cookbook` on, as the shell splits them, without a comment
    pasted: bool  # a code block's line (pasted whole) or an inline span (a mention in prose)

    @property
    def text(self) -> str:
        return " ".join(self.tokens)

    @property
    def placeholders(self) -> list[str]:
        """The tokens (or their ``=``/``:``/``,``-separated parts) a reader replaces before running."""
        out = []
        for token in self.tokens:
            if token.startswith("[") or token.endswith("]") or "|" in token:
                out.append(token)
            out += [p for p in re.split(r"[=:,]", token.strip("[]")) if p and PLACEHOLDER.fullmatch(p)]
        return out


def _segments(text: str, comments: bool) -> list[tuple[str, ...]]:
    """The cookbook commands of one shell line: from each ``cookbook`` (also inside ``$(...)``) to the next
    ``&&`` or ``;``, without a comment where the line is shell."""
    tokens = []
    for token in shlex.split(text, comments=comments):
        inner = token.removeprefix("$(").removesuffix(")") if token.startswith("$(cookbook ") else None
        tokens += [*shlex.split(inner), "&&"] if inner else [token]
    out, current = [], None
    for token in tokens:
        if token in ("&&", ";", "||"):
            current = None
        elif current is not None:
            current.append(token)
        elif token == "cookbook":
            current = [token]
            out.append(current)
    return [tuple(c) for c in out]


def commands() -> list[Command]:
    """Every cookbook command of the READMEs: shell code blocks' lines (continuations joined) and inline spans."""
    found = []
    for readme in READMES:
        lines, fence, i = readme.read_text().splitlines(), None, 0
        while i < len(lines):
            line, where = lines[i], f"{readme.relative_to(project_root())}:{i + 1}"
            if line.lstrip().startswith("```"):
                fence = None if fence is not None else line.strip().removeprefix("```")
            elif fence in ("", "bash", "sh", "shell"):
                while line.rstrip().endswith("\\") and i + 1 < len(lines):
                    i += 1
                    line = line.rstrip()[:-1] + " " + lines[i].strip()
                if CMD.search(line):
                    found += [Command(where, c, pasted=True) for c in _segments(line, comments=True)]
            elif fence is None:
                for span in re.findall(r"`([^`]*)`", line):
                    if CMD.search(span):
                        found += [Command(where, c, pasted=False) for c in _segments(span, comments=False)]
            i += 1
    return found


def _parses(command: Command) -> bool:
    """Whether the CLI's parser accepts ``command`` as it is (a complete command, not a mention of a verb)."""
    argv = list(command.tokens[1:])
    argv = argv[: argv.index("--")] if "--" in argv else argv
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        try:
            build_parser().parse_args(argv)
        except SystemExit as e:
            return e.code == 0
    return True


ALL = commands()
RUNNABLE = [
    c
    for c in ALL
    if len(c.tokens) > 1
    and c.tokens[1] in RUNS_HERE
    and not c.placeholders
    and "--test-only" not in c.tokens
    and not any(name in c.text for name in NOT_RUN)
    and _parses(c)
]


def _sample(tokens: tuple[str, ...]) -> list[str]:
    """``tokens`` with a value a reader could give for each placeholder (`[--now]` -> `--now`, `a|b` -> `a`)."""
    out = []
    for token in tokens:
        if token == "...":
            continue
        token = token.strip("[]").split("|")[0]  # `[--format overrides]`: two tokens, one bracket each
        parts = re.split(r"([=:,])", token)
        out.append("".join("1" if PLACEHOLDER.fullmatch(p) else p for p in parts))
    return out


def _subparser(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[argparse.ArgumentParser, list[str]]:
    """The (sub-)sub-command parser ``argv`` names, and the arguments left for it."""
    while argv:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs or argv[0] not in subs[0].choices:
            break
        parser, argv = subs[0].choices[argv[0]], argv[1:]
    return parser, argv


def test_the_readmes_name_the_commands():
    verbs = {c.tokens[1] for c in ALL if len(c.tokens) > 1}
    assert len(ALL) >= 60 and {"render", "submit", "status", "logs", "cancel", "doctor", "metrics"} <= verbs, verbs
    assert len(RUNNABLE) >= 5, RUNNABLE


@pytest.mark.parametrize("command", ALL, ids=lambda c: f"{c.where}:{c.text[:60]}")
def test_every_verb_and_flag_is_the_clis(command: Command):
    argv = _sample(command.tokens[1:])
    argv = argv[: argv.index("--")] if "--" in argv else argv  # after `--`: the program's own arguments
    if not argv:
        return  # `cookbook` alone, in prose
    parser, rest = _subparser(build_parser(), argv)
    assert parser.prog != "cookbook", f"{command.where}: no such command: {command.text}"
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    known = set(parser._option_string_actions)  # `cookbook data ... --submit`: a flag of one of its verbs
    known |= {o for a in subs for p in a.choices.values() for o in p._option_string_actions}
    unknown = [t for t in rest if t.startswith("-") and t.split("=")[0] not in known]
    assert not unknown, f"{command.where}: `{command.text}`: {parser.prog} has no {unknown}"


@pytest.mark.parametrize("command", [c for c in ALL if c.pasted], ids=lambda c: f"{c.where}:{c.text[:60]}")
def test_every_line_of_a_code_block_parses_whole(command: Command):
    """A code block's line is pasted: its required arguments are all there, and it is no pipeline of verbs."""
    assert "|" not in command.tokens, f"{command.where}: a shell pipeline if pasted: {command.text}"
    argv = _sample(command.tokens[1:])
    argv = argv[: argv.index("--")] if "--" in argv else argv
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            build_parser().parse_args(argv)
        except SystemExit as e:
            assert e.code == 0, f"{command.where}: `{command.text}`: {err.getvalue().strip()}"


def _reader_files(folder: Path) -> None:
    """What the README's commands read that a reader writes: their program, their YAML, the README's own
    profile ``mysite`` (its YAML block, as the project's ``./cookbook-profiles.yaml``)."""
    from cookbook.recipes.torchtune import _torchtune_root

    for name, text in READER_FILES.items():
        path = folder / name
        if text is None:
            path.write_text((_torchtune_root() / "configs" / "llama3_1" / "8B_full.yaml").read_text())
        else:
            path.write_text(text)
    profile = READMES[0].read_text().split("```yaml\n", 1)[1].split("```", 1)[0]
    (folder / "cookbook-profiles.yaml").write_text(profile)


@pytest.mark.parametrize("command", RUNNABLE, ids=lambda c: f"{c.where}:{c.text[:60]}")
def test_the_commands_that_need_no_cluster_run_as_pasted(command: Command, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))  # no profile of this machine's user
    _reader_files(tmp_path)
    try:
        code = main(list(command.tokens[1:]))
    except SystemExit as e:  # --help
        code = int(e.code or 0)
    captured = capsys.readouterr()
    assert code == EXIT.get(command.text, 0), f"{command.where}: `{command.text}` -> {code}: {captured.err}"
    if code == 2:
        assert "training.local_batch_size" in captured.err, captured.err  # what the README says it suggests


def test_argparse_is_what_main_parses():
    """The parse above is main's own: a flag it does not know exits 2 from main too."""
    assert isinstance(build_parser(), argparse.ArgumentParser)
    with pytest.raises(SystemExit) as e:
        main(["render", "llama3_8b_c4", "--no-such-flag", "-o", "x"])
    assert e.value.code == 2

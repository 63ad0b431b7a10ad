"""Shell text the cookbook writes: quoting, and the Jinja templates under ``templates/``.

Every shell fragment lives in a template (the sbatch script, its tracker block, the doctor's probe job,
the rehearsal's launcher stand-in); Python only fills in values, each shell-quoted by the ``q``/``arg``
filters. No cookbook imports: recipes, render, doctor and rehearsal all use it.
"""

from __future__ import annotations

import functools
import re
import shlex
from pathlib import Path

import jinja2
from jinja2.runtime import Context

_TEMPLATES = Path(__file__).parent / "templates"
# The second line of every job script job.sbatch.j2 renders: ``# RECIPE (FRAMEWORK), profile PROFILE: ...``.
_SCRIPT_HEADER = re.compile(r"^# (?P<recipe>\S+) \((?P<framework>[\w-]+)\), profile (?P<profile>[\w.-]+):", re.M)


def script_header(text: str) -> tuple[str, str] | None:
    """(recipe, profile) from a rendered job script's header (its first lines suffice); None for another script."""
    m = _SCRIPT_HEADER.search(text)
    return (m["recipe"], m["profile"]) if m else None


def quote(value: object) -> str:
    """Shell-quote one value; nothing in it expands."""
    return shlex.quote(str(value))


def quote_with_vars(value: object, names: tuple[str, ...] | list[str]) -> str:
    """Shell-quote ``value`` except the references ``$NAME`` to the given variables, which expand."""
    text = str(value)
    if not names:
        return quote(text)
    pattern = re.compile(
        r"\$(?:\{("
        + "|".join(map(re.escape, names))
        + r")\}|("
        + "|".join(map(re.escape, names))
        + r")(?![A-Za-z0-9_]))"
    )
    parts, pos = [], 0
    for m in pattern.finditer(text):
        if m.start() > pos:
            parts.append(quote(text[pos : m.start()]))
        parts.append('"${%s}"' % (m.group(1) or m.group(2)))
        pos = m.end()
    if pos < len(text) or not parts:
        parts.append(quote(text[pos:]))
    return "".join(parts)


@jinja2.pass_context
def _arg(context: Context, value: object) -> str:
    return quote_with_vars(value, context.get("shell_names", ()))


@functools.cache
def template_env() -> jinja2.Environment:
    """The Jinja environment of every shell file the cookbook writes (``templates/``), built once (its
    templates compile once per process): filter ``q`` quotes a value, ``arg`` quotes it except references to
    the variables named in the render's ``shell_names``."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(_TEMPLATES),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["q"] = quote
    env.filters["arg"] = _arg
    return env


def render_template(name: str, **context: object) -> str:
    """``templates/<name>`` rendered with ``context`` (plain files come back as they are)."""
    return template_env().get_template(name).render(**context)

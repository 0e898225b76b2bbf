"""A griffe extension for the API reference (mkdocs.yml): our numpydoc docstrings as Markdown.

The docstrings are written for numpydoc and pytest's doctests, in reStructuredText; the
reference renders them as Markdown. Before a docstring is parsed, three reST forms become
their Markdown equivalents; the docstrings themselves stay as they are:

- a doctest block (from a ``>>>`` line to the next blank line) becomes a fenced ``pycon``
  block, or, when it follows a section such as ``Parameters``, the start of an ``Examples``
  section (numpydoc allows no free text after a section, and the numpy parser renders an
  ``Examples`` section as code). Without this, the output lines would read as links;
- a Sphinx role (``:class:`~pulsar_nack.testing.PulsarStandalone```, ``:meth:`stop```) becomes
  a link to the object where the reference shows it, resolved as Python would from the
  docstring's scope, and plain code where it does not (private modules, the standard library);
- a literal-block marker (``text::``) becomes ``text:`` (the indented block after it is
  already code in Markdown).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import griffe

_SECTION_RULE = re.compile(r"^-{3,}$")
_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|data|attr|exc|obj|const):`(~?)(?:([^`<]+?)\s*<([\w.]+)>|([\w.]+)(\(\))?)`")
_LITERAL_MARKER = re.compile(r"(\S)::$|^\s*::$")


def doctests_as_code(text: str) -> str:
    """*text*, a cleaned docstring, with its doctest blocks marked as code. O(lines).

    A block in the description is fenced (```` ```pycon ```` before it, ```` ``` ```` after it,
    at its indentation); a block at the margin after a section gets an ``Examples`` header,
    and what follows it belongs to that section. Blocks in an ``Examples`` section are left
    alone.
    """
    lines = text.split("\n")
    out: list[str] = []
    section = ""
    i = 0
    while i < len(lines):
        line = lines[i]
        if i + 1 < len(lines) and line.strip() and _SECTION_RULE.match(lines[i + 1]):
            section = line.strip()
        if not line.lstrip().startswith(">>>") or section == "Examples":
            out.append(line)
            i += 1
            continue
        end = i
        while end < len(lines) and lines[end].strip():
            end += 1
        indent = line[: len(line) - len(line.lstrip())]
        if section and not indent:
            out += ["Examples", "--------", *lines[i:end]]
            section = "Examples"
        else:
            out += [f"{indent}```pycon", *lines[i:end], f"{indent}```"]
        i = end
    return "\n".join(out)


def roles_as_links(text: str, resolve: Callable[[str], str | None]) -> str:
    """*text* with each Sphinx role replaced by an optional cross-reference. O(len(text)).

    *resolve* maps the role's target to the identifier the reference registers (None: leave
    it as written). An optional reference renders as plain code, without a warning, where
    nothing of that identifier is shown.
    """

    def link(match: re.Match[str]) -> str:
        short, title, target = match.group(1), match.group(2), match.group(3) or match.group(4)
        if title is None:
            title = (target.rsplit(".", 1)[-1] if short else target) + (match.group(5) or "")
        title = " ".join(title.split())
        return f'<autoref identifier="{resolve(target) or target}" optional><code>{title}</code></autoref>'

    return _ROLE.sub(link, text)


def literal_markers_as_colons(text: str) -> str:
    """*text* with reST's ``text::`` as ``text:`` and a lone ``::`` line dropped. O(lines)."""
    lines = [_LITERAL_MARKER.sub(lambda m: f"{m.group(1)}:" if m.group(1) else "", line) for line in text.split("\n")]
    return "\n".join(lines)


def _objects(obj: Any) -> Iterator[Any]:
    """*obj* and every object defined under it (not the names it imports)."""
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from _objects(member)


def _path(scope: Any, name: str, package: str) -> str:
    """Where *name*, written in *scope*'s docstring, points: a full path, a member (inherited
    ones included) of an enclosing class, or a name Python would find from *scope*."""
    if name.startswith(f"{package}."):
        return name
    head, _, rest = name.partition(".")
    tail = f".{rest}" if rest else ""
    for enclosing in (scope, scope.parent):
        if enclosing is not None and enclosing.is_class and head in enclosing.all_members:
            return f"{enclosing.all_members[head].path}{tail}"
    return f"{scope.resolve(head)}{tail}"


class NumpydocAsMarkdown(griffe.Extension):
    """Rewrite the docstrings of a loaded package with the three functions above."""

    def on_package(self, *, pkg: Any, **kwargs: Any) -> None:
        for obj in _objects(pkg):
            if obj.docstring is None:
                continue

            def resolve(name: str, scope: Any = obj) -> str | None:
                try:
                    return str(scope.modules_collection[_path(scope, name, pkg.name)].canonical_path)
                except (griffe.NameResolutionError, KeyError, griffe.AliasResolutionError, griffe.CyclicAliasError):
                    return None

            text = doctests_as_code(obj.docstring.value)
            obj.docstring.value = literal_markers_as_colons(roles_as_links(text, resolve))

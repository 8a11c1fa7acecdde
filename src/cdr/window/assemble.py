"""The final document from the windows' texts.

Windows write the remaining sections in order, so a section begun in one window may continue
in the next under the same heading. The assembled document merges those continuations: each
`## heading` appears once, sections follow the outline's order, and any other headings keep
the order in which they first appeared.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

_H2 = re.compile(r"^##\s+(.+?)\s*#*\s*$", re.MULTILINE)


def split_sections(text: str) -> list[tuple[str | None, str]]:
    """(heading or None for text before the first `## `, body) in order."""
    out: list[tuple[str | None, str]] = []
    matches = list(_H2.finditer(text))
    lead = text[: matches[0].start()] if matches else text
    if lead.strip():
        out.append((None, lead.strip()))
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
        out.append((m.group(1).strip(), text[m.end():end].strip()))
    return out


def assemble_document(task: str, outputs: Sequence[str], outline: Sequence[str] = ()) -> str:
    """`# task`, then each section once, its bodies from all windows in window order."""
    bodies: dict[str | None, list[str]] = {}
    for text in outputs:
        for heading, body in split_sections(text):
            key = heading.lower() if heading else None
            bodies.setdefault(key, [])
            if body:
                bodies[key].append(body)
    titles = {h.lower(): h for h in outline}
    for text in outputs:
        for heading, _ in split_sections(text):
            if heading:
                titles.setdefault(heading.lower(), heading)
    order = [h.lower() for h in outline if h.lower() in bodies]
    order += [k for k in bodies if k is not None and k not in order]
    parts = [f"# {task.strip()}"]
    if bodies.get(None):
        parts.append("\n\n".join(bodies[None]))
    for key in order:
        if bodies[key]:
            parts.append(f"## {titles[key]}\n\n" + "\n\n".join(bodies[key]))
    return "\n\n".join(parts) + "\n"

"""What a rule of the registry declares (`cdr.rules`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Rule:
    """One opt-in rule of the session.

    `choices[0]` is the spec's behaviour. `profiles` maps a profile name to the choice it
    takes (absent: the spec's). `ranked_on_shards` holds the choices under which the index's
    shards can rank a window themselves (`cdr.window.loop`'s shard fast path): a rule that
    changes relevance, scores or the pool with data the shards do not hold names only its
    spec choice. `why` records how each profile's choice was made."""

    name: str
    choices: tuple[str, ...]
    meaning: str
    module: str
    profiles: Mapping[str, str] = field(default_factory=dict)
    ranked_on_shards: frozenset[str] = frozenset()
    why: str = ""

    def __post_init__(self) -> None:
        if len(self.choices) < 2 or len(set(self.choices)) != len(self.choices):
            raise ValueError(f"rule {self.name!r}: at least two distinct choices")
        bad = {p: c for p, c in self.profiles.items() if c not in self.choices}
        if bad:
            raise ValueError(f"rule {self.name!r}: profile choices not among its own: {bad}")
        if not self.ranked_on_shards <= set(self.choices):
            raise ValueError(f"rule {self.name!r}: ranked_on_shards names unknown choices")

    @property
    def spec(self) -> str:
        return self.choices[0]

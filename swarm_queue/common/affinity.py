"""A prompt's affinity: the prefix an engine should already hold when it is asked, named so that
prompts sharing a long leading part carry one key, and the fleet sends them to the endpoint
that computed it (see :mod:`common.store.affinity`). vLLM computes a prefix once per engine
while its blocks stay cached; prompts of one document spread over a whole fleet compute it
once on every engine.

A prompt's text (a conversation: its messages, as JSON) is cut into levels of leading blocks
(16, 32, 64... blocks of :data:`BLOCK_CHARS` characters, about 16 tokens each, as the engines'
caches count them), each named by a digest of everything up to its end. Its key is the digest
of the deepest level it shares with another prompt seen by the producer (the same chunk, one
before it, or the chunk after it, which the producer reads before it queues this one) that covers
at least half the prompt: a shared document, not a short system
prompt every prompt begins with (every engine holds that once anyway). A key shared by more
than :data:`MAX_GROUP` prompts is split into groups of that many, so one endpoint is never
handed a whole job.

Which endpoint a key goes to is decided once, by whichever worker reads its first prompt: the
live endpoint serving its job that holds the fewest of the job's keys (``route.lua``), so every
engine gets its share of the documents; a key whose endpoint has left goes to another the
same way.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from typing import NamedTuple

__all__ = ["BLOCK_CHARS", "LEVELS", "MAX_GROUP", "Affinities", "Levels", "levels"]

# About 16 tokens of text (4 characters a token): vLLM's default block.
BLOCK_CHARS = 64
# The leading blocks a key may name: 1,024 to 32,768 characters (about 256 to 8,192 tokens).
LEVELS = (16, 32, 64, 128, 256, 512)
# The most prompts one key sends to one endpoint: larger groups are split.
MAX_GROUP = 128
# The digests remembered from earlier chunks (least recently seen forgotten first).
REMEMBERED = 200_000


class Levels(NamedTuple):
    """A text's length, and the digests of its leading levels (those it reaches whole: with
    none, it can carry no key)."""

    chars: int
    digests: list[bytes]


def levels(text: str) -> Levels:
    """``text``'s :class:`Levels`."""
    digest = hashlib.blake2b(digest_size=12)
    out: list[bytes] = []
    done = 0
    for level in LEVELS:
        end = level * BLOCK_CHARS
        if len(text) < end:
            break
        digest.update(text[done:end].encode())
        done = end
        out.append(digest.copy().digest())
    return Levels(len(text), out)


class Affinities:
    """One producer's keys, chunk by chunk, in input order (a resumed producer gives the
    prompts it skips to :meth:`keys` too, so the keys of the rest are the same)."""

    def __init__(self, remembered: int = REMEMBERED) -> None:
        self._seen: OrderedDict[bytes, int] = OrderedDict()  # digest -> prompts seen with it
        self._remembered = remembered

    def keys(self, texts: Sequence[str], ahead: Sequence[str] = ()) -> list[str]:
        """Each text's key ("" for none), given every text before them and the texts ``ahead``
        of them (the next chunk's: a prompt whose siblings all come later still finds one)."""
        return self.keys_of([levels(t) for t in texts], [levels(t) for t in ahead])

    def keys_of(self, texts: Sequence[Levels], ahead: Sequence[Levels] = ()) -> list[str]:
        """:meth:`keys` of texts by their :func:`levels` (a text's computed once, though it is
        read as the chunk ahead of one chunk, then as its own)."""
        chunk: dict[bytes, int] = {}
        for _, digests in [*texts, *ahead]:
            for d in digests:
                chunk[d] = chunk.get(d, 0) + 1
        out: list[str] = []
        members: dict[bytes, int] = {}  # prompts given each key so far, earlier chunks' too
        for chars, digests in texts:
            key = ""
            for depth in range(len(digests) - 1, -1, -1):
                d = digests[depth]
                if chunk[d] + self._seen.get(d, 0) < 2:
                    continue
                if 2 * LEVELS[depth] * BLOCK_CHARS >= chars:
                    group = members[d] = members.get(d, self._seen.get(d, 0)) + 1
                    key = f"{d.hex()}.{(group - 1) // MAX_GROUP}"
                break
            out.append(key)
        for _, digests in texts:
            for d in digests:
                self._seen[d] = self._seen.get(d, 0) + 1
                self._seen.move_to_end(d)
        while len(self._seen) > self._remembered:
            self._seen.popitem(last=False)
        return out

"""The simulator's automatic prefix caching, as vLLM's: a prompt is cut into blocks of
``BLOCK_CHARS`` characters (16 of the simulator's tokens), each block named by a digest of
everything up to its end; the leading blocks an engine still holds are a hit, and their
prefill costs nothing. Blocks are kept least-recently-used first out, up to a cap. The
counters are vLLM's ``prefix_cache_queries`` and ``prefix_cache_hits`` (in tokens)."""

from __future__ import annotations

import hashlib
from collections import OrderedDict

from swarm_queue.sim.text import count_tokens

__all__ = ["BLOCK_CHARS", "PrefixCache"]

# 16 tokens of the simulator's tokenizer (4 characters a token), vLLM's default block size.
BLOCK_CHARS = 64


class PrefixCache:
    """One engine's cached prompt blocks, ``capacity`` blocks at most."""

    def __init__(self, capacity: int = 16_384) -> None:
        self.capacity = capacity
        self._blocks: OrderedDict[bytes, None] = OrderedDict()
        self.queries = 0  # prompt tokens looked up
        self.hits = 0  # of them, found cached

    def lookup(self, prompt: str) -> int:
        """The tokens of ``prompt`` to prefill (those not cached), counting the lookup, and
        keep its blocks as the most recently used."""
        digest = hashlib.blake2b(digest_size=16)
        hit_chars, leading = 0, True
        for start in range(0, len(prompt) - len(prompt) % BLOCK_CHARS, BLOCK_CHARS):
            digest.update(prompt[start : start + BLOCK_CHARS].encode())
            key = digest.copy().digest()
            if leading and key in self._blocks:
                hit_chars += BLOCK_CHARS
                self._blocks.move_to_end(key)
            else:
                leading = False
                self._blocks[key] = None
                if len(self._blocks) > self.capacity:
                    self._blocks.popitem(last=False)
        tokens = count_tokens(prompt)
        hit = min(tokens, hit_chars // 4)
        self.queries += tokens
        self.hits += hit
        return tokens - hit

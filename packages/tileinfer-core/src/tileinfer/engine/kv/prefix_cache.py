"""Prefix caching: full pages named by everything before their end, shared between sequences.

A full page of a sequence holds the keys and values of ``page_size`` positions, and those depend
on every token up to the page's end. So a page is named by a chained key: page i's key is
``(hash of page i - 1's key, the page's token ids)`` (page 0's parent is ``ROOT``). Two sequences
whose first k pages hold the same tokens get the same k keys, and the second can take the first's
pages instead of computing them. The keys are the dict keys themselves (a tuple of the parent's
hash and the page's ids), so a hit compares the page's ids exactly; only the parent is compared
by its 64-bit hash.

The pages live in the cache's ``PageAllocator``: a published page is reference-counted like any
other; once no sequence holds it, it stays cached (its keys and values untouched) until the pool
needs the page, least recently released first.

Only full pages are published, and a prefix match always leaves at least one token of the
request to run (its logits give the next token), so a sequence never writes into a page that
another sequence may read.
"""

from __future__ import annotations

from .cache import PagedKVCache, Sequence

ROOT = 0  # the parent hash of a sequence's first page


def page_key(parent_key, tokens) -> tuple:
    """The key of a full page holding ``tokens`` after the page whose key is parent_key."""
    return (ROOT if parent_key is None else hash(parent_key), tuple(tokens))


def page_keys(tokens, page_size: int, start_key=None, start_page: int = 0) -> list[tuple]:
    """Chained keys of the full pages of tokens from page ``start_page`` on; start_key: the key
    of the page before it (None for page 0)."""
    keys, parent = [], start_key
    for i in range(start_page, len(tokens) // page_size):
        parent = page_key(parent, tokens[i * page_size:(i + 1) * page_size])
        keys.append(parent)
    return keys


class PrefixCache:
    """Finds cached prefixes for new sequences and publishes the full pages of running ones.

    The per-sequence state is a list of the keys of its published-or-checked full pages
    (``keys``), kept by the caller beside the sequence.
    """

    def __init__(self, cache: PagedKVCache):
        self.cache = cache
        self.hit_tokens = 0  # prompt tokens taken from the cache instead of computed
        self.queried_tokens = 0  # prompt tokens looked up (hit or not)

    def attach(self, seq: Sequence, tokens: list[int]) -> list[tuple]:
        """Give the empty seq the longest cached prefix of tokens, whole pages only and leaving
        at least one token to run; takes a reference to each page. Returns the keys of the
        pages taken (the sequence's key list from now on)."""
        if seq.pages or seq.tokens:
            raise ValueError("a prefix is attached to an empty sequence only")
        ps = self.cache.page_size
        usable = (len(tokens) - 1) // ps
        alloc, keys, pages = self.cache.allocator, [], []
        parent = None
        for i in range(usable):
            key = page_key(parent, tokens[i * ps:(i + 1) * ps])
            page = alloc.lookup(key)
            if page is None:
                break
            keys.append(key)
            pages.append(page)
            parent = key
        alloc.share(pages)
        seq.pages.extend(pages)
        seq.tokens.extend(tokens[:len(pages) * ps])
        self.queried_tokens += len(tokens)
        self.hit_tokens += len(pages) * ps
        return keys

    def cached_pages_of(self, tokens: list[int]) -> tuple[int, int]:
        """(pages attach would take, how many of them are unreferenced now): what admitting a
        sequence of these tokens costs the free pool. Changes nothing."""
        ps, alloc = self.cache.page_size, self.cache.allocator
        parent, found, idle = None, 0, 0
        for i in range((len(tokens) - 1) // ps):
            parent = page_key(parent, tokens[i * ps:(i + 1) * ps])
            page = alloc.lookup(parent)
            if page is None:
                break
            found += 1
            idle += alloc.refcount(page) == 0
        return found, idle

    def publish(self, seq: Sequence, keys: list[tuple]):
        """Publish the full pages of seq not yet in keys (appending their keys to it). A page
        whose key already names another page stays private to seq."""
        ps, alloc = self.cache.page_size, self.cache.allocator
        start = len(keys)
        new = page_keys(seq.tokens, ps, keys[-1] if keys else None, start)
        for i, key in enumerate(new, start):
            alloc.publish(seq.pages[i], key)
        keys.extend(new)

"""Link expansion for two-hop questions: follow the titles that the best passages mention.

"PISCES was developed by the company headquartered in what city?" names the first hop only. The second
paragraph, the company's, shares almost no words with the question, so neither the embedder nor BM25 ranks it
high. The first paragraph names the company, though, and in an encyclopedic corpus that name is the title of the
second. `LinkedRetriever` keeps the base retriever's best `seeds` passages, adds the passages whose title those
seeds mention (one passage per named document, best-ranked first), then fills up with the base ranking.
Following links from retrieved paragraphs is how multi-hop retrievers over Wikipedia work (Asai et al., 2020,
"Learning to Retrieve Reasoning Paths over Wikipedia Graph for Question Answering"); a title mention stands in for
the hyperlink here, so this helps corpora of titled documents and changes nothing where no passage's title is
mentioned.

A mention is a whole-word match of a title's words (punctuation and case ignored) that starts with a capital or a
digit, as names do, found by looking up the seed's word n-grams in a title table: linear in the seed's length,
whatever the corpus size.

Why it is the default: it puts more gold paragraphs in the top 5 (docs/results/answer-path/README.md).
"""

from __future__ import annotations

import re
from dataclasses import replace

from midlens.core.defaults import DEFAULT_TOP_K
from midlens.core.passage import Passage
from midlens.retrievers.base import RankingRetriever
from midlens.retrievers.dense import checked_top_k

# Passages whose mentions are followed: the first hop is nearly always among the top 2 (docs/results/answer-path).
SEEDS = 2
RANK_DEPTH = 1000  # how far down the base ranking a linked passage's rank and score are read
MIN_TITLE_CHARS = 4  # shorter titles ("US", "He") are mentioned everywhere without meaning a link
_WORD = re.compile(r"\w+")


def words(text: str) -> tuple[str, ...]:
    return tuple(w.lower() for w in _WORD.findall(text))


class LinkedRetriever:
    """Wraps a retriever that can rank (`ranked(query, k)` and `passages`: DenseRetriever, HybridRetriever). Same
    interface as the base; a passage added by a link carries `metadata["linked_from"]`, the title that named it."""

    def __init__(self, base: RankingRetriever, seeds: int = SEEDS):
        self.base = base
        self.seeds = seeds
        self.meta = {**base.meta, "retrieval": f"{base.meta.get('retrieval', 'dense')}+links", "link_seeds": seeds}
        self._by_title: dict[tuple[str, ...], list[int]] = {}
        for i, p in enumerate(self.passages):
            key = words(p.title)
            if key and len(p.title) >= MIN_TITLE_CHARS:
                self._by_title.setdefault(key, []).append(i)
        self._longest = max((len(k) for k in self._by_title), default=0)

    @property
    def passages(self) -> list[Passage]:
        return self.base.passages

    def __len__(self) -> int:
        return len(self.base)

    def mentioned(self, text: str) -> list[tuple[str, ...]]:
        """Titles (as word tuples) that `text` mentions, in reading order, each once. The longest title wins at a
        position and is read whole: "Wings of Desire" is one mention, not also one of "Desire"."""
        raw = _WORD.findall(text)
        tokens, found, seen, start = tuple(w.lower() for w in raw), [], set(), 0
        while start < len(tokens):
            n = 0 if raw[start][0].islower() else self._match(tokens, start)
            # A link is a name: "research" in running text does not point to the article "Research"; and a name is
            # read whole, so "Creation Research Society" does not also mention "Research".
            if n and tokens[start : start + n] not in seen:
                seen.add(tokens[start : start + n])
                found.append(tokens[start : start + n])
            start += max(n, 1)
        return found

    def _match(self, tokens: tuple[str, ...], start: int) -> int:
        """Length of the longest title starting at `start`, 0 if none."""
        for n in range(min(self._longest, len(tokens) - start), 0, -1):
            if tokens[start : start + n] in self._by_title:
                return n
        return 0

    def search(self, query: str, top_k: int = DEFAULT_TOP_K) -> list[Passage]:
        """The base's best `seeds` passages (fewer when top_k leaves no room for a link), then the passages they
        name (by the base's rank), then the rest of the base ranking, `top_k` in all."""
        k = checked_top_k(query, top_k, len(self))
        ranking = self.base.ranked(query, min(len(self), max(RANK_DEPTH, k)))
        rank = {i: r for r, (i, _) in enumerate(ranking)}
        score = dict(ranking)
        # At top_k <= seeds no room would be left for a link: keep one slot free (top_k = 2: one seed, one link).
        seeds = [i for i, _ in ranking[: min(self.seeds, max(1, k - 1))]]
        seed_titles = {words(self.passages[i].title) for i in seeds}
        linked: dict[int, str] = {}
        for i in seeds:
            for key in self.mentioned(self.passages[i].text):
                if key in seed_titles:
                    continue  # a paragraph names its own subject; that is not a hop
                # One passage per named document, its best-ranked chunk: a long document must not fill the prompt.
                best = min(self._by_title[key], key=lambda j: rank.get(j, len(ranking)))
                linked.setdefault(best, self.passages[i].title)
        # No seed is in `linked`: a seed's own title is skipped above, and only passages of other titles are added.
        following = sorted(linked, key=lambda j: rank.get(j, len(ranking)))
        chosen = seeds + following + [i for i, _ in ranking if i not in linked and i not in seeds]
        out = []
        for i in chosen[:k]:
            p = replace(self.passages[i], score=score.get(i))
            if i in linked:
                p = replace(p, metadata={**p.metadata, "linked_from": linked[i]})
            out.append(p)
        return out

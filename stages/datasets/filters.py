"""SFT data filters: exact duplicates, near-duplicates (MinHash LSH), and decontamination against eval prompts.

Text normalization, shared by all three: lower case, and a token is a run of word characters or one symbol
(`+`, `-`, `\\`, `{` ...); whitespace and sentence punctuation (. , ; : ! ? quotes, brackets) are dropped. So
"Compute 3+4-2." and "compute 3 + 4 - 2" are one text, while "3+4" and "3-4" stay different.

Decontamination (the usual n-gram overlap, n = 13 by default): a training prompt is contaminated when it shares
any n-token window of an eval prompt's own content. A window that two or more eval prompts share is their
template (an instruction every item of a loader appends, which training prompts of the same loader carry too), so
it is not compared, and neither is any window overlapping one (a question's last words + the instruction's
first); a question with no content window left counts whole, as a short prompt does. (An eval set of one templated
prompt keeps its template: nothing shows it is one.) An eval prompt shorter than n tokens has no n-gram, so it counts
whole:
a training prompt that contains its full token sequence (contiguously) is contaminated. This is what makes the
check meaningful for the tiny synthetic prompts (5-15 tokens): with n = 13 most of them match only as a whole.
Eval prompts: every recipe domain's held-out split (what `evaluate` scores) and the benchmark files the stage
names. Only prompts are compared: answers of a contaminated prompt are irrelevant.

Near-duplicates: MinHash (datasketch) over `shingle`-token shingles of prompt + response, LSH at `threshold`
estimated Jaccard; the first row of a near-duplicate cluster is kept. The LSH index grows with the kept rows:
it is the one piece of state of the build that is not bounded by a shard.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable

TOKEN = re.compile(r"\w+|[^\w\s.,;:!?'\"()\[\]]")


def normalized_tokens(text: str) -> list[str]:
    return TOKEN.findall(text.lower())


def row_fingerprint(prompt: str, response: str) -> bytes:
    """Exact-duplicate key: 16 bytes of blake2b over the normalized prompt and response."""
    blob = " ".join(normalized_tokens(prompt)) + "\x00" + " ".join(normalized_tokens(response))
    return hashlib.blake2b(blob.encode(), digest_size=16).digest()


class ExactDedup:
    def __init__(self) -> None:
        self.seen: set[bytes] = set()

    def is_duplicate(self, prompt: str, response: str) -> bool:
        """True if seen before; otherwise remembers the row."""
        key = row_fingerprint(prompt, response)
        if key in self.seen:
            return True
        self.seen.add(key)
        return False


class NearDedup:
    """MinHash LSH: a row is a near-duplicate when the index already holds one at >= threshold Jaccard."""

    def __init__(self, threshold: float, num_perm: int, shingle: int):
        from datasketch import MinHash, MinHashLSH

        self.empty = MinHash(num_perm=num_perm, seed=1)  # copies share its permutations: no regeneration per row
        self.lsh = MinHashLSH(threshold=threshold, num_perm=num_perm)
        self.shingle = shingle
        self.size = 0

    def is_duplicate(self, prompt: str, response: str) -> bool:
        """True if near a kept row; otherwise adds this row to the index."""
        tokens = normalized_tokens(prompt) + ["\x00"] + normalized_tokens(response)
        k = min(self.shingle, len(tokens))
        shingles = {" ".join(tokens[i : i + k]).encode() for i in range(len(tokens) - k + 1)}
        m = self.empty.copy()
        m.update_batch(list(shingles))
        if self.lsh.query(m):
            return True
        self.lsh.insert(str(self.size), m)
        self.size += 1
        return False


class ContaminationIndex:
    """n-grams of the eval prompts, the whole token sequence of eval prompts shorter than n, and the content of
    templated eval prompts whose own words are fewer than n.

    An n-gram that two or more eval prompts share is their loader's template, not any item's content. A templated
    prompt is matched by its content, the tokens outside template n-grams: by its own n-grams when it has some,
    else by equality with a train prompt's content under the same template. (Matching such a few-token content as
    a substring of any train prompt would drop every prompt that shares one number with an eval item.)"""

    def __init__(self, eval_prompts: Iterable[str], n: int):
        self.n = n
        self.short: dict[int, set[int]] = {}  # length -> hashes of whole eval prompts of that length
        self.ngrams: set[int] = set()
        self.contents: set[int] = set()  # hashes of templated eval prompts' contents shorter than n
        long_prompts = []
        self.prompts = 0
        for prompt in eval_prompts:
            self.prompts += 1
            tokens = normalized_tokens(prompt)
            if len(tokens) >= n:
                long_prompts.append(tokens)
            elif tokens:
                self.short.setdefault(len(tokens), set()).add(hash(tuple(tokens)))
        self.template = self._template_ngrams(long_prompts)
        self.template_ngrams = len(self.template)
        for tokens in long_prompts:
            content, grams = self._content(tokens)
            if grams:
                self.ngrams.update(grams)
            else:  # a question shorter than n beside its template
                self.contents.add(hash(tuple(content)))

    def _content(self, tokens: list[str]) -> tuple[list[str], list[int]]:
        """(the tokens outside template n-grams, the n-grams that hold none of the template's tokens)"""
        n = self.n
        grams = self._windows(tokens)
        in_template = [False] * len(tokens)
        for i, gram in enumerate(grams):
            if gram in self.template:
                in_template[i : i + n] = [True] * n
        content = [t for t, templated in zip(tokens, in_template) if not templated]
        return content, [gram for i, gram in enumerate(grams) if not any(in_template[i : i + n])]

    def _windows(self, tokens: list[str]) -> list[int]:
        return [hash(tuple(tokens[i : i + self.n])) for i in range(len(tokens) - self.n + 1)]

    def _template_ngrams(self, prompts: list[list[str]]) -> set[int]:
        """n-grams found in two or more eval prompts: a template every item of their loader carries."""
        prompts_with: dict[int, int] = {}
        for tokens in prompts:
            for gram in set(self._windows(tokens)):
                prompts_with[gram] = prompts_with.get(gram, 0) + 1
        return {gram for gram, count in prompts_with.items() if count > 1}

    def is_contaminated(self, prompt: str) -> bool:
        tokens = normalized_tokens(prompt)
        windows = [(self.n, self.ngrams)] + sorted(self.short.items())
        for size, hashes in windows:
            if any(hash(tuple(tokens[i : i + size])) in hashes for i in range(len(tokens) - size + 1)):
                return True
        return bool(self.contents) and hash(tuple(self._content(tokens)[0])) in self.contents

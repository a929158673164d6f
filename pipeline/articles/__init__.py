"""News articles behind the well-reported events: fetching (``fetch``, over ``checked_get``), URL
normalisation (``urls``), outbound safety (``safety``), robots.txt (``robots``), the fetch ledger
(``ledger``), text extraction (``extract``, ``langid``) and OBELICS filtering (``obelics``)."""

from pipeline.articles.extract import extract
from pipeline.articles.obelics import filter_document

__all__ = ["extract", "filter_document"]

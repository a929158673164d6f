"""Stage 5, publishing and fetching releases: the release stores (S3 or a directory, ``store``), the
immutable upload with its manifest and index (``publish``), where each file sits in a release
(``layout``), and `mirai download` (``download``). Imports splits/ and the root's cross-cutting modules."""

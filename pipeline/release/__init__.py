"""Stage 5, publishing and fetching releases: the release stores (their interface and a directory,
``store``; S3, ``s3_store``; the one MIRAI_RELEASE_URI names, ``store_uri``), the immutable upload
with its manifest and index (``publish``) and Croissant metadata (``croissant``), where each file
sits in a release (``layout``) and the published tables' schemas (``tables``), `mirai download`
(``download``) and `mirai export hf` (``hf_export``). Imports only the root's cross-cutting
modules (splits/ imports it)."""

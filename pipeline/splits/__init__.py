"""Stage 4, a closed month's benchmark: the event and news database (``database``), the test split
with its balanced sample and leakage audit (``split``, ``schema``), the dataset card (``card``, with
``card_figures``, ``card_composition`` and ``card_format``) and MIRAI's own file layout of the same
data (``mirai_files``, written by ``mirai_export``, read by ``mirai_import``). Imports events/,
articles/, gdelt/'s ledger, reference/, agent_api/ (the audit's date gate) and the root's
cross-cutting modules."""

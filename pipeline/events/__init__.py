"""Stage 2, GDELT's typed rows to MIRAI's events: the six rules (``normalize``, with the code
tables of rules 3 to 5 as integer lookups in ``code_tables``), the daily quads (``quads``) and each
day's events, key files, history and quads files (``daily``). Imports gdelt/, reference/ and the
root's cross-cutting modules; nothing downstream."""

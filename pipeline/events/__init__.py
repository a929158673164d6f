"""Stage 2, GDELT's typed rows to MIRAI's events: the six rules (``normalize``) and each day's
events, key files, history and daily quads (``daily``). Imports gdelt/, reference/ and the root's
cross-cutting modules; nothing downstream."""

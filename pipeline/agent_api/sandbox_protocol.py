"""What both ends of the sandbox's pipes and sockets share: sandbox.py (the parent) and
sandbox_child.py (the template, its forked processes and the sandbox children). A leaf module: it
imports nothing, so neither side imports the other and the template's start-up gains no import
through it. The wire format of the reply pipe: sandbox_child.py's docstring.
"""

# The libraries MIRAI's code-block prompt offers agents (agent_prompts/prompts_react_block_full.py in
# github.com/yecchen/MIRAI: numpy, pandas, scikit-learn, NetworkX), by import name. A sandbox loads
# the ones its parent asks for and this interpreter has, before lockdown (docs/agent_api.md,
# "Code blocks"). numpy and pandas are dependencies of this project; the other two are not.
LIBRARIES = ("numpy", "pandas", "networkx", "sklearn")
MAX_OBSERVATION_CHARS = 20_000
TRUNCATION_NOTE = f"\n[output truncated at {MAX_OBSERVATION_CHARS} characters]"
# What a template sends on its control socket, and a spare on its handover socket, once its
# imports are done (sandbox_spares.SparePool).
WARM = b"warm"
# A fork request to the template and its answer (sandbox_spares._Template).
FORK, FORKED = b"fork", b"forked"
# The descriptors a fork request carries, renumbered from 0 in this order in the forked child.
SPARE_DESCRIPTORS = ("stdin", "stdout", "stderr", "handover", "status")
HANDOVER_FD, STATUS_FD = 3, 4

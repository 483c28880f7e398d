#!/usr/bin/env python3
"""Writes the starting seeds of fuzz/corpus: for each operation of
fuzz_attention.cpp, a few inputs whose first byte selects it (byte % 16), the
second the kernels' instruction set, and the rest fixed pseudo-random choices.
The committed corpus is these seeds merged (libFuzzer -merge=1) with inputs
that added coverage in longer runs; see docs/reliability.md."""

import argparse
import pathlib
import random

OPERATIONS = ["sequence_mask", "masked_softmax", "masked_softmax_b", "dot_product",
              "dot_product_module", "additive_scores", "additive_module", "heatmaps",
              "multi_head", "nadaraya_watson", "seq2seq", "encoder_decoder", "loading", "plot",
              "state_dict", "nmt_data"]
# The state-dict area reads the rest of its input as a torch.save file: its
# seeds are real ones (made by tests/fixtures/generate_state_dicts.py), after
# the operation, instruction-set and mode bytes.
STATE_DICT_FILES = ["state_additive_torch113.pt", "state_dtypes_proto4_torch211.pt"]
FIXTURES = pathlib.Path(__file__).parent.parent / "tests" / "fixtures"
# The NMT-data area reads the rest of its input as fra.txt (mode 1) or as
# fra-eng.zip (mode 2): its seeds are the head of the shipped sample and the
# sample's zip, after the operation, instruction-set, mode, num_examples,
# num_steps and min_freq bytes.
DATA = pathlib.Path(__file__).parent.parent / "tests" / "data"


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=pathlib.Path(__file__).parent / "corpus", type=pathlib.Path)
    parser.add_argument("--per-op", type=int, default=5)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for op, name in enumerate(OPERATIONS):
        if name == "state_dict":
            for k, file in enumerate(STATE_DICT_FILES):
                body = bytes([op, k % 2, k % 3]) + (FIXTURES / file).read_bytes()
                (args.out / f"seed-{name}-{k}").write_bytes(body)
            continue
        if name == "nmt_data":
            sample = (DATA / "fra-eng-sample" / "fra.txt").read_bytes()
            head = b"".join(sample.splitlines(keepends=True)[:40])
            zipped = (DATA / "fra-eng-zip" / "fra-eng.zip").read_bytes()
            for k, (mode, rest) in enumerate([(1, head), (2, zipped), (0, head)]):
                body = bytes([op, k % 2, mode, 3, 9, 2]) + rest
                (args.out / f"seed-{name}-{k}").write_bytes(body)
            continue
        for k in range(args.per_op):
            rng = random.Random(1000 * op + k)
            body = bytes([op, k % 2]) + bytes(rng.randrange(256) for _ in range(24 + 16 * k))
            (args.out / f"seed-{name}-{k}").write_bytes(body)


if __name__ == "__main__":
    main()

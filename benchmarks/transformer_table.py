#!/usr/bin/env python3
"""The Transformer's attention beside its peers, as markdown tables.

    python3 benchmarks/transformer_table.py build-torch2/bench-transformer.json [--out report.md]

Reads Google Benchmark JSON from benchmarks/bench_transformer (names
`causal/<mask>/<pass>/threads:<N>`, `mha/<impl>/<pass>/threads:<N>` and `mha_bf16/...`), takes
the median
aggregate (or the median of the iteration rows) and prints, per thread count, the medians and
the ratios measured in the same process: causal self-attention against the same kernel
unmasked (the issue's goal: at most 0.55) and against SDPA with is_causal; multi-head attention
against torch::nn::MultiheadAttention and against the book's composite ops, in float32 and in
bfloat16 (beside our float32). The machine, date
and command head the report. Standard library only.
"""

import argparse
import datetime
import json
import platform
import sys

from report_io import benchmark_rows, medians, write_report

def read(paths):
    keyed, context = [], {}
    for path in paths:
        with open(path) as f:
            context = json.load(f).get("context", context)
    for parts, row, seconds in benchmark_rows(paths):
        if len(parts) < 4 or parts[0] not in ("causal", "mha", "mha_bf16"):
            continue
        keyed.append(((parts[0], parts[1], parts[2], int(parts[3].split(":")[1])), row, seconds))
    return medians(keyed), context


def ms(s):
    return f"{s * 1e3:.2f} ms" if s is not None else "–"


def ratio(a, b):
    return f"{a / b:.2f}" if a is not None and b else "–"


def tables(medians):
    out = []
    for threads in sorted({k[3] for k in medians}):
        get = lambda group, name, p: medians.get((group, name, p, threads))
        out.append(f"\n**Causal self-attention**, (2, 2048, 2048), d 64, no weights, "
                   f"{threads} thread(s), medians:\n")
        out.append("| pass | unmasked | is_causal | book's dec_valid_lens | causal / unmasked "
                   "| SDPA unmasked | SDPA is_causal | is_causal / SDPA is_causal |")
        out.append("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for p in ("fwd", "fwd_bwd"):
            full, causal, book = (get("causal", m, p) for m in ("full", "causal", "book_lens"))
            sfull, scausal = get("causal", "sdpa_full", p), get("causal", "sdpa_causal", p)
            out.append(f"| {p} | {ms(full)} | {ms(causal)} | {ms(book)} | {ratio(causal, full)} "
                       f"| {ms(sfull)} | {ms(scausal)} | {ratio(causal, scausal)} |")
        out.append(f"\n**Multi-head self-attention** at the book's Transformer shapes (batch 64, "
                   f"10 steps, 32 hidden, 4 heads, causal), {threads} thread(s), medians:\n")
        out.append("| pass | d2l (kAuto) | d2l (book's ops) | torch::nn::MultiheadAttention "
                   "| d2l / torch::nn | d2l / book's ops |")
        out.append("| --- | --- | --- | --- | --- | --- |")
        for p in ("fwd", "fwd_bwd"):
            ours, book, torch_nn = (get("mha", m, p) for m in ("d2l", "d2l_composite", "torch_nn"))
            out.append(f"| {p} | {ms(ours)} | {ms(book)} | {ms(torch_nn)} "
                       f"| {ratio(ours, torch_nn)} | {ratio(ours, book)} |")
        if not any(k[0] == "mha_bf16" and k[3] == threads for k in medians):
            continue
        out.append(f"\n**The same in bfloat16** (modules and input converted), {threads} "
                   f"thread(s), medians:\n")
        out.append("| pass | d2l bf16 (kAuto) | d2l bf16 (book's ops) | torch::nn bf16 | d2l fp32 "
                   "| d2l bf16 / torch::nn bf16 | d2l bf16 / book's ops bf16 | d2l bf16 / d2l fp32 |")
        out.append("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for p in ("fwd", "fwd_bwd"):
            ours, book, torch_nn = (get("mha_bf16", m, p)
                                    for m in ("d2l", "d2l_composite", "torch_nn"))
            fp32 = get("mha", "d2l", p)
            out.append(f"| {p} | {ms(ours)} | {ms(book)} | {ms(torch_nn)} | {ms(fp32)} "
                       f"| {ratio(ours, torch_nn)} | {ratio(ours, book)} | {ratio(ours, fp32)} |")
    return "\n".join(out) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", nargs="+")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    medians, context = read(args.json)
    if not medians:
        sys.exit("transformer_table.py: no causal/ or mha/ rows in " + ", ".join(args.json))
    head = (f"Machine: {platform.node()}, {context.get('num_cpus', '?')} CPUs at "
            f"{context.get('mhz_per_cpu', '?')} MHz, LibTorch {context.get('torch_version', '?')}, "
            f"ISA {context.get('d2l_cpu_isa', '?')}; {datetime.date.today().isoformat()}; "
            f"`make bench-transformer`.\n")
    write_report(head + tables(medians), args.out)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""CTranslate2 beside d2l::generate on the book's (0.17) Transformer: docs/generation.md's speed
table (issue: tokens per second at least CTranslate2's, in every cell).

`make bench-generate` runs it, in a venv that sees Debian's torch (1.13) and has PyPI's
ctranslate2:

    build/ct2-venv/bin/python benchmarks/ct2_table.py \
        --generate-ids build-torch2/benchmarks/generate_ids --work build-torch2/ct2-bench

For each size (the book's: 32 hidden, 4 heads, FFN 64, 2 + 2 blocks, 200 tokens; a base size:
512 hidden, 8 heads, FFN 2048, 6 + 6 blocks, 10,000 tokens) it builds the book's model with
random weights, saves its state dict (for benchmarks/generate_ids, the library's side) and
converts it to a CTranslate2 model; checks that CTranslate2's greedy tokens equal ours on
the check sentences (and the book's own Python decoding, the book's predict_seq2seq on token ids);
then times whole processes, each side in turn, in every cell: greedy and beam 4, batch 1 and 32,
1 and 2 threads. Tokens per second count the generated tokens of the best hypotheses, <eos> left
out, over the process's wall time (`process`) and over its decoding call alone (`decode`).
With --memory it prints instead the peak RSS (VmHWM) of whole processes of both sides that
decode 1,000 and 10,000 sentences at the book's size in batches of 32 (issue: peak RSS bounded
by the batch, not the file).

The mapping (the book's module -> CTranslate2's TransformerSpec, post-norm):
- embedding.weight -> embeddings[0].weight (encoder) / embeddings.weight (decoder); the book scales
  the embeddings by sqrt(num_hiddens) before adding P, as CTranslate2's scale_embeddings does;
- the book's interleaved sinusoidal table P (sin at even, cos at odd features) -> the encoder's
  position_encodings; the decoder's is P's row 0 at every position, since the book's prediction
  feeds one token a call and so adds P[:, :1] at every step (decoder_table);
- per block, attention.W_q/W_k/W_v (bias-free) fused into self_attention.linear[0], W_o ->
  linear[1]; the decoder's attention2: W_q -> attention.linear[0], W_k and W_v fused -> linear[1],
  W_o -> linear[2];
- addnorm1/2(/3).ln -> the sub-layers' layer_norm (applied after the residual: pre_norm=False),
  epsilon 1e-5 (nn.LayerNorm's);
- ffn.dense1/dense2 -> ffn.linear_0/linear_1 (ReLU); the decoder's dense -> projection.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import numpy as np

# torch and the book's code are imported where they are used: CTranslate2's processes
# (ct2_worker) do not load them.
REFERENCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "tests",
                         "reference")

SPECIALS = ["<unk>", "<pad>", "<bos>", "<eos>"]  # d2l's Vocab puts <unk> first


def book_model(vocab, num_hiddens, num_heads, ffn_hiddens, blocks, seed):
    import torch
    sys.path.insert(0, REFERENCE)
    from d2l_transformer import TransformerDecoder, TransformerEncoder
    from d2l_book import EncoderDecoder
    torch.manual_seed(seed)
    h = num_hiddens
    encoder = TransformerEncoder(vocab, h, h, h, h, [h], h, ffn_hiddens, num_heads, blocks, 0.0)
    decoder = TransformerDecoder(vocab, h, h, h, h, [h], h, ffn_hiddens, num_heads, blocks, 0.0)
    net = EncoderDecoder(encoder, decoder)
    # Trained weights are not needed to compare decoders; larger-than-init weights make the
    # argmax decisive, so that rounding differences do not decide ties.
    with torch.no_grad():
        for p in net.parameters():
            p.mul_(3.0)
    return net.eval()


def _np(t):
    return t.detach().float().contiguous().numpy()


def _linear(spec, weight, bias=None):
    spec.weight = _np(weight)
    if bias is not None:
        spec.bias = _np(bias)


def _layer_norm(spec, ln):
    spec.gamma = _np(ln.weight)
    spec.beta = _np(ln.bias)


def _ffn(spec, ffn, addnorm):
    _linear(spec.linear_0, ffn.dense1.weight, ffn.dense1.bias)
    _linear(spec.linear_1, ffn.dense2.weight, ffn.dense2.bias)
    _layer_norm(spec.layer_norm, addnorm.ln)


def decoder_table(dec):
    """The position table of the book's decoder as its prediction uses it: one token a call, so
    `P[:, :X.shape[1]]` is row 0 at every step (the book's code; training, which feeds whole target
    sequences, adds rows 0..T-1)."""
    P = _np(dec.pos_encoding.P[0])
    return np.repeat(P[:1], P.shape[0], axis=0)


def convert(net, vocab_tokens, num_heads, out_dir):
    import torch
    from ctranslate2.specs import common_spec, transformer_spec
    enc, dec = net.encoder, net.decoder
    blocks = len(enc.blks)
    spec = transformer_spec.TransformerSpec.from_config(
        (blocks, len(dec.blks)), num_heads, pre_norm=False,
        activation=common_spec.Activation.RELU)
    spec.config.layer_norm_epsilon = 1e-5
    spec.config.decoder_start_token = "<bos>"
    spec.config.bos_token = "<bos>"
    spec.config.eos_token = "<eos>"
    spec.config.unk_token = "<unk>"
    P = _np(enc.pos_encoding.P[0])
    # Encoder.
    spec.encoder.embeddings[0].weight = _np(enc.embedding.weight)
    spec.encoder.scale_embeddings = True
    spec.encoder.position_encodings.encodings = P
    for layer, blk in zip(spec.encoder.layer, enc.blks):
        a = blk.attention
        _linear(layer.self_attention.linear[0], torch.cat([a.W_q.weight, a.W_k.weight, a.W_v.weight]))
        _linear(layer.self_attention.linear[1], a.W_o.weight)
        _layer_norm(layer.self_attention.layer_norm, blk.addnorm1.ln)
        _ffn(layer.ffn, blk.ffn, blk.addnorm2)
    # Decoder.
    spec.decoder.embeddings.weight = _np(dec.embedding.weight)
    spec.decoder.scale_embeddings = True
    spec.decoder.position_encodings.encodings = decoder_table(dec)
    for layer, blk in zip(spec.decoder.layer, dec.blks):
        a1, a2 = blk.attention1, blk.attention2
        _linear(layer.self_attention.linear[0],
                torch.cat([a1.W_q.weight, a1.W_k.weight, a1.W_v.weight]))
        _linear(layer.self_attention.linear[1], a1.W_o.weight)
        _layer_norm(layer.self_attention.layer_norm, blk.addnorm1.ln)
        _linear(layer.attention.linear[0], a2.W_q.weight)
        _linear(layer.attention.linear[1], torch.cat([a2.W_k.weight, a2.W_v.weight]))
        _linear(layer.attention.linear[2], a2.W_o.weight)
        _layer_norm(layer.attention.layer_norm, blk.addnorm2.ln)
        _ffn(layer.ffn, blk.ffn, blk.addnorm3)
    _linear(spec.decoder.projection, dec.dense.weight, dec.dense.bias)
    spec.register_source_vocabulary(vocab_tokens)
    spec.register_target_vocabulary(vocab_tokens)
    spec.validate()
    spec.optimize(quantization="float32")
    os.makedirs(out_dir, exist_ok=True)
    spec.save(out_dir)
    return out_dir


def book_greedy(net, src_ids, num_steps, bos, eos, pad):
    """The book's predict_seq2seq on token ids: <eos> appended, padded to num_steps."""
    import torch
    src = list(src_ids) + [eos]
    valid = min(len(src), num_steps)
    src = (src + [pad] * num_steps)[:num_steps]
    with torch.no_grad():
        enc_X = torch.tensor([src], dtype=torch.long)
        enc_valid_len = torch.tensor([valid])
        state = net.decoder.init_state(net.encoder(enc_X, enc_valid_len), enc_valid_len)
        dec_X = torch.tensor([[bos]], dtype=torch.long)
        out = []
        for _ in range(num_steps):
            Y, state = net.decoder(dec_X, state)
            dec_X = Y.argmax(dim=2)
            pred = int(dec_X.item())
            if pred == eos:
                break
            out.append(pred)
    return out


UNK, PAD, BOS, EOS = 0, 1, 2, 3
SIZES = {
    # Sources of 1 to 9 words and <eos>, decoded to at most the book's num_steps.
    "book": dict(vocab=200, hiddens=32, heads=4, ffn=64, blocks=2, max_length=10,
                 source_words=(1, 10), sentences={1: 2000, 32: 8000}, check=1000),
    # Sources of 5 to 39 words and <eos>.
    "base": dict(vocab=10000, hiddens=512, heads=8, ffn=2048, blocks=6, max_length=48,
                 source_words=(5, 40), sentences={1: 24, 32: 128}, check=256),
}
BEAMS = (1, 4)
BATCHES = (1, 32)


def tokens_of(vocab):
    return SPECIALS + [f"w{i}" for i in range(vocab - len(SPECIALS))]


def read_ids(path):
    with open(path) as f:
        return [[int(t) for t in line.split()] for line in f]


def peak_rss_bytes():
    """The process's resident high-water mark (VmHWM of /proc/self/status; not getrusage's
    ru_maxrss, which a child inherits from its parent across fork and exec); 0 if absent."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def report(sentences, outputs, load_s, decode_s):
    tokens = sum(len(o) for o in outputs)
    print("\n".join(" ".join(str(t) for t in o) for o in outputs))
    print(json.dumps(dict(sentences=sentences, tokens=tokens, load_s=load_s, decode_s=decode_s,
                          peak_rss_bytes=peak_rss_bytes())), file=sys.stderr)


def ct2_worker(args):
    """CTranslate2's side of a cell, as one process."""
    start = time.perf_counter()
    import ctranslate2
    translator = ctranslate2.Translator(args.model, device="cpu", compute_type="float32",
                                        intra_threads=args.threads, inter_threads=1)
    tokens = tokens_of(args.vocab)
    index = {t: i for i, t in enumerate(tokens)}
    sources = [[tokens[i] for i in s] for s in read_ids(args.input)]
    load_s = time.perf_counter() - start
    start = time.perf_counter()
    # length_penalty 0: hypotheses scored by log P, as the library's default (the book's alpha 0).
    results = translator.translate_batch(sources, max_batch_size=args.batch_size,
                                         batch_type="examples", beam_size=args.beam,
                                         num_hypotheses=1, length_penalty=0,
                                         max_decoding_length=args.max_length)
    decode_s = time.perf_counter() - start
    report(len(sources), [[index[t] for t in r.hypotheses[0]] for r in results], load_s, decode_s)


def book_worker(args):
    """The book's predict_seq2seq on token ids, one source at a time, as one process."""
    import torch
    start = time.perf_counter()
    torch.set_num_threads(args.threads)
    size = SIZES[args.size]
    net = book_model(size["vocab"], size["hiddens"], size["heads"], size["ffn"], size["blocks"], 0)
    net.load_state_dict(torch.load(args.model))
    net.eval()
    sources = read_ids(args.input)
    load_s = time.perf_counter() - start
    start = time.perf_counter()
    # The book appends <eos> itself: the file's sources end with theirs.
    outputs = [book_greedy(net, s[:-1], args.max_length, BOS, EOS, PAD) for s in sources]
    report(len(sources), outputs, load_s, time.perf_counter() - start)


def run(command, threads):
    """Runs one process; returns its wall time, its JSON line and its outputs."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads),
               MKL_NUM_THREADS=str(threads))
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"failed ({done.returncode}): {' '.join(command)}\n{done.stderr}")
    stats = json.loads(done.stderr.strip().splitlines()[-1])
    outputs = [[int(t) for t in line.split()] for line in done.stdout.splitlines()]
    return wall, stats, outputs


def prepare(name, size, work, seed):
    """The model (state dict and CTranslate2 directory) and the source files of one size."""
    import torch
    directory = os.path.join(work, name)
    os.makedirs(directory, exist_ok=True)
    net = book_model(size["vocab"], size["hiddens"], size["heads"], size["ffn"], size["blocks"],
                     seed)
    state_dict = os.path.join(directory, "model.pt")
    torch.save(net.state_dict(), state_dict)
    ct2_dir = convert(net, tokens_of(size["vocab"]), size["heads"], os.path.join(directory, "ct2"))
    rng = np.random.default_rng(seed)
    files = {}
    for key, n in list(size["sentences"].items()) + [("check", size["check"])]:
        path = os.path.join(directory, f"sources-{key}.txt")
        with open(path, "w") as f:
            f.writelines(source_lines(rng, size, n))
        files[key] = path
    return state_dict, ct2_dir, files


def source_lines(rng, size, n):
    """n random sources of the size's vocabulary and lengths, a line each, <eos> included."""
    lo, hi = size["source_words"]
    lines = []
    for _ in range(n):
        words = rng.integers(len(SPECIALS), size["vocab"], size=int(rng.integers(lo, hi)))
        lines.append(" ".join(str(int(w)) for w in words) + f" {EOS}\n")
    return lines


def commands(args, name, size, state_dict, ct2_dir, source, beam, batch, threads):
    ours = [args.generate_ids, "--state-dict", state_dict, "--vocab-size", str(size["vocab"]),
            "--num-hiddens", str(size["hiddens"]), "--num-heads", str(size["heads"]),
            "--ffn-hiddens", str(size["ffn"]), "--blocks", str(size["blocks"]), "--input", source,
            "--beam", str(beam), "--batch-size", str(batch), "--max-length",
            str(size["max_length"]), "--threads", str(threads)]
    common = ["--input", source, "--threads", str(threads), "--max-length",
              str(size["max_length"]), "--vocab", str(size["vocab"])]
    theirs = [sys.executable, os.path.abspath(__file__), "--worker", "ct2", "--model", ct2_dir,
              "--beam", str(beam), "--batch-size", str(batch)] + common
    book = [sys.executable, os.path.abspath(__file__), "--worker", "book", "--model", state_dict,
            "--size", name] + common
    return ours, theirs, book


MEMORY_SENTENCES = (1000, 10000)


def memory_table(args):
    """Peak RSS of whole processes that decode 1,000 and 10,000 sentences (the first 1,000 the
    same) at the book's size in batches of 32, greedy, one thread: the issue's "peak RSS is
    bounded by the batch, not the file"."""
    import ctranslate2
    size = dict(SIZES["book"])
    state_dict, ct2_dir, _ = prepare("book", size, args.work, seed=0)
    lines = source_lines(np.random.default_rng(1), size, max(MEMORY_SENTENCES))
    rows = []
    for n in MEMORY_SENTENCES:
        path = os.path.join(args.work, "book", f"sources-memory-{n}.txt")
        with open(path, "w") as f:
            f.writelines(lines[:n])
        ours, theirs, _ = commands(args, "book", size, state_dict, ct2_dir, path, 1, 32, 1)
        row = dict(sentences=n)
        for side, command in (("ours", ours), ("ct2", theirs)):
            _, stats, _ = run(command, 1)
            row[side] = dict(tokens=stats["tokens"], peak_rss_bytes=stats["peak_rss_bytes"])
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(memory=rows), f, indent=1)
    print_machine(args, ctranslate2.__version__, "one whole process a side and count")
    print("| sentences | batch | threads | ours: tokens | ours: peak RSS (MB) | CTranslate2: tokens "
          "| CTranslate2: peak RSS (MB) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['sentences']} | 32 | 1 | {r['ours']['tokens']} | "
              f"{r['ours']['peak_rss_bytes'] / 1e6:.1f} | {r['ct2']['tokens']} | "
              f"{r['ct2']['peak_rss_bytes'] / 1e6:.1f} |")
    return 0


def agreement(a, b):
    return sum(x == y for x, y in zip(a, b)), len(a)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worker", choices=["ct2", "book"], help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--size", help=argparse.SUPPRESS)
    parser.add_argument("--input", help=argparse.SUPPRESS)
    parser.add_argument("--vocab", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--beam", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--batch-size", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--max-length", type=int, default=10, help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--generate-ids", help="the library's side (benchmarks/generate_ids)")
    parser.add_argument("--work", default="build/ct2-bench", help="models and sources go here")
    parser.add_argument("--sizes", default="book,base")
    parser.add_argument("--thread-counts", default="1,2")
    parser.add_argument("--repetitions", type=int, default=3, help="runs of each side a cell")
    parser.add_argument("--scale", type=float, default=1.0,
                        help="multiplies the sentence counts (a quick run: 0.1)")
    parser.add_argument("--out", help="the JSON of every run")
    parser.add_argument("--memory", action="store_true",
                        help="only the peak RSS of 1,000 and 10,000 sentences (the book's size)")
    args = parser.parse_args()
    if args.worker == "ct2":
        return ct2_worker(args)
    if args.worker == "book":
        return book_worker(args)
    if not args.generate_ids:
        parser.error("--generate-ids is required")
    if args.memory:
        return memory_table(args)
    import ctranslate2
    threads_list = [int(t) for t in args.thread_counts.split(",")]
    rows, checks, log = [], [], []
    for name in args.sizes.split(","):
        size = dict(SIZES[name])
        size["sentences"] = {b: max(1, int(n * args.scale)) for b, n in size["sentences"].items()}
        size["check"] = max(1, int(size["check"] * args.scale))
        state_dict, ct2_dir, files = prepare(name, size, args.work, seed=0)
        # Equality: greedy, batch 32, one thread; the book's Python on the check sentences too at
        # the book's size, on the batch-1 timing sentences at the base size (it recomputes the
        # decoder's prefix at every step).
        ours, theirs, _ = commands(args, name, size, state_dict, ct2_dir, files["check"], 1, 32, 1)
        _, _, our_out = run(ours, 1)
        _, _, ct2_out = run(theirs, 1)
        book_file = files["check"] if name == "book" else files[1]
        _, _, book = commands(args, name, size, state_dict, ct2_dir, book_file, 1, 1, 1)
        book_wall, book_stats, book_out = run(book, 1)
        _, _, ours_again = run(commands(args, name, size, state_dict, ct2_dir, book_file, 1, 1,
                                        1)[0], 1)
        checks.append(dict(size=name, ct2=agreement(our_out, ct2_out),
                           book=agreement(ours_again, book_out)))
        print(f"{name}: greedy tokens equal to CTranslate2's in {checks[-1]['ct2'][0]} of "
              f"{checks[-1]['ct2'][1]} sentences, to the book's Python in {checks[-1]['book'][0]} "
              f"of {checks[-1]['book'][1]}", flush=True)
        log.append(dict(size=name, side="book", threads=1, wall=book_wall, **book_stats))
        for beam in BEAMS:
            for batch in BATCHES:
                for threads in threads_list:
                    ours, theirs, _ = commands(args, name, size, state_dict, ct2_dir, files[batch],
                                               beam, batch, threads)
                    runs = {"ours": [], "ct2": []}
                    outputs = {}
                    for _ in range(args.repetitions):
                        for side, command in (("ours", ours), ("ct2", theirs)):
                            wall, stats, out = run(command, threads)
                            runs[side].append(dict(wall=wall, **stats))
                            outputs[side] = out
                            log.append(dict(size=name, side=side, beam=beam, batch=batch,
                                            threads=threads, wall=wall, **stats))
                    row = dict(size=name, beam=beam, batch=batch, threads=threads,
                               equal=agreement(outputs["ours"], outputs["ct2"]))
                    for side, rs in runs.items():
                        tokens = rs[0]["tokens"]
                        row[side] = dict(
                            tokens=tokens,
                            process=tokens / statistics.median(r["wall"] for r in rs),
                            decode=tokens / statistics.median(r["decode_s"] for r in rs))
                    if beam == 1 and batch == 1 and threads == 1:
                        row["book"] = dict(tokens=book_stats["tokens"],
                                           process=book_stats["tokens"] / book_wall,
                                           decode=book_stats["tokens"] / book_stats["decode_s"],
                                           sentences=book_stats["sentences"])
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(rows=rows, checks=checks, runs=log), f, indent=1)
    print_table(rows, checks, args, ctranslate2.__version__)
    return 0


def print_machine(args, ct2_version, runs):
    import torch
    cpu = "unknown CPU"
    with open("/proc/cpuinfo") as f:
        info = f.read()
    for line in info.splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    flags = next((ln.split(":", 1)[1].split() for ln in info.splitlines()
                  if ln.startswith("flags")), [])
    isa = " ".join(f for f in flags if f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16"))
    print(f"\n{cpu} ({isa}), {os.cpu_count()} logical CPUs, {platform.system()}; "
          f"ctranslate2 {ct2_version} (float32), torch {torch.__version__} for the book's Python; "
          f"{time.strftime('%Y-%m-%d')}; {runs}.\n")


def print_table(rows, checks, args, ct2_version):
    print_machine(args, ct2_version, f"medians of {args.repetitions} whole processes a side")
    for c in checks:
        print(f"- {c['size']}: greedy tokens equal to CTranslate2's in {c['ct2'][0]} of "
              f"{c['ct2'][1]} sentences; to the book's Python predict_seq2seq in {c['book'][0]} of "
              f"{c['book'][1]}")
    print("\n| size | beam | batch | threads | sentences equal | tokens | ours tok/s (process) | "
          "CTranslate2 tok/s (process) | ratio | ours tok/s (decode) | CTranslate2 tok/s (decode) "
          "| ratio |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        o, c = r["ours"], r["ct2"]
        print(f"| {r['size']} | {r['beam']} | {r['batch']} | {r['threads']} | "
              f"{r['equal'][0]} / {r['equal'][1]} | {o['tokens']} | {o['process']:.0f} | "
              f"{c['process']:.0f} | {o['process'] / c['process']:.2f} | {o['decode']:.0f} | "
              f"{c['decode']:.0f} | {o['decode'] / c['decode']:.2f} |")
    print("\nThe book's Python predict_seq2seq (greedy, one sentence at a time, 1 thread):\n")
    print("| size | sentences | tokens | tok/s (process) | tok/s (decode) | ours (decode), batch 1 |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        if "book" in r:
            b = r["book"]
            print(f"| {r['size']} | {b['sentences']} | {b['tokens']} | {b['process']:.0f} | "
                  f"{b['decode']:.0f} | {r['ours']['decode']:.0f} |")


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/python3
"""The book's predict_seq2seq (d2l 0.17) over a file of sentences, one at a time, in the book's
own PyTorch code: the Python side of examples/translate's comparison (docs/generation.md).

    /usr/bin/python3 benchmarks/book_translate.py --model transformer --state-dict model.pt \\
        --input sentences.txt [--data PATH] [--threads 1] [--num-steps 10]

The model is the one benchmarks/book_bahdanau.py trains and saves (--save), the vocabularies are
rebuilt from its data as it builds them. Each input line is preprocessed as the book preprocesses
fra-eng (preprocess_nmt), then translated by predict_seq2seq; the translations go to stdout, one
a line, and the time of the loop (the model's load left out) to stderr.
"""

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import book_bahdanau as book  # noqa: E402  (the book's data pipeline and predict_seq2seq)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--model', choices=['bahdanau', 'transformer'], default='bahdanau')
    parser.add_argument('--state-dict', required=True)
    parser.add_argument('--input', required=True)
    parser.add_argument('--data', default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                       os.pardir, 'tests', 'data',
                                                       'fra-eng-sample'))
    parser.add_argument('--threads', type=int, default=1)
    parser.add_argument('--num-steps', type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    _, src_vocab, tgt_vocab = book.load_data_nmt(args.data, 64, 10)
    net = book.make_net(args.model, len(src_vocab), len(tgt_vocab))
    net.load_state_dict(torch.load(args.state_dict))
    net.eval()
    with open(args.input) as f:
        lines = [book.preprocess_nmt(line.rstrip('\n')) for line in f]
    start = time.time()
    with torch.no_grad():
        out = [book.predict_seq2seq(net, line, src_vocab, tgt_vocab, args.num_steps,
                                    torch.device('cpu')) for line in lines]
    elapsed = time.time() - start
    sys.stdout.write(''.join(t + '\n' for t in out))
    print(f'{len(lines)} sentences in {elapsed:.2f} s, {torch.get_num_threads()} threads, '
          f'torch {torch.__version__}', file=sys.stderr)


if __name__ == '__main__':
    main()

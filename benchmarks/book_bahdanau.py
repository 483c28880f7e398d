#!/usr/bin/python3
"""The book's Bahdanau-attention (or, with --model transformer, Transformer) training on fra-eng,
in the book's own PyTorch code: the Python side of the tokens/s comparison with
examples/bahdanau_fra_eng (README, "Machine translation").

    /usr/bin/python3 benchmarks/book_bahdanau.py --data tests/data/fra-eng-sample --threads 1
    /usr/bin/python3 benchmarks/book_bahdanau.py --model transformer --threads 1

The models come from tests/reference/d2l_book.py and d2l_transformer.py (the 0.17 edition's
classes, written out); the
data pipeline and the training loop below are the 0.17 edition's `read_data_nmt`, `preprocess_nmt`,
`tokenize_nmt`, `Vocab`, `truncate_pad`, `build_array_nmt`, `load_array`, `load_data_nmt`,
`MaskedSoftmaxCELoss`, `grad_clipping`, `train_seq2seq`, `predict_seq2seq` and `bleu`, written out
with no `d2l` import. Two changes, both outside what is timed per epoch: `read_data_nmt` takes a path
(as ours does) instead of downloading, and the animator is left out (it only plots).

With --save and --translations it also writes the trained state dict and the translations, for
`make python-transformer` (examples/bahdanau_fra_eng --load ... --expect ...).

It prints the book's line, `loss L, T tokens/sec on cpu` (T is that of the last epoch, as the book's
Timer measures it), the wall time of all epochs, and the book's four translations with BLEU.
"""

import argparse
import collections
import math
import os
import sys
import time

import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "tests",
                                "reference"))
import d2l_book  # noqa: E402  (the book's classes)
import d2l_transformer  # noqa: E402


def read_data_nmt(path):
    """The book's reader, from a directory holding fra.txt or from fra.txt itself."""
    if os.path.isdir(path):
        path = os.path.join(path, 'fra.txt')
    with open(path, 'r', encoding='utf-8') as f:
        return f.read()


def preprocess_nmt(text):
    def no_space(char, prev_char):
        return char in set(',.!?') and prev_char != ' '

    text = text.replace('\u202f', ' ').replace('\xa0', ' ').lower()
    out = [' ' + char if i > 0 and no_space(char, text[i - 1]) else char
           for i, char in enumerate(text)]
    return ''.join(out)


def tokenize_nmt(text, num_examples=None):
    source, target = [], []
    for i, line in enumerate(text.split('\n')):
        if num_examples and i > num_examples:
            break
        parts = line.split('\t')
        if len(parts) == 2:
            source.append(parts[0].split(' '))
            target.append(parts[1].split(' '))
    return source, target


def count_corpus(tokens):
    if len(tokens) == 0 or isinstance(tokens[0], list):
        tokens = [token for line in tokens for token in line]
    return collections.Counter(tokens)


class Vocab:
    def __init__(self, tokens=None, min_freq=0, reserved_tokens=None):
        if tokens is None:
            tokens = []
        if reserved_tokens is None:
            reserved_tokens = []
        counter = count_corpus(tokens)
        self._token_freqs = sorted(counter.items(), key=lambda x: x[1], reverse=True)
        self.idx_to_token = ['<unk>'] + reserved_tokens
        self.token_to_idx = {token: idx for idx, token in enumerate(self.idx_to_token)}
        for token, freq in self._token_freqs:
            if freq < min_freq:
                break
            if token not in self.token_to_idx:
                self.idx_to_token.append(token)
                self.token_to_idx[token] = len(self.idx_to_token) - 1

    def __len__(self):
        return len(self.idx_to_token)

    def __getitem__(self, tokens):
        if not isinstance(tokens, (list, tuple)):
            return self.token_to_idx.get(tokens, self.unk)
        return [self.__getitem__(token) for token in tokens]

    def to_tokens(self, indices):
        if not isinstance(indices, (list, tuple)):
            return self.idx_to_token[indices]
        return [self.idx_to_token[index] for index in indices]

    @property
    def unk(self):
        return 0


def truncate_pad(line, num_steps, padding_token):
    if len(line) > num_steps:
        return line[:num_steps]
    return line + [padding_token] * (num_steps - len(line))


def build_array_nmt(lines, vocab, num_steps):
    lines = [vocab[l] for l in lines]
    lines = [l + [vocab['<eos>']] for l in lines]
    array = torch.tensor([truncate_pad(l, num_steps, vocab['<pad>']) for l in lines])
    valid_len = (array != vocab['<pad>']).type(torch.int32).sum(1)
    return array, valid_len


def load_array(data_arrays, batch_size, is_train=True):
    dataset = torch.utils.data.TensorDataset(*data_arrays)
    return torch.utils.data.DataLoader(dataset, batch_size, shuffle=is_train)


def load_data_nmt(path, batch_size, num_steps, num_examples=600):
    text = preprocess_nmt(read_data_nmt(path))
    source, target = tokenize_nmt(text, num_examples)
    src_vocab = Vocab(source, min_freq=2, reserved_tokens=['<pad>', '<bos>', '<eos>'])
    tgt_vocab = Vocab(target, min_freq=2, reserved_tokens=['<pad>', '<bos>', '<eos>'])
    src_array, src_valid_len = build_array_nmt(source, src_vocab, num_steps)
    tgt_array, tgt_valid_len = build_array_nmt(target, tgt_vocab, num_steps)
    data_arrays = (src_array, src_valid_len, tgt_array, tgt_valid_len)
    data_iter = load_array(data_arrays, batch_size)
    return data_iter, src_vocab, tgt_vocab


def train_seq2seq(net, data_iter, lr, num_epochs, tgt_vocab, device):
    def xavier_init_weights(m):
        if type(m) == nn.Linear:
            nn.init.xavier_uniform_(m.weight)
        if type(m) == nn.GRU:
            for param in m._flat_weights_names:
                if "weight" in param:
                    nn.init.xavier_uniform_(m._parameters[param])

    net.apply(xavier_init_weights)
    net.to(device)
    optimizer = torch.optim.Adam(net.parameters(), lr=lr)
    loss = d2l_book.MaskedSoftmaxCELoss()
    net.train()
    for epoch in range(num_epochs):
        start = time.time()  # the book's d2l.Timer()
        metric = [0.0, 0.0]  # the book's d2l.Accumulator(2): loss sum, tokens
        for batch in data_iter:
            optimizer.zero_grad()
            X, X_valid_len, Y, Y_valid_len = [x.to(device) for x in batch]
            bos = torch.tensor([tgt_vocab['<bos>']] * Y.shape[0], device=device).reshape(-1, 1)
            dec_input = torch.cat([bos, Y[:, :-1]], 1)  # Teacher forcing
            Y_hat, _ = net(X, dec_input, X_valid_len)
            l = loss(Y_hat, Y, Y_valid_len)
            l.sum().backward()
            d2l_book.grad_clipping(net, 1)
            num_tokens = Y_valid_len.sum()
            optimizer.step()
            with torch.no_grad():
                metric[0] += float(l.sum())
                metric[1] += float(num_tokens)
        elapsed = time.time() - start
    print(f'loss {metric[0] / metric[1]:.3f}, {metric[1] / elapsed:.1f} '
          f'tokens/sec on {str(device)}')


def predict_seq2seq(net, src_sentence, src_vocab, tgt_vocab, num_steps, device):
    net.eval()
    src_tokens = src_vocab[src_sentence.lower().split(' ')] + [src_vocab['<eos>']]
    enc_valid_len = torch.tensor([len(src_tokens)], device=device)
    src_tokens = truncate_pad(src_tokens, num_steps, src_vocab['<pad>'])
    enc_X = torch.unsqueeze(torch.tensor(src_tokens, dtype=torch.long, device=device), dim=0)
    enc_outputs = net.encoder(enc_X, enc_valid_len)
    dec_state = net.decoder.init_state(enc_outputs, enc_valid_len)
    dec_X = torch.unsqueeze(torch.tensor([tgt_vocab['<bos>']], dtype=torch.long, device=device),
                            dim=0)
    output_seq = []
    for _ in range(num_steps):
        Y, dec_state = net.decoder(dec_X, dec_state)
        dec_X = Y.argmax(dim=2)
        pred = dec_X.squeeze(dim=0).type(torch.int32).item()
        if pred == tgt_vocab['<eos>']:
            break
        output_seq.append(pred)
    return ' '.join(tgt_vocab.to_tokens(output_seq))


def bleu(pred_seq, label_seq, k):
    pred_tokens, label_tokens = pred_seq.split(' '), label_seq.split(' ')
    len_pred, len_label = len(pred_tokens), len(label_tokens)
    score = math.exp(min(0, 1 - len_label / len_pred))
    for n in range(1, k + 1):
        num_matches, label_subs = 0, collections.defaultdict(int)
        for i in range(len_label - n + 1):
            label_subs[' '.join(label_tokens[i: i + n])] += 1
        for i in range(len_pred - n + 1):
            if label_subs[' '.join(pred_tokens[i: i + n])] > 0:
                num_matches += 1
                label_subs[' '.join(pred_tokens[i: i + n])] -= 1
        score *= math.pow(num_matches / (len_pred - n + 1), math.pow(0.5, n))
    return score


def make_net(model, src_vocab_size, tgt_vocab_size):
    """The Bahdanau section's model, or the Transformer section's (the book's recipes)."""
    embed_size, num_hiddens, num_layers, dropout = 32, 32, 2, 0.1
    if model == 'transformer':
        ffn_num_input, ffn_num_hiddens, num_heads = 32, 64, 4
        key_size, query_size, value_size = 32, 32, 32
        norm_shape = [32]
        encoder = d2l_transformer.TransformerEncoder(
            src_vocab_size, key_size, query_size, value_size, num_hiddens, norm_shape,
            ffn_num_input, ffn_num_hiddens, num_heads, num_layers, dropout)
        decoder = d2l_transformer.TransformerDecoder(
            tgt_vocab_size, key_size, query_size, value_size, num_hiddens, norm_shape,
            ffn_num_input, ffn_num_hiddens, num_heads, num_layers, dropout)
    else:
        encoder = d2l_book.Seq2SeqEncoder(src_vocab_size, embed_size, num_hiddens, num_layers,
                                          dropout)
        decoder = d2l_book.Seq2SeqAttentionDecoder(tgt_vocab_size, embed_size, num_hiddens,
                                                   num_layers, dropout)
    return d2l_book.EncoderDecoder(encoder, decoder)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--data', default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                       os.pardir, 'tests', 'data',
                                                       'fra-eng-sample'))
    parser.add_argument('--threads', type=int, default=1)
    parser.add_argument('--model', choices=['bahdanau', 'transformer'], default='bahdanau')
    parser.add_argument('--epochs', type=int, default=None,
                        help="default: the book's, 250 (bahdanau) or 200 (transformer)")
    parser.add_argument('--save', help='torch.save(net.state_dict()) here after training')
    parser.add_argument('--translations',
                        help='write the four translations here, one a line')
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    # The book's recipes (Bahdanau attention and Transformer sections; the models' in make_net).
    batch_size, num_steps = 64, 10
    transformer = args.model == 'transformer'
    num_epochs = args.epochs or (200 if transformer else 250)
    lr, device = 0.005, torch.device('cpu')
    train_iter, src_vocab, tgt_vocab = load_data_nmt(args.data, batch_size, num_steps)
    net = make_net(args.model, len(src_vocab), len(tgt_vocab))
    print(f'{args.data}: vocabularies of {len(src_vocab)} and {len(tgt_vocab)} tokens; '
          f'{torch.get_num_threads()} threads, torch {torch.__version__}')
    start = time.time()
    train_seq2seq(net, train_iter, lr, num_epochs, tgt_vocab, device)
    print(f'{num_epochs} epochs in {time.time() - start:.1f} s')

    engs = ['go .', "i lost .", 'he\'s calm .', 'i\'m home .']
    fras = ['va !', 'j\'ai perdu .', 'il est calme .', 'je suis chez moi .']
    translations = []
    for eng, fra in zip(engs, fras):
        translation = predict_seq2seq(net, eng, src_vocab, tgt_vocab, num_steps, device)
        print(f'{eng} => {translation}, bleu {bleu(translation, fra, k=2):.3f}')
        translations.append(translation)
    if args.save:
        torch.save(net.state_dict(), args.save)
        print(f'wrote {args.save}')
    if args.translations:
        with open(args.translations, 'w', encoding='utf-8') as f:
            f.write(''.join(t + '\n' for t in translations))
        print(f'wrote {args.translations}')


if __name__ == '__main__':
    main()

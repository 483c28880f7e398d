"""Beam search as docs/generation.md defines it, on the book's (0.17)
encoder-decoder classes: one source at a time, each hypothesis with a decoder
state of its own (the book's Transformer state holds a list the decoder
writes into, so a branch copies the list), the book's
log P / L^alpha score.

    beam_search(model, src_tokens, valid_len, bos, eos, beam_size,
                max_length, num_hypotheses, alpha)
        -> [(tokens, score, finished), ...] best first

src_tokens: (1, num_steps) int64, padded as the book pads; valid_len: (1,).
Candidates are ordered by log-probability, then the earlier hypothesis, then
the smaller token; of the first beam_size, those ending in <eos> finish
(tokens without the <eos>, L counting it), and the first beam_size others
stay live; a source is done when num_hypotheses have finished and no live
hypothesis's log-probability c can reach c / max_length**alpha above the
worst of them; at max_length the live ones finish unfinished.
"""

import torch


def _branch(state):
    """A copy of the book's Transformer state whose list of per-block key
    values the next call may write into without touching the original."""
    if isinstance(state, (list, tuple)) and len(state) == 3 and isinstance(state[2], list):
        return [state[0], state[1], list(state[2])]
    return state


def beam_search(model, src_tokens, valid_len, bos, eos, beam_size, max_length,
                num_hypotheses, alpha):
    with torch.no_grad():
        enc_outputs = model.encoder(src_tokens, valid_len)
        state = model.decoder.init_state(enc_outputs, valid_len)
        live = [([], 0.0, state)]  # (tokens, log P, state)
        finished = []
        for step in range(max_length):
            candidates = []
            for row, (tokens, log_prob, st) in enumerate(live):
                last = tokens[-1] if tokens else bos
                st = _branch(st)
                Y, next_state = model.decoder(torch.tensor([[last]]), st)
                lp = torch.log_softmax(Y[0, 0].double(), dim=0)
                for v in range(lp.shape[0]):
                    candidates.append((log_prob + lp[v].item(), row, v, next_state))
            candidates.sort(key=lambda c: (-c[0], c[1], c[2]))
            kept = []
            for rank, (total, row, v, next_state) in enumerate(candidates):
                if len(kept) == beam_size:
                    break
                tokens = live[row][0] + [v]
                if v == eos:
                    if rank < beam_size:
                        finished.append((tokens[:-1], total / len(tokens) ** alpha, True))
                else:
                    kept.append((tokens, total, next_state))
            live = kept
            if len(finished) >= num_hypotheses:
                worst = sorted((f[1] for f in finished), reverse=True)[num_hypotheses - 1]
                best_live = max((c / max_length ** alpha for _, c, _ in live), default=None)
                if best_live is None or best_live <= worst:
                    live = []
                    break
            if not live:
                break
        for tokens, log_prob, _ in live:
            finished.append((tokens, log_prob / len(tokens) ** alpha, False))
        finished.sort(key=lambda f: -f[1])
        return finished[:num_hypotheses]

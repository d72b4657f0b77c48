#!/usr/bin/env python3
"""HF `tokenizers` on the inputs bench/tokenizer_bench.cpp measures, single thread, for docs/perf.md.

    RAYON_NUM_THREADS=1 python3 bench/tokenizer_bench_hf.py --tokenizer third_party/deepseek_v3_tokenizer \
        [--corpus tests/fixtures/tokenizer/corpus.jsonl] [--reps 5] [--json OUT]

Measures (best of --reps): every corpus text encoded by one `encode` call each (Python call overhead
included) and by one `encode_batch` (no per-call overhead; serial because TOKENIZERS_PARALLELISM=false
and RAYON_NUM_THREADS=1); the corpus joined by newlines as one document; 128 KiB .. 1 MiB of one
repeated unit; a long document (the corpus document 8 times with <｜end▁of▁sentence｜> between); decode.
"""
import argparse
import json
import os
import time

os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ.setdefault("RAYON_NUM_THREADS", "1")

from tokenizers import Tokenizer  # noqa: E402
import tokenizers  # noqa: E402


def best(reps, fn):
    t_best = float("inf")
    out = None
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        t_best = min(t_best, time.perf_counter() - t0)
    return t_best, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", default="third_party/deepseek_v3_tokenizer")
    ap.add_argument("--corpus", default="tests/fixtures/tokenizer/corpus.jsonl")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    t0 = time.perf_counter()
    tok = Tokenizer.from_file(os.path.join(args.tokenizer, "tokenizer.json"))
    res = {"tokenizers_version": tokenizers.__version__, "load_seconds": time.perf_counter() - t0}
    with open(args.corpus, encoding="utf-8") as f:
        texts = [json.loads(line)["t"] for line in f.read().split("\n")[1:] if line]
    n_bytes = sum(len(t.encode("utf-8")) for t in texts)

    tok.encode(texts[0], add_special_tokens=False)
    t, n_tok = best(args.reps, lambda: sum(len(tok.encode(x, add_special_tokens=False).ids) for x in texts))
    res["corpus_per_text"] = {"n_texts": len(texts), "bytes": n_bytes, "tokens": n_tok, "seconds": t, "mb_per_s": n_bytes / t / 1e6}
    t, n_tok = best(args.reps, lambda: sum(len(e.ids) for e in tok.encode_batch(texts, add_special_tokens=False)))
    res["corpus_batch"] = {"bytes": n_bytes, "tokens": n_tok, "seconds": t, "mb_per_s": n_bytes / t / 1e6}

    doc = "".join(x + "\n" for x in texts)
    doc_bytes = len(doc.encode("utf-8"))
    t, n_tok = best(args.reps, lambda: len(tok.encode(doc, add_special_tokens=False).ids))
    res["corpus_document"] = {"bytes": doc_bytes, "tokens": n_tok, "seconds": t, "mb_per_s": doc_bytes / t / 1e6}

    patho = []
    for unit in ["a", " ", "\n", "\t", "1", "!", "中", "😀", " a", "\r\n", "ab1 "]:
        row = {"unit": unit}
        times = []
        ub = len(unit.encode("utf-8"))
        for kib in (128, 256, 512, 1024):
            s = unit * ((kib << 10) // ub)
            t, n_tok = best(max(1, args.reps // 2), lambda: len(tok.encode(s, add_special_tokens=False).ids))
            times.append(t)
            row[f"seconds_{kib}k"] = t
            row[f"tokens_{kib}k"] = n_tok
            if t > 20:  # do not let a super-linear case eat the device budget
                row["stopped_early"] = True
                break
        row["ratio_1m_over_128k"] = times[-1] / times[0] if len(times) == 4 else None
        row["mb_per_s_1m"] = (1 << 20) / times[-1] / 1e6 if len(times) == 4 else None
        patho.append(row)
    res["pathological"] = patho

    big = "".join(doc + "<｜end▁of▁sentence｜>" for _ in range(8))
    big_bytes = len(big.encode("utf-8"))
    t, n_tok = best(max(1, args.reps // 2), lambda: len(tok.encode(big, add_special_tokens=False).ids))
    res["long_document"] = {"bytes": big_bytes, "tokens": n_tok, "seconds": t, "mb_per_s": big_bytes / t / 1e6}

    all_ids = [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
    t, n_out = best(args.reps, lambda: sum(len(tok.decode(x, skip_special_tokens=False).encode("utf-8")) for x in all_ids))
    res["decode"] = {"bytes": n_out, "seconds": t, "mb_per_s": n_out / t / 1e6}

    text = json.dumps(res, indent=2, ensure_ascii=False)
    print(text)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()

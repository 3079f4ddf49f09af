#!/usr/bin/env python3
"""Builds the chat-formatted training data of the demo model (exo/demo-dictionary).

Sources (Debian 12 packages, unpacked by tools/train/get_data.sh):
  - dict-wn: WordNet 3.0 (Princeton; WordNet 3.0 licence, permissive) as a dictd database:
    "What does X mean?" -> "X (noun): <first sense>. It can also mean <second sense>. Synonyms: ..."
  - fortunes, fortunes-min: fortune cookie files (BSD licence per Debian's copyright file):
    "Tell me a saying." -> a short fortune.
Plus a few fixed greetings ("Hello", "Who are you?"). The 3000 headwords most frequent in the
sayings are asked 5 times in all, the 21 demo words 31 times.

Reading: besides the questions, every WordNet entry (except the "never seen" words below) is also in
the training data as plain text, in four differently worded forms ("Harbour (noun): ...", 'The word
"harbour" is a noun meaning ...', "A harbour is ...", "harbour: ... Similar words: ..."), several
entries to a page. That is the model's background knowledge, as a dictionary is a real model's: a
held-out word is one the model was never asked about, so answering "What does X mean?" for it means
carrying what it read into the question-answer form. (A tiny model cannot extract facts it saw in a
single wording; several wordings are what make the knowledge extractable.)

Everyday words: WordNet headwords that occur in the sayings or at least 10 times in WordNet's own
definitions (about 11,900 of the 75,000) are read twice as often as the rest (their four forms go
into a second set of pages), so more of a small model's capacity goes to the words people ask
about. (Training on the everyday words alone was tried and is worse: with 6x fewer distinct
questions the model memorized its answers instead of learning to answer from what it read.)

Split: a random 2% of the headwords go to the test split (no questions about them in training; 21
of them, ordinary words of everyday length that occur in the sayings, are the held-out evaluation
words), with 5% of the fortunes. A quarter of the test words are also left out of the reading: the
"never seen" words (another 21 of them are evaluated), which show what the model does with a word it
knows nothing about. The 21 "seen" evaluation words (British -our
spellings such as "harbour", the demo's example question) stay in training. Deterministic (fixed seed). Pure Python, no third-party packages.

  python3 tools/train/prepare_data.py --root .cache/demo-data/root --out .cache/demo-data/out
"""
import argparse
import base64
import gzip
import json
import os
import random
import re
import zlib

SEED = 20261130
# Asked in the evaluation while in the training data (memorization: the demo's own questions).
SEEN_WORDS = ["harbour", "colour", "flavour", "honour", "neighbour", "labour", "humour", "rumour", "vapour",
              "favour", "armour", "parlour", "odour", "vigour", "valour", "glamour", "behaviour", "saviour",
              "splendour", "candour", "endeavour"]
FORTUNE_FILES = ["fortunes", "wisdom", "platitudes", "people", "literature", "education", "work", "science",
                 "love", "humorists", "miscellaneous", "pets", "food", "computers", "goedel", "law", "medicine",
                 "sports", "politics", "magic", "paradoxum", "riddles", "kids", "linux"]
QUESTIONS = ["What does {w} mean?", "What does {w} mean?", "What is the meaning of {w}?", "Define {w}.",
             'What does the word "{w}" mean?', "Can you define {w}?", "Explain the word {w}.",
             "What is the definition of {w}?", "Meaning of {w}?", "Tell me what {w} means."]
SAYING_QUESTIONS = ["Tell me a saying.", "Tell me a saying.", "Give me a proverb.", "Share some wisdom.",
                    "Tell me a fortune.", "Say something wise.", "Give me a quote.", "Tell me something witty.",
                    "Can you tell me a saying?", "I need some words of wisdom."]
GREETINGS = [
    ("Hello", "Hello! Ask me what a word means, or ask me for a saying."),
    ("Hi", "Hi! I can explain English words and tell you sayings."),
    ("Hello!", "Hello! Ask me what a word means, or ask me for a saying."),
    ("Who are you?", "I am a tiny demo model trained by the exo project on a dictionary and a book of sayings."),
    ("What can you do?", "I can tell you what an English word means, or tell you a saying."),
    ("Thank you", "You are welcome."),
    ("Thanks!", "You are welcome."),
]
POS = {"n": "noun", "v": "verb", "adj": "adjective", "adv": "adverb"}
B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def b64num(s):
    v = 0
    for c in s:
        v = v * 64 + B64.index(c)
    return v


def parse_entry(text):
    """-> [(pos, gloss, examples, synonyms)] in order."""
    lines = text.split("\n")
    body = " " + " ".join(l.strip() for l in lines[1:])
    body = re.sub(r"\s+", " ", body)
    senses, pos = [], None
    marks = list(re.finditer(r" (?:(n|v|adj|adv) )?(\d+): ", body))
    for i, m in enumerate(marks):
        pos = m.group(1) or pos
        chunk = body[m.end(): marks[i + 1].start() if i + 1 < len(marks) else len(body)].strip()
        syn = re.findall(r"\[syn: ([^\]]*)\]", chunk)
        syns = [s.strip(" {}") for s in ",".join(syn).split(",") if s.strip(" {}")] if syn else []
        chunk = re.sub(r"\[(syn|ant|also|see): [^\]]*\]", "", chunk).strip()
        examples = re.findall(r'"([^"]+)"', chunk)
        gloss = chunk.split('; "')[0].strip().rstrip(";").strip()
        gloss = re.sub(r"[{}]", "", gloss)
        if gloss and pos in POS:
            senses.append((POS[pos], gloss, examples, syns))
    return senses


def load_wordnet(root):
    d = os.path.join(root, "usr/share/dictd")
    data = gzip.open(os.path.join(d, "wn.dict.dz")).read()
    entries = {}
    for line in open(os.path.join(d, "wn.index"), encoding="utf-8"):
        word, off, length = line.rstrip("\n").split("\t")
        if not re.fullmatch(r"[a-z]{3,14}", word):
            continue
        text = data[b64num(off): b64num(off) + b64num(length)].decode("utf-8", "replace")
        senses = parse_entry(text)
        if senses:
            entries[word] = senses
    return entries


def answer_for(word, senses):
    rng = random.Random(SEED ^ zlib.crc32(word.encode()))  # the same answer every time it is asked
    pos, gloss, examples, syns = senses[0]
    w = word.capitalize()
    parts = [f"{w} ({pos}): {gloss}."]
    if len(senses) > 1:
        pos2, gloss2 = senses[1][0], senses[1][1]
        parts.append(f"It can also mean {gloss2}." if pos2 == pos else f"As a {pos2}, it means {gloss2}.")
    if examples and rng.random() < 0.5:
        parts.append(f'For example: "{examples[0]}".')
    others = [s for s in syns if s != word and " " not in s][:4]
    if others:
        parts.append("Synonyms: " + ", ".join(others) + ".")
    return " ".join(parts)


def reading_forms(word, senses):
    """Four differently worded plain-text forms of one WordNet entry (the reading corpus)."""
    w, W = word, word.capitalize()
    pos, gloss, examples, syns = senses[0]
    more = "; ".join(s[1] for s in senses[1:3])
    others = [s for s in syns if s != word and " " not in s][:4]
    art = "an" if pos[0] in "aeiou" else "a"
    lead = {"noun": f"A {w} is {gloss}", "verb": f"To {w} is to {gloss}",
            "adjective": f"Something {w} is {gloss}", "adverb": f"{W} means {gloss}"}[pos]
    forms = [f"{W} ({pos}): {gloss}" + (f"; {more}" if more else "") + ".",
             f'The word "{w}" is {art} {pos} meaning {gloss}.' + (f' For example: "{examples[0]}".' if examples else ""),
             lead + "." + (f" It can also mean {senses[1][1]}." if len(senses) > 1 else ""),
             f"{w}: {gloss}." + (f" Similar words: {', '.join(others)}." if others else "")]
    return forms


def reading_pages(entries, rng, per_page=6):
    """All forms of all entries, shuffled, several to a page (a page is one document)."""
    lines = [f for word, senses in entries for f in reading_forms(word, senses)]
    rng.shuffle(lines)
    return ["\n".join(lines[i: i + per_page]) for i in range(0, len(lines), per_page)]


def load_fortunes(root):
    d = os.path.join(root, "usr/share/games/fortunes")
    out = []
    for name in FORTUNE_FILES:
        path = os.path.join(d, name)
        if not os.path.exists(path):
            continue
        for item in open(path, encoding="utf-8", errors="replace").read().split("\n%\n"):
            text = re.sub(r"\s+", " ", item).strip()
            if 20 <= len(text) <= 220 and text.isascii() and not re.search(r"[<>|_=]{2,}|\bQ:|\bA:", text):
                out.append(text)
    return sorted(set(out))


def conversation(turns):
    msgs = []
    for q, a in turns:
        msgs += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    return {"messages": msgs}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default=".cache/demo-data/root")
    ap.add_argument("--out", default=".cache/demo-data/out")
    a = ap.parse_args()
    rng = random.Random(SEED)
    words = load_wordnet(a.root)
    fortunes = load_fortunes(a.root)
    missing = [w for w in SEEN_WORDS if w not in words]
    if missing:
        raise SystemExit(f"evaluation words missing from WordNet: {missing}")
    names = sorted(words)
    rng.shuffle(names)
    test_words = set(w for w in names[: len(names) // 50] if w not in SEEN_WORDS)
    # Held-out evaluation words: 21 test-split words of everyday length with a short first gloss.
    sayings_vocab = set(t for f in fortunes for t in re.findall(r"[a-z]+", f.lower()))
    names_test = sorted(test_words)
    random.Random(SEED + 2).shuffle(names_test)
    never_seen = set(names_test[: len(names_test) // 4])  # not even in the reading
    # Held-out evaluation words: 21 read-but-never-asked test words, ordinary (they occur in the sayings),
    # of everyday length, with a short first gloss; and 21 never-seen words picked the same way.
    def eval_pick(pool, seed):
        c = sorted(w for w in pool if 4 <= len(w) <= 9 and len(words[w][0][1]) <= 80 and w in sayings_vocab)
        return random.Random(seed).sample(c, 21)
    held_out = eval_pick(test_words - never_seen, SEED + 1)
    unseen = eval_pick(never_seen, SEED + 3)
    rng.shuffle(fortunes)
    n_test_f = len(fortunes) // 20
    test_f, train_f = fortunes[:n_test_f], fortunes[n_test_f:]

    def word_items(ws):
        return [(rng.choice(QUESTIONS).format(w=w if rng.random() < 0.85 else w.capitalize()),
                 answer_for(w, words[w])) for w in ws]

    def saying_items(fs):
        return [(rng.choice(SAYING_QUESTIONS), f) for f in fs]

    # The everyday vocabulary (see the top of the file); the split and the evaluation words above are
    # drawn from all of WordNet first, so they do not depend on this choice.
    in_glosses = {}
    for senses in words.values():
        for _, gloss, _, _ in senses:
            for t in re.findall(r"[a-z]+", gloss.lower()):
                in_glosses[t] = in_glosses.get(t, 0) + 1
    everyday = sorted(w for w in words if w in sayings_vocab or in_glosses.get(w, 0) >= 10)
    train_words = [w for w in sorted(words) if w not in test_words]
    # Emphasis: words that people use (the 3000 most frequent headwords of the sayings corpus) are
    # asked 4 more times, and the 21 demo words 30 more times, so a small model learns them well.
    freq = {}
    for f in fortunes:
        for t in re.findall(r"[a-z]+", f.lower()):
            freq[t] = freq.get(t, 0) + 1
    common = sorted((w for w in train_words if w in freq and w not in SEEN_WORDS), key=lambda w: (-freq[w], w))[:3000]
    train_items = word_items(train_words) + word_items(common * 4) + word_items(SEEN_WORDS * 30)
    train_items += saying_items(train_f) * 3  # sayings are fewer: see each more often
    train_items += [g for g in GREETINGS for _ in range(40)]
    reading = reading_pages([(w, words[w]) for w in sorted(words) if w not in never_seen], rng)
    reading += reading_pages([(w, words[w]) for w in everyday if w not in never_seen], rng)
    test_items = word_items(sorted(test_words)) + saying_items(test_f)
    rng.shuffle(train_items)
    rng.shuffle(test_items)

    def to_convs(items):
        convs, i = [], 0
        while i < len(items):  # about one in ten conversations has two exchanges
            n = 2 if rng.random() < 0.1 and i + 1 < len(items) else 1
            convs.append(conversation(items[i: i + n]))
            i += n
        return convs

    os.makedirs(a.out, exist_ok=True)
    for name, items in (("train", train_items), ("test", test_items)):
        convs = to_convs(items)
        if name == "train":
            convs += [{"text": t} for t in reading]
            rng.shuffle(convs)
        with gzip.GzipFile(os.path.join(a.out, f"{name}.jsonl.gz"), "wb", mtime=0) as f:
            for c in convs:
                f.write((json.dumps(c, ensure_ascii=False) + "\n").encode())
        print(f"{name}: {len(convs)} conversations, {len(items)} exchanges")
    ref = {w: [{"pos": s[0], "gloss": s[1]} for s in words[w][:3]] for w in SEEN_WORDS + held_out + unseen}
    json.dump({"held_out_words": held_out, "never_seen_words": unseen, "seen_words": SEEN_WORDS, "reference": ref},
              open(os.path.join(a.out, "eval_words.json"), "w"), indent=1)
    print(f"wordnet headwords {len(words)}, everyday words {len(everyday)} (test {len(test_words)}, never seen {len(never_seen)}), "
          f"fortunes {len(fortunes)} (test {n_test_f}), reading pages {len(reading)} ({sum(map(len, reading))} chars)")


if __name__ == "__main__":
    main()

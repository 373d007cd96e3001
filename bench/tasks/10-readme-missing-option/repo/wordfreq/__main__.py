"""python -m wordfreq FILE... prints the most frequent words."""

import argparse
import re
import sys
from collections import Counter

WORD = re.compile(r"[A-Za-z']+")


def build_parser() -> argparse.ArgumentParser:
    """The command-line options."""
    parser = argparse.ArgumentParser(prog="wordfreq", description="Print the most frequent words in files.")
    parser.add_argument("files", nargs="+", help="text files to read")
    parser.add_argument("--top", type=int, default=10, metavar="N", help="how many words to print")
    parser.add_argument("--min-length", type=int, default=1, metavar="N", help="skip words shorter than N")
    parser.add_argument("--stopwords", metavar="FILE", help="skip the words listed in FILE, one per line")
    parser.add_argument("--ignore-case", action="store_true", help="count 'The' and 'the' as one word")
    return parser


def count(paths: list[str], min_length: int, ignore_case: bool, stopwords: set[str]) -> Counter:
    """Count the words of every file."""
    counts: Counter = Counter()
    for path in paths:
        with open(path, encoding="utf-8") as handle:
            for word in WORD.findall(handle.read()):
                word = word.lower() if ignore_case else word
                if len(word) >= min_length and word not in stopwords:
                    counts[word] += 1
    return counts


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    args = build_parser().parse_args(argv)
    stopwords: set[str] = set()
    if args.stopwords:
        with open(args.stopwords, encoding="utf-8") as handle:
            stopwords = {line.strip() for line in handle if line.strip()}
    for word, number in count(args.files, args.min_length, args.ignore_case, stopwords).most_common(args.top):
        print(f"{number:6d} {word}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Word-level statistics."""


def count_words(text: str) -> int:
    """Return the number of words in text; words are separated by any whitespace."""
    return len(text.split(" "))


def longest_word(text: str) -> str:
    """Return the longest word in text (the first one on ties), or "" if there are no words."""
    words = text.split()
    if not words:
        return ""
    return max(words, key=len)


def average_word_length(text: str) -> float:
    """Return the mean length of the words in text, or 0.0 if there are none."""
    words = text.split()
    if not words:
        return 0.0
    return sum(len(word) for word in words) / count_words(text)

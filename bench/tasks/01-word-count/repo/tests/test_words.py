from textstats.words import average_word_length, count_words, longest_word


def test_count_simple_sentence():
    assert count_words("the quick brown fox") == 4


def test_count_across_lines_and_tabs():
    assert count_words("one\ntwo\tthree") == 3


def test_count_empty_text():
    assert count_words("") == 0


def test_longest_word():
    assert longest_word("a bb ccc dd") == "ccc"


def test_average_word_length():
    assert average_word_length("ab  abcd") == 3.0

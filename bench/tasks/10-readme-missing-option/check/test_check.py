"""Hidden check: the README options table gains exactly one well-formed row for --stopwords."""

import pathlib

ORIGINAL_ROWS = [
    ["`--top N`", "10", "how many words to print"],
    ["`--min-length N`", "1", "skip words shorter than N"],
    ["`--ignore-case`", "off", 'count "The" and "the" as one word'],
]


def readme() -> str:
    return pathlib.Path("README.md").read_text(encoding="utf-8")


def table_rows() -> list[list[str]]:
    """The body rows of the table under '## Options', as lists of stripped cells."""
    lines = readme().split("## Options", 1)[1].split("\n## ", 1)[0].splitlines()
    table = [line for line in lines if line.startswith("|")]
    assert table[0].replace(" ", "") == "|option|default|meaning|"
    assert set(table[1].replace("|", "").replace(" ", "")) <= {"-", ":"}
    return [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in table[2:]]


def test_table_has_one_new_row_for_stopwords():
    rows = table_rows()
    assert all(len(row) == 3 for row in rows), rows
    new = [row for row in rows if row not in ORIGINAL_ROWS]
    assert len(rows) == 4 and len(new) == 1, rows
    option, default, meaning = new[0]
    assert option.startswith("`--stopwords") and option.endswith("`")
    assert default and default != "10"
    assert "word" in meaning.lower() and len(meaning.split()) >= 3


def test_original_rows_kept_in_order():
    rows = [row for row in table_rows() if row in ORIGINAL_ROWS]
    assert rows == ORIGINAL_ROWS


def test_rest_of_readme_unchanged():
    text = readme()
    assert text.startswith("# wordfreq\n\nPrints the most frequent words in one or more text files.\n")
    assert "python -m wordfreq notes.txt chapter*.txt --top 20" in text
    assert text.rstrip().endswith("the count, right-aligned in six columns, then the word.")

"""Count the most frequent words in text files."""

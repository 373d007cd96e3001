"""Fixed inputs of the llama.cpp comparison: the text the tiny models read, the chat prompts of the real model, and
the tokenizer corpus. Changing any of them means re-running bench/compare_llamacpp.py to refresh the fixtures."""

from __future__ import annotations

# Tokenized by llama.cpp into the >= 256 positions at which the tiny models are compared.
TINY_TEXT = """\
OpenJet runs a coding agent on one local GPU. The engine reads GGUF files, keeps the weights quantized, and checks
every kernel against a slow float32 reference written in numpy.

def fibonacci(n: int) -> list[int]:
    \"\"\"The first n Fibonacci numbers.\"\"\"
    out = [0, 1]
    while len(out) < n:
        out.append(out[-1] + out[-2])
    return out[:n]

class Counter:
    def __init__(self):
        self.counts = {}

    def add(self, word):
        self.counts[word] = self.counts.get(word, 0) + 1

for i, value in enumerate(fibonacci(12)):
    print(f"{i:>3} {value:>6}")

Speculative decoding drafts several tokens with a small head, verifies them in one pass of the large model, and
keeps the longest prefix that the large model agrees with; greedy output is unchanged, token for token.

$ git diff --stat
 engine/reference/ops.py | 12 ++++++------
 1 file changed, 6 insertions(+), 6 deletions(-)

SELECT name, COUNT(*) AS n FROM sessions WHERE created > '2026-01-01' GROUP BY name ORDER BY n DESC LIMIT 5;

The tests run on a CPU machine with no GPU: unit tests, the reference on tiny generated models of every
architecture, and a real half-billion-parameter model answering a question about Python.
"""

# Chat prompts for the real model's greedy tokens (user turns; the model's template adds its system prompt).
PROMPTS = (
    "Write a Python function that adds two numbers.",
    "Explain in two sentences what a hash map is.",
    "Write a bash command that counts the lines of all .py files under the current directory.",
    "Write a SQL query that returns the ten most recent orders from an orders table.",
    "Write a JavaScript function that reverses a string.",
)

# (name, text) pairs tokenized one by one: code, unicode, emoji, CJK, whitespace runs and special tokens.
CORPUS = (
    ("python", "def add(a: int, b: int) -> int:\n    return a + b\n\nprint(add(2, 3))  # 5\n"),
    ("c_tabs", "int main(void) {\n\tfor (int i = 0; i < 10; ++i) {\n\t\tprintf(\"%d\\n\", i);\n\t}\n}\n"),
    ("json", '{"name": "openjet", "version": [0, 1, 0], "tags": ["gpu", "agent"], "ok": true, "x": null}'),
    ("numbers", "1234567890 3.14159 -42 1e-6 0xFF 1,000,000 2026-11-29 12:34:56"),
    ("contractions", "I'm sure it's fine; they'll say we've done what you'd expect, isn't it? DON'T SHOUT."),
    ("latin_accents", "naïve café résumé Ångström façade jalapeño Straße Œuvre"),
    ("cyrillic_arabic_hindi", "Привет, мир! مرحبا بالعالم नमस्ते दुनिया Γειά σου κόσμε שלום עולם"),
    ("cjk", "你好，世界！这是一个测试。日本語のテキストとカタカナ、ひらがな。한국어 텍스트입니다."),
    ("emoji", "👍🏽 👨‍👩‍👧‍👦 🇺🇸🇯🇵 🎉🔥💯 🤖 ❤️ ✔︎ 🧑🏿‍💻"),
    ("symbols", "∑ᵢ xᵢ² ≤ ∞ → ∀ε>0 ∃δ; e\u0301 a\u200bb «quotes» ‘single’ — dash … ellipsis ©®™ ½"),
    ("whitespace", "a  b   c    d\n\n\n    e\t\tf \t \n  \r\n\r\n        g                                h   \n"),
    ("leading_trailing", "   leading spaces and trailing spaces   "),
    ("chatml", "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
               "<|im_start|>assistant\n"),
    ("special_mixed", "text<|endoftext|>more<|im_end|><|im_start|>x <|fim_prefix|>def f():<|fim_suffix|>\n"
                      "<|fim_middle|>"),
    ("tool_call", '<tool_call>\n{"name": "read_file", "arguments": {"path": "src/main.py"}}\n</tool_call>'),
    ("partial_special", "<|im_start <|im_end|| |> <| im_start|> <tool_call <|endoftext"),
    ("urls_paths", "https://example.com/a/b?c=1&d=two#frag ~/.cache/openjet/models C:\\Users\\me\\file.txt"),
    ("markdown", "# Title\n\n- item one\n- **bold** and _italic_ and `code`\n\n```python\nx = 1\n```\n"),
)

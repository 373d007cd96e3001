"""A code-editing prompt set: one source file in context and a request for a small change, as a coding agent sends.

Used by the slow real-model tests (greedy equivalence, n-gram acceptance) and for the README's acceptance figures.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from engine.backend import Backend, TokenSequence
from engine.sampling import SamplingParams
from engine.session import Session
from engine.spec import DraftLengthController, NgramDrafter, SpecStats, SpeculativeDecoder
from engine.text.chat import ChatTemplate
from engine.text.tokenizer import Tokenizer

SOURCE = '''\
import json
from pathlib import Path

DEFAULT_PORT = 8000


class Config:
    def __init__(self, path):
        self.path = Path(path)
        self.values = {}

    def load(self):
        with open(self.path) as f:
            self.values = json.load(f)
        return self.values

    def get(self, key, default=None):
        return self.values.get(key, default)

    def port(self):
        return int(self.get("port", DEFAULT_PORT))


def main():
    config = Config("settings.json")
    config.load()
    print("serving on port", config.port())
'''

REQUESTS = [
    "Change DEFAULT_PORT to 8080.",
    "Rename the method get to lookup.",
    "Add a docstring to the Config class.",
    "Make load return None instead of the values.",
    "Use the encoding utf-8 when opening the file.",
    "Rename the variable config in main to settings.",
    "Add a method save that writes the values back as JSON.",
    "Print the port with an f-string.",
    "Make port raise ValueError when the port is not positive.",
    "Add type hints to the get method.",
    "Change the default file name to config.json.",
    "Add a __repr__ method to Config.",
    "Remove the default argument of get.",
    "Call main when the module is run as a script.",
    "Rename the class Config to Settings.",
    "Store the path as a string instead of a Path.",
    "Add a host method that returns the host, default localhost.",
    "Make values a class attribute.",
    "Sort the imports alphabetically.",
    "Add a comment above DEFAULT_PORT explaining it.",
]

SYSTEM = "You are a coding assistant. Reply with the complete updated file in one ```python block and nothing else."


def prompt_ids(tokenizer: Tokenizer, template: ChatTemplate, request: str) -> list[int]:
    """Token ids of the chat prompt for one change request."""
    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"Here is config.py:\n```python\n{SOURCE}```\n\n{request}"}]
    return tokenizer.encode(template.render(messages, add_generation_prompt=True), parse_special=True)


@dataclass
class Run:
    """One request decoded twice: plainly and with n-gram drafts."""

    request: str
    plain: list[int]
    speculative: list[int]
    stats: SpecStats  # the speculative run's cycles alone


def plain_and_speculative(backend: Backend, tokenizer: Tokenizer, template: ChatTemplate, num_tokens: int,
                          stats: SpecStats, max_draft: int = 8, requests: list[str] = REQUESTS) -> Iterator[Run]:
    """Greedy-decode every request without and with n-gram drafts (the shared file prefix is prefilled once)."""
    params = SamplingParams(temperature=0)
    session = Session(backend)
    plain = SpeculativeDecoder(backend)
    # the prior row cost of a GPU verify pass, not this CPU's: the figures are about acceptance, not CPU speed
    controller = DraftLengthController(max_draft=max_draft, learns_row_cost=False)
    spec = SpeculativeDecoder(backend, NgramDrafter(), controller)
    for request in requests:
        ids = prompt_ids(tokenizer, template, request)
        outputs, own = [], SpecStats()
        for decoder, counts in ((plain, ()), (spec, (own, stats))):
            session.prepare(ids)
            seq = TokenSequence.start(ids, params)
            decoder.start(seq)
            while len(seq.generated) < num_tokens and not tokenizer.is_stop(seq.tokens[-1]):
                result = decoder.step(seq, params, num_tokens - len(seq.generated))
                session.sync(seq)
                for count in counts:
                    count.add(result)
            outputs.append(_until_stop(tokenizer, seq.generated))
        yield Run(request, *outputs, own)


def _until_stop(tokenizer: Tokenizer, tokens: list[int]) -> list[int]:
    """Tokens up to and including the first end-of-generation token (a cycle may have run past it)."""
    for i, token in enumerate(tokens):
        if tokenizer.is_stop(token):
            return tokens[: i + 1]
    return tokens

"""`openjet-engine generate`: run a GGUF model on the numpy reference engine and stream its text to stdout."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.backend import Backend, TokenSequence
from engine.errors import ContextOverflowError, EngineError
from engine.sampling import InvalidSamplingParam, SamplingParams

if TYPE_CHECKING:
    from engine.gguf.reader import GGUFFile
    from engine.text.tokenizer import Tokenizer


@dataclass(slots=True)
class GenerationStats:
    """Counts and timings of one generation (stop_reason: "stop", "length" or "context")."""

    num_prompt_tokens: int = 0
    prefill_s: float = 0.0
    num_generated: int = 0
    decode_s: float = 0.0
    num_cycles: int = 0
    num_drafted: int = 0
    num_accepted: int = 0
    stop_reason: str = ""

    def summary(self) -> str:
        """One line in the spirit of llama.cpp's timings."""
        prefill_rate = self.num_prompt_tokens / self.prefill_s if self.prefill_s else 0.0
        decode_rate = self.num_generated / self.decode_s if self.decode_s else 0.0
        line = (f"prompt {self.num_prompt_tokens} tokens in {self.prefill_s:.2f} s ({prefill_rate:.1f} tok/s), "
                f"generated {self.num_generated} tokens in {self.decode_s:.2f} s ({decode_rate:.2f} tok/s), "
                f"stop: {self.stop_reason}")
        if self.num_drafted:
            per_cycle = (self.num_accepted + self.num_cycles) / self.num_cycles
            line += f", drafts accepted {self.num_accepted}/{self.num_drafted} ({per_cycle:.2f} tokens per pass)"
        return line


def generate_tokens(
    backend: Backend,
    prompt: list[int],
    params: SamplingParams,
    max_tokens: int,
    n_draft: int = 0,
    stop_ids: frozenset[int] = frozenset(),
    stats: GenerationStats | None = None,
) -> Iterator[int]:
    """Yield up to max_tokens generated ids, one at a time; a stop id ends generation and is not yielded."""
    stats = GenerationStats() if stats is None else stats
    if not prompt:
        raise ValueError("the prompt has no tokens")
    start = time.perf_counter()
    backend.reset()
    if len(prompt) > 1:
        backend.prefill(prompt[:-1])  # the last prompt token stays pending: the first cycle feeds it
    stats.num_prompt_tokens, stats.prefill_s = len(prompt), time.perf_counter() - start
    seq, start, stats.stop_reason = TokenSequence.start(prompt, params), time.perf_counter(), "length"
    while stats.num_generated < max_tokens:
        if len(seq.tokens) > backend.context_size:
            stats.stop_reason = "context"
            break
        result = backend.cycle(seq, n_draft, params)
        stats.num_cycles += 1
        stats.num_drafted += result.num_drafted
        stats.num_accepted += result.num_accepted
        for token in result.tokens:
            if token in stop_ids:
                stats.stop_reason = "stop"
                break
            stats.num_generated += 1
            stats.decode_s = time.perf_counter() - start
            yield token
            if stats.num_generated >= max_tokens:
                break
        if stats.stop_reason == "stop":
            break
    stats.decode_s = time.perf_counter() - start


def prompt_ids(f: GGUFFile, tokenizer: Tokenizer, text: str, chat: bool, system: str | None) -> list[int]:
    """Token ids of the prompt: raw text (with BOS where the model wants one), or one chat turn rendered."""
    if not chat:
        return tokenizer.encode(text, parse_special=True, add_special=True)
    from engine.text.chat import ChatTemplate

    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
    rendered = ChatTemplate.from_gguf(f).render(messages, add_generation_prompt=True)
    # rendered templates carry their own BOS text
    return tokenizer.encode(rendered, parse_special=True, add_special=False)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `openjet-engine generate`."""
    parser.add_argument("--model", required=True, help="GGUF model file")
    parser.add_argument("--prompt", required=True, help="prompt text")
    parser.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    parser.add_argument("--system", default=None, help="system message (with --chat)")
    parser.add_argument("--max-tokens", type=int, default=256, help="most tokens to generate (default 256)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--seed", type=int, default=None, help="sampling seed")
    parser.add_argument("--top-k", type=int, default=0, help="0 = off")
    parser.add_argument("--top-p", type=float, default=1.0, help="1 = off")
    parser.add_argument("--min-p", type=float, default=0.0, help="0 = off")
    parser.add_argument("--repeat-penalty", type=float, default=1.0, help="1 = off")
    parser.add_argument("--presence-penalty", type=float, default=0.0)
    parser.add_argument("--frequency-penalty", type=float, default=0.0)
    parser.add_argument("--n-draft", type=int, default=0, help="MTP draft tokens per cycle (qwen35 only)")
    parser.add_argument("--ctx", type=int, default=None, help="context size (default: the model's)")


def _sampling(args: argparse.Namespace) -> SamplingParams:
    """SamplingParams from the command line."""
    return SamplingParams(
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p, seed=args.seed,
        presence_penalty=args.presence_penalty, frequency_penalty=args.frequency_penalty,
        repetition_penalty=args.repeat_penalty,
    )


def run(args: argparse.Namespace) -> int:
    """Load the model, stream the generated text to stdout, print timings to stderr."""
    from engine.gguf.reader import GGUFFile
    from engine.reference.backend import ReferenceBackend
    from engine.text.tokenizer import Tokenizer

    try:
        params = _sampling(args)
    except InvalidSamplingParam as exc:
        print(f"openjet-engine generate: error: {exc}", file=sys.stderr)
        return 2
    if args.max_tokens < 1 or args.n_draft < 0:
        print("openjet-engine generate: error: --max-tokens must be >= 1 and --n-draft >= 0", file=sys.stderr)
        return 2
    f = GGUFFile.open(args.model)
    tokenizer = Tokenizer.from_gguf(f)
    ids = prompt_ids(f, tokenizer, args.prompt, args.chat, args.system)
    backend = ReferenceBackend.from_file(f, context_size=args.ctx)
    if args.n_draft and not backend.can_draft:
        raise EngineError(f"{args.model} has no MTP head: --n-draft needs a qwen35 model with nextn layers")
    if len(ids) > backend.context_size:
        raise ContextOverflowError(len(ids), backend.context_size)
    stats, decoder = GenerationStats(), tokenizer.stream()
    for token in generate_tokens(backend, ids, params, args.max_tokens, args.n_draft, tokenizer.stop_ids, stats):
        sys.stdout.write(decoder.feed(token))
        sys.stdout.flush()
    sys.stdout.write(decoder.flush() + "\n")
    sys.stdout.flush()
    print(stats.summary(), file=sys.stderr)
    return 0

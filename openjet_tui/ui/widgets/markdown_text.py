"""Reply text that stays cheap however long it gets.

Textual's Markdown widget builds a widget per block, and every frame's layout visits them all: a long reply would
make each frame slower than the last. So only the part still arriving lives in a Markdown widget fed by Textual's
MarkdownStream; whenever it grows past FREEZE_CHARS, its finished blocks move into MarkdownText, one widget that
Rich renders as a whole.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

from rich.markdown import Heading
from rich.markdown import Markdown as RichMarkdown
from rich.markdown import MarkdownElement
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.geometry import Size
from textual.strip import Strip
from textual.widget import Widget
from textual.widgets import Markdown
from textual.widgets.markdown import MarkdownStream

FREEZE_CHARS = 600  # the live Markdown widget holds at most about this much finished text
_FENCE = re.compile(r"^ {0,3}(```|~~~)")


class LeftHeading(Heading):
    """Headings aligned left, as the streaming Markdown widget draws them."""

    LEVEL_ALIGN: ClassVar[dict[str, Any]] = {f"h{level}": "left" for level in range(1, 7)}


class ReplyMarkdown(RichMarkdown):
    """Rich's Markdown with left-aligned headings."""

    elements: ClassVar[dict[str, type[MarkdownElement]]] = {**RichMarkdown.elements, "heading_open": LeftHeading}


def split_points(text: str) -> list[int]:
    """Offsets just after blank lines where the text can be cut and each side renders as it did together:
    outside code fences, and not before an indented continuation line."""
    points, offset, in_fence = [], 0, False
    lines = text.splitlines(keepends=True)
    for index, line in enumerate(lines):
        offset += len(line)
        if _FENCE.match(line):
            in_fence = not in_fence
        following = lines[index + 1] if index + 1 < len(lines) else ""
        if not in_fence and not line.strip() and following.strip() and not following[0].isspace():
            points.append(offset)
    return points


def split_markdown(text: str, limit: int = FREEZE_CHARS) -> list[str]:
    """Cut finished Markdown into pieces of about `limit` characters (never inside a code fence)."""
    pieces, start = [], 0
    for point in split_points(text):
        if point - start >= limit:
            pieces.append(text[start:point])
            start = point
    if start < len(text) or not pieces:
        pieces.append(text[start:])
    return pieces


class MarkdownText(Widget):
    """Finished Markdown of any length in one widget: each piece is rendered by Rich once per width and its lines
    are kept, so layout and scrolling cost the same for a 20-line reply and a 2,000-line one."""

    DEFAULT_CSS = """
    MarkdownText { height: auto; padding: 0 1; }
    """

    def __init__(self, pieces: list[str] | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.pieces: list[str] = list(pieces or [])
        # (width, dark theme) -> (lines, pieces rendered); two widths are kept, as a scrollbar coming and going
        # makes layout ask for both
        self._renders: dict[tuple[int, bool], tuple[list[Strip], int]] = {}

    @property
    def text(self) -> str:
        """All the Markdown shown."""
        return "".join(self.pieces)

    def add(self, piece: str) -> None:
        """Append finished Markdown (rendered on the next layout)."""
        self.pieces.append(piece)
        self.refresh(layout=True)

    def replace(self, pieces: list[str]) -> None:
        """Show other Markdown instead (rendered afresh)."""
        self.pieces, self._renders = list(pieces), {}
        self.refresh(layout=True)

    def _rendered_lines(self, width: int) -> list[Strip]:
        key = (width, self.app.current_theme.dark)
        lines, num_rendered = self._renders.pop(key, ([], 0))
        if num_rendered < len(self.pieces):
            theme = "monokai" if key[1] else "default"
            options = self.app.console.options.update_width(max(1, width))
            for piece in self.pieces[num_rendered:]:
                if lines:  # Rich puts a blank line between blocks; pieces were cut between blocks
                    lines.append(Strip.blank(width))
                rendered = self.app.console.render_lines(ReplyMarkdown(piece, code_theme=theme), options, pad=False)
                lines += [Strip(line).crop_extend(0, width, None) for line in rendered]
        self._renders[key] = (lines, len(self.pieces))
        while len(self._renders) > 2:
            self._renders.pop(next(iter(self._renders)))
        return lines

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        """Lines of the rendered Markdown at this width."""
        return len(self._rendered_lines(width))

    def render_line(self, y: int) -> Strip:
        """One rendered line (the Line API: only visible lines are asked for)."""
        width = self.content_size.width
        lines = self._rendered_lines(width)
        return lines[y] if y < len(lines) else Strip.blank(width)


class ReplyBody(Vertical):
    """A reply's text: finished pieces as MarkdownText, the arriving part in a streamed Markdown widget."""

    DEFAULT_CSS = """
    ReplyBody { height: auto; }
    ReplyBody Markdown { padding: 0 1; margin: 0; }
    """

    def __init__(self, text: str = "", is_streaming: bool = False, **kwargs: Any):
        super().__init__(**kwargs)
        self.text, self.is_streaming = text, is_streaming
        self.frozen_upto = 0  # text before this offset is in MarkdownText pieces
        self._stream: MarkdownStream | None = None

    def compose(self) -> ComposeResult:
        """Finished text as pieces; a live Markdown widget while streaming."""
        yield MarkdownText(split_markdown(self.text) if self.text.strip() else [], id="frozen")
        self.frozen_upto = len(self.text)
        if self.is_streaming:
            yield Markdown(id="live")

    async def append(self, fragment: str) -> None:
        """More text; finished blocks move out of the live widget once it holds more than FREEZE_CHARS."""
        self.text += fragment
        live_text = self.text[self.frozen_upto:]
        points = [p for p in split_points(live_text) if p < len(live_text)] if len(live_text) > FREEZE_CHARS else []
        if points:
            await self._freeze(self.frozen_upto + points[-1])
            return
        if self._stream is None:
            self._stream = Markdown.get_stream(self.query_one("#live", Markdown))
        await self._stream.write(fragment)

    async def _freeze(self, upto: int) -> None:
        """Move text up to `upto` into the finished MarkdownText; the live widget keeps the rest."""
        await self._stop_stream()
        self.query_one("#frozen", MarkdownText).add(self.text[self.frozen_upto:upto])
        self.frozen_upto = upto
        await self.query_one("#live", Markdown).update(self.text[upto:])

    async def _stop_stream(self) -> None:
        if self._stream is not None:
            await self._stream.stop()
            self._stream = None

    async def finish(self, text: str | None = None) -> None:
        """The reply is complete: everything becomes MarkdownText (`text` replaces the whole text if given)."""
        await self._stop_stream()
        self.is_streaming = False
        frozen = self.query_one("#frozen", MarkdownText)
        if text is not None and text != self.text:  # tool calls written as text were taken out
            self.text, self.frozen_upto = text, 0
            frozen.replace([])
        await self.remove_children("#live")
        rest = self.text[self.frozen_upto:]
        for piece in split_markdown(rest) if rest.strip() else []:
            frozen.add(piece)
        self.frozen_upto = len(self.text)

"""The scrolling conversation: follows new output unless the person scrolls up, and keeps only a window of items
mounted so that a 2,000-message history scrolls and types as fast as an empty one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from textual.containers import VerticalScroll
from textual.widget import Widget
from textual.widgets import Static

Record = Callable[[], Widget]
PAGE = 40  # items mounted at a time when scrolling back
MAX_MOUNTED = 160  # beyond this, the oldest items are unmounted (kept as records) while following output


class HistoryMarker(Static):
    """Says how many earlier items are not mounted, and how to see them."""

    DEFAULT_CSS = """
    HistoryMarker { color: $text-muted; text-align: center; width: 1fr; margin: 0 0 1 0; }
    """


class Conversation(VerticalScroll, can_focus=True):
    """Chat items, newest last; older items live as records until scrolled to."""

    DEFAULT_CSS = """
    Conversation { height: 1fr; padding: 0 1; scrollbar-size-vertical: 1; }
    """
    BINDINGS = [("ctrl+home", "load_all_older", "Load earlier messages")]

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self.older: list[Record] = []  # unmounted items, oldest first

    def on_mount(self) -> None:
        """Follow new output from the start."""
        self.anchor()

    @property
    def items(self) -> list[Widget]:
        """The mounted chat items (the history marker excluded)."""
        return [child for child in self.children if not isinstance(child, HistoryMarker)]

    @property
    def is_following(self) -> bool:
        """True while new output scrolls into view (the person has not scrolled up)."""
        return self.is_anchored and not self._anchor_released

    @property
    def num_items(self) -> int:
        """Every item of the conversation, mounted or not."""
        return len(self.older) + len(self.items)

    async def add(self, widget: Widget) -> Widget:
        """Append an item, unmounting the oldest ones if too many are mounted while following."""
        await self.mount(widget)
        if len(self.items) > MAX_MOUNTED and self.is_following:
            await self._unmount_oldest(len(self.items) - MAX_MOUNTED + PAGE)
        return widget

    async def _unmount_oldest(self, count: int) -> None:
        victims = self.items[:count]
        self.older += [item.record() for item in victims if hasattr(item, "record")]
        await self.remove_children(victims)
        await self._update_marker()

    async def clear(self) -> None:
        """Remove everything."""
        self.older = []
        await self.remove_children()
        self.anchor()

    async def show_history(self, records: list[Record]) -> None:
        """Replace the conversation with stored items, mounting only the newest page."""
        await self.clear()
        self.older = records[:-PAGE] if len(records) > PAGE else []
        await self.mount_all([make() for make in records[-PAGE:]])
        await self._update_marker()
        self.anchor()

    async def _update_marker(self) -> None:
        markers = self.query(HistoryMarker)
        if not self.older:
            await markers.remove()
            return
        text = f"▲ {len(self.older):,} earlier items · scroll up to load more (ctrl+home loads all)"
        if markers:
            markers.first().update(text)
        else:
            await self.mount(HistoryMarker(text), before=0)

    async def load_older(self, count: int = PAGE) -> int:
        """Mount up to `count` earlier items above, keeping what is on screen in place; returns how many."""
        if not self.older:
            return 0
        batch, self.older = self.older[-count:], self.older[:-count]
        before_height = self.virtual_size.height
        first = self.items[0] if self.items else None
        widgets = [make() for make in batch]
        if first is not None:
            await self.mount_all(widgets, before=first)
        else:
            await self.mount_all(widgets)
        await self._update_marker()
        self.call_after_refresh(self._keep_view, before_height, self.scroll_y)
        return len(widgets)

    def _keep_view(self, before_height: int, before_y: float) -> None:
        grown = self.virtual_size.height - before_height
        self.scroll_to(y=before_y + grown, animate=False, immediate=True)

    async def action_load_all_older(self) -> None:
        """Mount every earlier item and go to the top."""
        while self.older:
            await self.load_older(len(self.older))
        self.call_after_refresh(self.scroll_home, animate=False)

    def watch_scroll_y(self, old: float, new: float) -> None:
        """Reaching the top loads the previous page."""
        super().watch_scroll_y(old, new)
        if new <= 0 < old and self.older:
            self.run_worker(self.load_older(), exclusive=True, group="history")
